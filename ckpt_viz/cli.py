"""The `ckpt-viz` command line (also `python -m ckpt_viz`).

    ckpt-viz record MODEL --mode split-reentrant -o trace.json   record a run (progress on stderr)
    ckpt-viz info trace.json                                       handles, replays, peak memory, problems
    ckpt-viz export trace.json --perfetto out.json                 Chrome trace format for Perfetto
    ckpt-viz app                                                   start the Streamlit app
    ckpt-viz demo                                                  print the events of a built-in run

Owns argument parsing and printing; the work is done by `scenarios`, `sandbox`, `trace` and the renderers.
MODEL is a built-in name (see `ckpt-viz record --help`), `path/to/file.py:factory` or
`package.module:factory`; user models run in a subprocess with a time and a memory limit.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["main"]


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
            where = "" if done else f" {tags.get('action', '')} stage {tags.get('stage', '-')} mb {tags.get('microbatch', '-')}"
            text = f"[{bar:<30}] {fraction:4.0%}{where}  {self.events} events  {elapsed:.1f} s"
        else:
            text = f"recording: {self.events} events  {elapsed:.1f} s" + ("  done" if done else "")
        self.stream.write("\r" + text.ljust(90))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw({}, done=True)
            self.stream.write("\n")


def _record(args: argparse.Namespace) -> int:
    from ckpt_viz import bus
    from ckpt_viz.zoo import BUILTIN_MODELS, build_builtin

    extra = {"schedule": args.schedule, "microbatches": args.microbatches, "seed": args.seed,
             "memory": not args.no_memory, "graphs": not args.no_graphs}
    if args.model in BUILTIN_MODELS:
        from ckpt_viz.scenarios import run_scenario

        spec = build_builtin(args.model, seed=args.seed)
        total = None  # the bar shows a percentage when the number of actions is known: a pipeline run
        if args.mode == "pipeline" and spec.stages:
            from ckpt_viz.pipeline import make_schedule

            total = sum(map(len, make_schedule(args.schedule, len(spec.stages), args.microbatches).values()))
        progress = _Progress(total)
        unsubscribe = bus.subscribe(progress)
        try:
            trace = run_scenario(spec, args.mode, **extra)
        finally:
            unsubscribe()
            progress.close()
    else:
        from ckpt_viz.sandbox import record_in_subprocess

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
            trace = record_in_subprocess(args.model, args.mode, timeout_s=args.timeout, memory_mb=args.memory_mb,
                                         extra=extra)
        finally:
            stop.set()
            ticker.join()
            if sys.stderr.isatty() or os.environ.get("CKPT_VIZ_PROGRESS") == "1":
                sys.stderr.write("\n")
    trace.save(args.output)
    print(f"wrote {args.output}: {len(trace.events)} events, {len(trace.memory)} memory samples, "
          f"{len(trace.graphs)} graph snapshots")
    return 0


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def summarize(trace: Any) -> str:
    """The text `ckpt-viz info` prints: handles, replays, releases, peak memory by category, problems."""
    meta = trace.meta or {}
    lines = [f"model {meta.get('model', '?')}  mode {meta.get('mode', '?')}"
             + (f"  schedule {meta['schedule']}" if meta.get("schedule") else ""),
             f"{len(trace.events)} events, {len(trace.memory)} memory samples, {len(trace.graphs)} graph snapshots"]
    created: dict[int, str] = {}
    replays: dict[int, int] = {}
    reasons: dict[int, str] = {}
    kinds: dict[str, int] = {}
    for e in trace.events:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
        if e.kind == "handle_created":
            created[e.handle_id] = e.mode or "?"
        elif e.kind == "replay_started":
            replays[e.handle_id] = replays.get(e.handle_id, 0) + 1
        elif e.kind == "released":
            reasons[e.handle_id] = e.data.get("reason", "?")
    lines.append(f"handles: {len(created)} "
                 f"({', '.join(f'{m} {list(created.values()).count(m)}' for m in sorted(set(created.values())))})")
    if created:
        counts = sorted(set(replays.get(h, 0) for h in created))
        lines.append(f"replays per handle: {', '.join(f'{c} x{[replays.get(h, 0) for h in created].count(c)}' for c in counts)}"
                     f"  (total {sum(replays.values())})")
        by_reason: dict[str, int] = {}
        for h in created:
            by_reason[reasons.get(h, "not released")] = by_reason.get(reasons.get(h, "not released"), 0) + 1
        lines.append("released: " + ", ".join(f"{r} {n}" for r, n in sorted(by_reason.items())))
    if trace.memory:
        peak = max(trace.memory, key=lambda s: sum(s.bytes_by_category.values()))
        total = sum(peak.bytes_by_category.values())
        lines.append(f"peak memory {_fmt_bytes(total)} at event {peak.seq}:")
        for category, nbytes in sorted(peak.bytes_by_category.items(), key=lambda kv: -kv[1]):
            if nbytes:
                lines.append(f"  {category:<20} {_fmt_bytes(nbytes):>12}")
    lines.append("events: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    from ckpt_viz.diagnose import diagnose_all

    problems = diagnose_all(trace)
    lines.append(f"problems: {len(problems)}" if problems else "problems: none")
    lines.extend(f"  h{d.handle_id}: {d.code}: {d.summary}" for d in problems)
    return "\n".join(lines)


def _info(args: argparse.Namespace) -> int:
    from ckpt_viz.trace import Trace

    print(summarize(Trace.load(args.trace)))
    return 0


def _export(args: argparse.Namespace) -> int:
    from ckpt_viz.render.perfetto import render_perfetto
    from ckpt_viz.trace import Trace

    if not args.perfetto:
        print("ckpt-viz export: nothing to export.\nTip: pass --perfetto out.json", file=sys.stderr)
        return 2
    trace = Trace.load(args.trace)
    doc = render_perfetto(trace.events, trace.memory, trace.meta)
    target = Path(args.perfetto)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, target)
    print(f"wrote {target}: {len(doc['traceEvents'])} trace events (open it at ui.perfetto.dev or chrome://tracing)")
    return 0


def app_path() -> Path:
    """The Streamlit entry point of a source checkout (the app is not part of the wheel)."""
    here = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
    if not here.exists():
        from ckpt_viz.errors import CkptVizError

        raise CkptVizError(f"ckpt-viz app: the app is not next to the package ({here} is missing).\n"
                           "Tip: run it from a source checkout: `bash scripts/app.sh`.")
    return here


def _app(args: argparse.Namespace) -> int:
    command = [sys.executable, "-m", "streamlit", "run", str(app_path()), "--server.address", args.address,
               "--server.port", str(args.port), *args.streamlit_args]
    return subprocess.call(command, cwd=app_path().parent.parent)


def _demo(args: argparse.Namespace) -> int:
    from ckpt_viz.render.text import render_text
    from ckpt_viz.scenarios import run_scenario
    from ckpt_viz.zoo import build_builtin

    spec = build_builtin(args.model)
    trace = run_scenario(spec, args.mode)
    print(f"ckpt_viz demo: model {spec.name!r} ({spec.description}), mode {args.mode!r}")
    print(render_text(trace.events, site=args.site), end="")
    handles = len({e.handle_id for e in trace.of_kind("handle_created")})
    print(f"\n{handles} handles, {trace.count('replay_started')} replays, {trace.count('released')} released, "
          f"{len(trace)} events")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ckpt_viz.scenarios import MODES
    from ckpt_viz.zoo import BUILTIN_MODELS, DEFAULT_MODEL

    parser = argparse.ArgumentParser(prog="ckpt-viz", description="See and debug PyTorch activation checkpointing.")
    sub = parser.add_subparsers(dest="command", required=True)

    rec = sub.add_parser("record", help="record a run of a model to a trace file",
                         description=f"MODEL is a built-in ({', '.join(sorted(BUILTIN_MODELS))}), "
                                     "path/to/file.py:factory or package.module:factory.")
    rec.add_argument("model")
    rec.add_argument("--mode", default="split-reentrant", choices=MODES)
    rec.add_argument("-o", "--output", default="trace.json", help="trace file (.json or .json.gz)")
    rec.add_argument("--schedule", default="1F1B", help="pipeline schedule: GPipe, 1F1B, ZB-H1")
    rec.add_argument("--microbatches", type=int, default=4)
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--no-memory", action="store_true", help="skip memory sampling")
    rec.add_argument("--no-graphs", action="store_true", help="skip graph snapshots")
    rec.add_argument("--timeout", type=float, default=120.0, help="user models: seconds before the run is stopped")
    rec.add_argument("--memory-mb", type=int, default=8192, help="user models: address-space limit in MiB")
    rec.set_defaults(run=_record)

    info = sub.add_parser("info", help="summarize a trace file")
    info.add_argument("trace")
    info.set_defaults(run=_info)

    export = sub.add_parser("export", help="convert a trace file")
    export.add_argument("trace")
    export.add_argument("--perfetto", metavar="OUT", help="write Chrome trace-event JSON for Perfetto")
    export.set_defaults(run=_export)

    app = sub.add_parser("app", help="start the Streamlit app")
    app.add_argument("--address", default="127.0.0.1")
    app.add_argument("--port", type=int, default=8501)
    app.add_argument("streamlit_args", nargs=argparse.REMAINDER, help="passed to `streamlit run`")
    app.set_defaults(run=_app)

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
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # errors written for users: print them, not a traceback
        from ckpt_viz.errors import CkptVizError

        if isinstance(exc, CkptVizError):
            print(str(exc), file=sys.stderr)
            return 2
        raise
