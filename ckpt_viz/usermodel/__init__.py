"""Users' model files: the reference and the module (source), the factory contract (load), and the
sandboxed child process that records them (sandbox)."""
