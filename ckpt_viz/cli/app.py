"""`ckpt-viz app` and `ckpt-viz demo`."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

__all__ = ["app_command", "app_path", "demo_command"]


def app_path() -> Path:
    """The Streamlit entry point of a source checkout (the app is not part of the wheel)."""
    here = Path(__file__).resolve().parent.parent.parent / "app" / "streamlit_app.py"
    if not here.exists():
        from ckpt_viz.errors import CkptVizError

        raise CkptVizError(f"ckpt-viz app: the app is not next to the package ({here} is missing).\n"
                           "Tip: run it from a source checkout: `bash scripts/app.sh`.")
    return here


def app_command(args: argparse.Namespace) -> int:
    command = [sys.executable, "-m", "streamlit", "run", str(app_path()), "--server.address", args.address,
               "--server.port", str(args.port), *args.streamlit_args]
    return subprocess.call(command, cwd=app_path().parent.parent)


def demo_command(args: argparse.Namespace) -> int:
    from ckpt_viz.analysis.summary import summary
    from ckpt_viz.render.text import render_text
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    spec = build_builtin(args.model)
    trace = run_scenario(spec, args.mode)
    print(f"ckpt_viz demo: model {spec.name!r} ({spec.description}), mode {args.mode!r}")
    print(render_text(trace.events, site=args.site), end="")
    s = summary(trace)  # the figures `ckpt-viz info` and the app's pages state
    print(f"\n{s.handles} handles, {s.replays} replays, {s.released} released, {s.events} events")
    return 0
