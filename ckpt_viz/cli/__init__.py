"""The `ckpt-viz` command line (also `python -m ckpt_viz`).

    ckpt-viz record MODEL --mode split-reentrant -o trace.json   record a run (progress on stderr)
    ckpt-viz info trace.json [--at SEQ]                            handles, replays, states, peak memory, problems
    ckpt-viz explain trace.json [--handle N]                       each problem found: what happened, the line, the fix
    ckpt-viz export trace.json --perfetto out.json                 Chrome trace format for Perfetto
    ckpt-viz merge traces/                                         one trace from a distributed run's rank files
    ckpt-viz app                                                   start the Streamlit app
    ckpt-viz demo                                                  print the events of a built-in run
    ckpt-viz lesson [N] [--set NAME=VALUE]                         list the lessons, or walk lesson N
    ckpt-viz plan trace.json --budget 1.5GiB                       what to checkpoint to fit a budget

Owns argument parsing (here) and one module per command group: record, info (and export), app (and demo).
Start-up imports no torch: `info` and `export` never load it; `record` and `demo` load it when they run.
MODEL is a built-in name (see `ckpt-viz record --help`), `path/to/file.py:factory` or
`package.module:factory`; user models run in a subprocess with a time and a memory limit.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES, BUILTIN_MODEL_NAMES, DEFAULT_MODEL
from ckpt_viz.cli.app import app_command, app_path, demo_command
from ckpt_viz.cli.explain import explain_command
from ckpt_viz.cli.info import export_command, info_command, summarize
from ckpt_viz.cli.lesson import lesson_command
from ckpt_viz.cli.merge import merge_command
from ckpt_viz.cli.plan import add_plan_command
from ckpt_viz.cli.record import record_command
from ckpt_viz.vocabulary import RUN_MODES

__all__ = ["app_path", "build_parser", "main", "summarize"]


def build_parser() -> argparse.ArgumentParser:
    """The `ckpt-viz` parser; building it imports no torch (the names come from `ckpt_viz.catalog`)."""
    parser = argparse.ArgumentParser(prog="ckpt-viz", description="See and debug PyTorch activation checkpointing.")
    sub = parser.add_subparsers(dest="command", required=True)

    rec = sub.add_parser("record", help="record a run of a model to a trace file",
                         description=f"MODEL is a built-in ({', '.join(sorted(BUILTIN_MODEL_NAMES))}), "
                                     "path/to/file.py:factory or package.module:factory, or a broken run to "
                                     f"explore ({', '.join(BROKEN_SCENARIO_NAMES)}).")
    rec.add_argument("model", help="what to run (see above)")
    rec.add_argument("--mode", default="split-reentrant", choices=RUN_MODES,
                     help="how the model's blocks are checkpointed (default: %(default)s)")
    rec.add_argument("-o", "--output", default="trace.json",
                     help="trace file, .json or .json.gz (default: %(default)s)")
    rec.add_argument("--schedule", default="1F1B", help="pipeline schedule: GPipe, 1F1B, ZB-H1 (default: %(default)s)")
    rec.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches (default: %(default)s)")
    rec.add_argument("--seed", type=int, default=0, help="seed of the model's weights and inputs "
                                                         "(default: %(default)s)")
    rec.add_argument("--no-memory", action="store_true", help="skip memory sampling (default: memory is sampled)")
    rec.add_argument("--no-graphs", action="store_true", help="skip graph snapshots (default: graphs are taken)")
    rec.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                     help="user models: seconds before the run is stopped; the trace recorded until then is kept, "
                          "marked partial (default: %(default)g s)")
    rec.add_argument("--memory-mb", type=int, default=8192, metavar="MIB",
                     help="user models: address-space limit in MiB (default: %(default)s)")
    rec.add_argument("--distributed", action="store_true",
                     help="`record --distributed --nproc-per-node N SCRIPT ...`: run SCRIPT under torchrun, one "
                          "trace per rank, merged (see `ckpt-viz record --distributed --help`; default: off)")
    rec.set_defaults(run=record_command)

    info = sub.add_parser("info", help="summarize a trace file")
    info.add_argument("trace")
    info.add_argument("--at", type=int, metavar="SEQ", help="count the handle states at this event seq (default: end)")
    info.set_defaults(run=info_command)

    explain = sub.add_parser("explain", help="explain every problem found in a trace file (the debugger)")
    explain.add_argument("trace")
    explain.add_argument("--handle", type=int, metavar="N", help="only the findings about handle hN")
    explain.add_argument("--strict", action="store_true", help="exit with status 1 when a problem is found")
    explain.set_defaults(run=explain_command)

    export = sub.add_parser("export", help="convert a trace file")
    export.add_argument("trace")
    export.add_argument("--perfetto", metavar="OUT", help="write Chrome trace-event JSON for Perfetto")
    export.set_defaults(run=export_command)

    merge = sub.add_parser("merge", help="merge the per-rank traces of a distributed run into one trace",
                           description="DIR is the run's --out folder (holding <run id>/rank-<R>.json) or one "
                                       "<run id> folder. Clocks are aligned to rank 0 and checked by the "
                                       "pipeline's send-before-receive order (exit status 1 when it fails).")
    merge.add_argument("dir")
    merge.add_argument("-o", "--output", help="merged trace file (default: <run folder>/merged.json)")
    merge.add_argument("--partial", action="store_true",
                       help="merge the ranks that wrote a file and mark the others missing (a crashed or killed run)")
    merge.set_defaults(run=merge_command)

    app = sub.add_parser("app", help="start the Streamlit app")
    app.add_argument("--address", default="127.0.0.1")
    app.add_argument("--port", type=int, default=8501)
    app.add_argument("streamlit_args", nargs=argparse.REMAINDER, help="passed to `streamlit run`")
    app.set_defaults(run=app_command)

    demo = sub.add_parser("demo", help="run a built-in model and print its events")
    demo.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(BUILTIN_MODEL_NAMES))
    demo.add_argument("--mode", default="split-reentrant", choices=[m for m in RUN_MODES if m != "pipeline"])
    demo.add_argument("--site", action="store_true", help="show the user's file:line of each event")
    demo.set_defaults(run=demo_command)

    lesson = sub.add_parser("lesson", help="list the lessons, or walk lesson N in the terminal")
    lesson.add_argument("number", type=int, nargs="?", metavar="N")
    lesson.add_argument("--no-pause", action="store_true", help="run straight through, even on a terminal")
    lesson.add_argument("--set", action="append", metavar="NAME=VALUE",
                        help="set a knob of the lesson's steps (e.g. depth=8; blocks=0,2 for a pick of several)")
    lesson.set_defaults(run=lesson_command)
    add_plan_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["record"] and "--distributed" in argv:  # its own parser: SCRIPT's options are not ours
        from ckpt_viz.cli.record import record_distributed_command

        argv = argv[1:]
        return _guarded(lambda: record_distributed_command(argv))
    args = build_parser().parse_args(argv)
    return _guarded(lambda: args.run(args))


def _guarded(run: Callable[[], int]) -> int:
    try:
        return run()
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # errors written for users: print them, not a traceback
        from ckpt_viz.errors import CkptVizError

        if isinstance(exc, CkptVizError):
            print(str(exc), file=sys.stderr)
            return 2
        raise
