"""`python -m ckpt_viz` / `ckpt-viz`: the command line."""
from ckpt_viz.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
