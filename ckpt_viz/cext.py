"""Our own C speed-ups: a CPython extension built once from one of our C sources, imported, or None.

Owns `extension(source)`, the build and import of a C file of ours as an extension module, and the
cache folder our built code goes in (`cache_dir`, `account_cache`; the native allocation log in
`ckpt_viz.probe.native` builds there too). Standard library only; never torch, never the UI.

NOTE [ C speed-ups ]
  1. Optional, always: code that uses one keeps the Python it replaces, which stays the reference (its
     tests run both on the same inputs and compare), and is used wherever `extension` returns None.
  2. A source `ckpt_viz/<folder>/csrc/<name>.c` becomes the module `<name>` (its `PyInit_<name>`), built
     once per Python version and source bytes with the C compiler (`$CC`, else `cc` or `gcc`) against
     this Python's headers, into `<cache>/native/<name>-<python>-<hash>.so`, saying so on stderr. The
     build writes a temporary file and renames it, so builds in parallel leave one whole file.
  3. The cache is `$CKPT_VIZ_CACHE`, else `$XDG_CACHE_HOME/ckpt_viz`, else `~/.cache/ckpt_viz`; a module
     already built under the account's own home directory is used where $HOME points elsewhere (the
     app's sandbox for model files), if it can be read there.
  4. None, once per source and process, where it cannot be built or imported (no compiler, no Python
     headers, a read-only cache, a build error: said once on stderr), and with `CKPT_VIZ_CEXT=0`.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType

__all__ = ["account_cache", "cache_dir", "extension"]

_LOCK = threading.Lock()


class _Unavailable(Exception):
    """Why a C file could not be built or imported here; `extension` says it on stderr and returns None."""


_TRIED: dict[Path, ModuleType | None] = {}


def cache_dir() -> Path:
    """Where our built code goes (NOTE rule 3)."""
    root = os.environ.get("CKPT_VIZ_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ckpt_viz"


def account_cache() -> Path:
    """The cache under the account's own home directory, whatever $HOME says."""
    import pwd

    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "ckpt_viz"


def extension(source: Path) -> ModuleType | None:
    """The extension module built from the C file `source`, or None where there is none (NOTE rules 2 and 4)."""
    source = Path(source)
    with _LOCK:
        if source not in _TRIED:
            module = None
            if os.environ.get("CKPT_VIZ_CEXT", "1") != "0":
                try:
                    module = _import(source.stem, _built(source))
                except Exception as exc:  # no compiler or headers, a read-only cache, a failed build
                    print(f"ckpt_viz: the C speed-up {source.name} is not available ({exc}); the Python code "
                          "is used", file=sys.stderr)
            _TRIED[source] = module
        return _TRIED[source]


def _built(source: Path) -> Path:
    code = source.read_bytes()
    python = sysconfig.get_config_var("SOABI") or f"py{sys.version_info[0]}{sys.version_info[1]}"
    key = hashlib.sha256(code + sys.version.encode()).hexdigest()[:16]
    name = f"native/{source.stem}-{python}-{key}.so"
    target = cache_dir() / name
    if target.exists():
        return target
    built = account_cache() / name  # a child whose HOME was moved (the app's sandbox) reads the user's
    if built.exists() and os.access(built, os.R_OK):
        return built
    _build(source, target)
    return target


def _build(source: Path, target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise _Unavailable("no C compiler (set $CC, or install gcc)")
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        raise _Unavailable(f"no Python headers in {include} (install python3-dev)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    print(f"ckpt_viz: building the C speed-up {source.name} once (a second) into {target.parent}", file=sys.stderr)
    try:
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-std=c11", f"-I{include}", str(source),
                               "-o", scratch], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise _Unavailable(f"{Path(compiler).name} failed: {done.stderr.strip()[-400:]}")
        os.replace(scratch, target)  # atomic: a parallel build leaves one whole file
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)


def _import(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise _Unavailable(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
