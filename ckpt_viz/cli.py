"""The `ckpt-viz` command line: demo (and, as they land, record, info, export, app).

Owns argument parsing and printing; the work is done by `scenarios`, `trace` and the renderers.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from ckpt_viz.render.text import render_text
    from ckpt_viz.scenarios import run_scenario
    from ckpt_viz.zoo import build_builtin

    spec = build_builtin(args.model)
    trace = run_scenario(spec, args.mode)
    print(f"ckpt_viz demo: model {spec.name!r} ({spec.description}), mode {args.mode!r}")
    print(render_text(trace.events, site=args.site), end="")
    replays = trace.count("replay_started")
    released = trace.count("released")
    handles = len({e.handle_id for e in trace.of_kind("handle_created")})
    print(f"\n{handles} handles, {replays} replays, {released} released, {len(trace)} events")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ckpt_viz.scenarios import MODES
    from ckpt_viz.zoo import BUILTIN_MODELS, DEFAULT_MODEL

    parser = argparse.ArgumentParser(prog="ckpt-viz", description="See and debug PyTorch activation checkpointing.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a built-in model and print its events")
    demo.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(BUILTIN_MODELS))
    demo.add_argument("--mode", default="split-reentrant", choices=[m for m in MODES if m != "pipeline"])
    demo.add_argument("--site", action="store_true", help="show the user's file:line of each event")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:
        return 0
    except Exception as exc:  # errors written for users: print them, not a traceback
        from ckpt_viz.errors import CkptVizError

        if isinstance(exc, CkptVizError):
            print(str(exc), file=sys.stderr)
            return 2
        raise
