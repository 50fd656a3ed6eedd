"""`ckpt-viz record`: record a built-in run or a sandboxed model file through `obtain_trace`, with progress on stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

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


def record_command(args: argparse.Namespace) -> int:
    from ckpt_viz.run.obtain import RunRequest, obtain_trace
    from ckpt_viz.run.zoo import BUILTIN_MODELS, build_builtin
    from ckpt_viz.trace.files import check_writable

    check_writable(args.output, "ckpt-viz record")  # a missing or read-only folder fails now, not after the run

    builtin = args.model in BUILTIN_MODELS
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
        finally:
            stop.set()
            ticker.join()
            if sys.stderr.isatty() or os.environ.get("CKPT_VIZ_PROGRESS") == "1":
                sys.stderr.write("\n")
    trace.save(args.output)
    print(f"wrote {args.output}: {len(trace.events)} events, {len(trace.memory)} memory samples, "
          f"{len(trace.graphs)} graph snapshots")
    return 0
