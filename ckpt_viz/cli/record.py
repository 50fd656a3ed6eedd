"""`ckpt-viz record`: record a built-in run or a sandboxed model file through `obtain_trace`, with progress on stderr.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from typing import Any

from ckpt_viz.errors import CkptVizError

__all__ = ["record_command"]


class _Progress:
    """A one-line progress display on stderr, fed by the event bus while a run records."""

    def __init__(self, total_actions: int | None, stream: Any = None) -> None:
        self.total = total_actions
        self.stream = stream if stream is not None else sys.stderr
        stream = self.stream
        self.events = 0
        self.actions: set[tuple] = set()
        self.started = time.monotonic()
        self.last = 0.0
        self.enabled = stream.isatty() or os.environ.get("CKPT_VIZ_PROGRESS") == "1"

    def __call__(self, event: Any) -> None:
        self.events += 1
        tags = event.tags or {}
        if "action" in tags:
            self.actions.add((tags.get("action"), tags.get("stage"), tags.get("microbatch")))
        now = time.monotonic()
        if self.enabled and now - self.last > 0.1:
            self.last = now
            self._draw(tags)

    def _draw(self, tags: dict, done: bool = False) -> None:
        elapsed = time.monotonic() - self.started
        if self.total:
            fraction = 1.0 if done else min(len(self.actions) / self.total, 1.0)
            bar = "#" * int(fraction * 30)
            where = "" if done else (f" {tags.get('action', '')} stage {tags.get('stage', '-')}"
                                     f" mb {tags.get('microbatch', '-')}")
            text = f"[{bar:<30}] {fraction:4.0%}{where}  {self.events} events  {elapsed:.1f} s"
        else:
            text = f"recording: {self.events} events  {elapsed:.1f} s" + ("  done" if done else "")
        self.stream.write("\r" + text.ljust(90))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw({}, done=True)
            self.stream.write("\n")


# The API's argument names in the sandbox's tips, and the flags `ckpt-viz record` takes for them.
_FLAGS = {"timeout_s": "--timeout", "memory_mb": "--memory-mb"}


def _in_cli_words(exc: CkptVizError, args: argparse.Namespace) -> CkptVizError:
    """`exc` as the CLI says it: the flags the user typed in its tip (not `timeout_s`); a run stopped at its time
    limit keeps the trace it had (`partial_trace`, meta "partial"), saved to --output and named here."""
    text = str(exc)
    head, sep, tip = text.rpartition("\nTip: ")
    if sep:
        for word, flag in _FLAGS.items():
            tip = re.sub(rf"\b{word}\b", flag, tip)
        text = f"{head}{sep}{tip}"
    partial = getattr(exc, "partial_trace", None)
    if partial is not None:
        partial.save(args.output)
        kept = (f"The trace recorded until then is in {args.output}: {len(partial.events)} events, marked partial "
                f"(`ckpt-viz info {args.output}` says so).")
        head, sep, tip = text.rpartition("\nTip: ")
        text = f"{head}\n{kept}{sep}{tip}" if sep else f"{text}\n{kept}"
    if sep and "--timeout" in tip:
        text += f" (this run: --timeout {args.timeout:g})"
    exc.args = (text, *exc.args[1:])
    return exc


def record_command(args: argparse.Namespace) -> int:
    from ckpt_viz.run.obtain import RunRequest, obtain_trace
    from ckpt_viz.run.zoo import BUILTIN_MODELS, build_builtin
    from ckpt_viz.trace.files import check_writable

    check_writable(args.output, "ckpt-viz record")  # a missing or read-only folder fails now, not after the run

    from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES

    builtin = args.model in BUILTIN_MODELS
    if args.model in BROKEN_SCENARIO_NAMES:  # a broken run to explore (ckpt_viz.run.broken): it has its own mode
        trace = obtain_trace(RunRequest("broken", args.model, seed=args.seed, memory=not args.no_memory,
                                        graphs=not args.no_graphs))
        trace.save(args.output)
        print(f"wrote {args.output}: {len(trace.events)} events (broken run {args.model!r}; "
              f"see `ckpt-viz explain {args.output}`)")
        return 0
    request = RunRequest("builtin" if builtin else "user", args.model, mode=args.mode, schedule=args.schedule,
                         microbatches=args.microbatches, seed=args.seed, memory=not args.no_memory,
                         graphs=not args.no_graphs, timeout_s=args.timeout, memory_mb=args.memory_mb)
    if builtin:
        total = None  # the bar shows a percentage when the number of actions is known: a pipeline run
        stages = build_builtin(args.model, seed=args.seed).stages
        if args.mode == "pipeline" and stages:
            from ckpt_viz.run.schedules import make_schedule

            total = sum(map(len, make_schedule(args.schedule, len(stages), args.microbatches).values()))
        progress = _Progress(total)
        try:
            trace = obtain_trace(request, listen=progress)
        finally:
            progress.close()
    else:
        stop = threading.Event()
        started = time.monotonic()

        def tick() -> None:  # the child records; show that it is alive
            while not stop.wait(0.5):
                if sys.stderr.isatty() or os.environ.get("CKPT_VIZ_PROGRESS") == "1":
                    sys.stderr.write(f"\rrunning {args.model} in a subprocess: {time.monotonic() - started:.1f} s")
                    sys.stderr.flush()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            trace = obtain_trace(request)
        except CkptVizError as exc:
            raise _in_cli_words(exc, args) from None
        finally:
            stop.set()
            ticker.join()
            if sys.stderr.isatty() or os.environ.get("CKPT_VIZ_PROGRESS") == "1":
                sys.stderr.write("\n")
    trace.save(args.output)
    print(f"wrote {args.output}: {len(trace.events)} events, {len(trace.memory)} memory samples, "
          f"{len(trace.graphs)} graph snapshots")
    return 0


# ---------------------------------------------------------------- record --distributed

_TORCHRUN_VALUE_FLAGS = ("--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--rdzv-backend", "--rdzv-conf",
                         "--master-addr", "--master-port", "--max-restarts", "--log-dir", "--local-ranks-filter",
                         "--monitor-interval", "--start-method", "--role", "--local-addr")


def distributed_parser() -> argparse.ArgumentParser:
    """`ckpt-viz record --distributed`: our and torchrun's options come before SCRIPT; the rest is SCRIPT's."""
    parser = argparse.ArgumentParser(
        prog="ckpt-viz record --distributed",
        description="Run SCRIPT under torchrun with every rank recorded (one trace file per rank, in "
                    "--out/<run id>/rank-<R>.json), then merge them into <run id>/merged.json. The script builds "
                    "its stages with ckpt_viz.pipelining.PipelineStage. Multi-node: the torchrun flags below are "
                    "passed through (without --nnodes, --standalone is used); run the same command on every node "
                    "and `ckpt-viz merge` the folder afterwards.")
    parser.add_argument("--distributed", action="store_true", required=True, help="this mode (required)")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", default="1",
                        help="processes per node (torchrun's --nproc-per-node)")
    parser.add_argument("--out", default="traces", help="folder for <run id>/rank-<R>.json (default: traces)")
    parser.add_argument("--no-merge", action="store_true", help="keep the rank files only")
    torchrun = parser.add_argument_group("passed to torchrun (see `torchrun --help`)")
    for flag in _TORCHRUN_VALUE_FLAGS:
        torchrun.add_argument(flag, dest="torchrun_" + flag[2:].replace("-", "_"), metavar="VALUE")
    parser.add_argument("script", help="the training script every rank runs")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def torchrun_argv(args: argparse.Namespace, python: str = sys.executable) -> list[str]:
    """The torchrun command `record --distributed` runs: each rank is `python -m ckpt_viz.distributed SCRIPT ...`."""
    argv = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc_per_node)]
    passed = [(flag, getattr(args, "torchrun_" + flag[2:].replace("-", "_"))) for flag in _TORCHRUN_VALUE_FLAGS]
    passed = [(flag, value) for flag, value in passed if value is not None]
    if not any(flag == "--nnodes" for flag, _ in passed):
        argv.append("--standalone")
    for flag, value in passed:
        argv += [flag, value]
    return [*argv, "-m", "ckpt_viz.distributed", args.script, *args.script_args]


def record_distributed_command(argv: list[str]) -> int:
    import subprocess

    from ckpt_viz.errors import CkptVizError

    args = distributed_parser().parse_args(argv)
    if not os.path.isfile(args.script):
        raise CkptVizError(f"ckpt-viz record --distributed: no script '{args.script}'.\nTip: pass the path of the "
                           "training script that torchrun should run, e.g. examples/pipelining_torchrun.py.")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    before = set(os.listdir(out))
    env = {**os.environ, "CKPT_VIZ_DISTRIBUTED_DIR": out}
    env.setdefault("OMP_NUM_THREADS", "1")
    done = subprocess.run(torchrun_argv(args), env=env)
    new = sorted(set(os.listdir(out)) - before)
    if done.returncode != 0:
        print(f"ckpt-viz record --distributed: torchrun exited with status {done.returncode}; rank files so far "
              f"are in {out}" + ("; merging what exists (--partial)." if len(new) == 1 else "."), file=sys.stderr)
    if args.no_merge or args.torchrun_nnodes not in (None, "1") or len(new) != 1:
        print(f"rank traces in {out}" + (f"/{new[0]}" if len(new) == 1 else "") +
              "; merge them with `ckpt-viz merge <folder>`")
        return done.returncode
    from ckpt_viz.cli.merge import merge_command

    merged = merge_command(argparse.Namespace(dir=os.path.join(out, new[0]), output=None,
                                              partial=done.returncode != 0))
    return done.returncode or merged
