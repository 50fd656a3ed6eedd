"""How long do `Trace.save` and `Trace.load` take on a big trace?

Builds a realistic trace (default 1,000,000 events: handles created, packed,
phased, replayed, routed and released, in tagged micro-batches, with memory
samples and a few graph snapshots), then times save and load, median of 3, for
.json and .json.gz, and checks them against the target (0.8 s each). Beside each wall time the
process's CPU time is shown: on a loaded machine the wall time includes waiting for a core.

    python benchmarks/bench_trace_io.py                 # 1,000,000 events
    python benchmarks/bench_trace_io.py --events 20000  # quick

Exits 1 when a median misses the target. Standard library plus ckpt_viz; no torch.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

from ckpt_viz.events import Event
from ckpt_viz.trace import GraphSnapshot, MemorySample, Trace, run_meta
from ckpt_viz.trace import io as trace_io

TARGET_S = 0.8  # the performance issue's target, per save and per load of the .json.gz file

# One handle's life in a split (DX/DW) schedule: (kind, phase, data).
_LIFE = (
    ("handle_created", "ordinary", {"split": True, "input_count": 2}),
    ("forward_started", "ordinary", {}),
    ("exclude_saved", None, {"wrapper_id": 1, "call_index": 0}),
    ("forward_finished", "ordinary", {"duration_ns": 41_000}),
    ("phase_set", "dx", {"old": "ordinary", "new": "dx"}),
    ("backward_entered", "dx", {"retain_graph": True}),
    ("replay_started", "dx", {"trigger": "backward"}),
    ("exclude_reused", None, {"wrapper_id": 1, "call_index": 0, "placeholder": False}),
    ("replay_finished", "dx", {"duration_ns": 39_000}),
    ("grads_routed", "dx", {"targets": [0]}),
    ("phase_set", "dw", {"old": "dx", "new": "dw"}),
    ("backward_entered", "dw", {"retain_graph": False}),
    ("grads_routed", "dw", {"targets": [0, 1], "params": 4}),
    ("released", "dw", {"reason": "dw_complete", "was_replayed": True}),
    ("memory_sampled", None, {}),
    ("node_collected", None, {"was_replayed": True, "released": True}),
)
_SITES = [f"train.py:{n}" for n in (41, 57, 58, 90)] + [None]


def build_trace(n_events: int, seed: int = 0, memory_every: int = 16) -> Trace:
    """A trace of exactly `n_events` events, deterministic for a seed.

    A memory sample follows every `memory_every`-th event (`record(memory=True)`
    samples after every event: pass 1 for that; 0 for none).
    """
    rng = random.Random(seed)
    events: list[Event] = []
    memory: list[MemorySample] = []
    thread_id = 140_000_000_000_001
    t_ns = 1_700_000_000_000_000
    handle = 0
    microbatch = 0
    while len(events) < n_events:
        tags = {"stage": microbatch % 4, "microbatch": microbatch}  # one object per micro-batch, like bus.tag
        session = f"mb{microbatch}"
        for _ in range(4):  # four checkpointed blocks per micro-batch
            for kind, phase, data in _LIFE:
                if len(events) == n_events:
                    break
                seq = len(events)
                t_ns += rng.randrange(200, 5_000)
                events.append(Event(
                    seq=seq, t_ns=t_ns, kind=kind, handle_id=handle, mode="reentrant", phase=phase,
                    session_id=session if phase in ("dx", "dw") else None, tags=tags,
                    site=_SITES[seq % len(_SITES)], thread_id=thread_id, data=dict(data),
                ))
                if memory_every and seq % memory_every == memory_every - 1:
                    activations = rng.randrange(1 << 20, 1 << 24)
                    memory.append(MemorySample(seq=seq, t_ns=t_ns, device_allocated=None, bytes_by_category={
                        "parameters": 4 << 20, "gradients": 4 << 20, "activations": activations,
                        "checkpoint_inputs": 1 << 18, "replay_activations": rng.randrange(0, 1 << 22),
                        "excluded_outputs": 1 << 16, "other": 0},
                        by_stage={str(tags["stage"]): {"activations": activations}}))
            handle += 1
        microbatch += 1
    graphs = [_graph(seq) for seq in range(0, n_events, max(1, n_events // 5))]
    return Trace(events=events, memory=memory, graphs=graphs,
                 meta=run_meta(model="bench", mode="reentrant", schedule="zb-h1"))


def _graph(seq: int) -> GraphSnapshot:
    nodes = [{"id": 0, "name": "loss", "kind": "backward", "handle_id": None, "dx_reached": True,
              "dw_reached": False, "shape": []}]
    edges = []
    for i in range(1, 60):
        kind = ("backward", "checkpoint", "leaf", "trigger")[i % 4]
        nodes.append({"id": i, "name": f"n{i}", "kind": kind, "handle_id": i // 4 if kind == "checkpoint" else None,
                      "dx_reached": i % 2 == 0, "dw_reached": i % 3 == 0, "shape": [8, 16] if kind == "leaf" else None})
        edges.append([i - 1, i])
    return GraphSnapshot(seq=seq, label=f"after event {seq}", nodes=nodes, edges=edges)


def _median_time(fn, repeats: int) -> tuple[float, float, object]:
    """(median wall seconds, median CPU seconds of this process, the last result)."""
    times, cpus, result = [], [], None
    for _ in range(repeats):
        result = None  # free the last result outside the timed region
        start, cpu = time.perf_counter(), time.process_time()
        result = fn()
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(times), statistics.median(cpus), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the trace (default 1,000,000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell; the median is shown")
    parser.add_argument("--memory-every", type=int, default=16,
                        help="one memory sample per this many events (1: every event, as record(memory=True); 0: none)")
    parser.add_argument("--json", choices=("auto", "stdlib"), default="auto",
                        help="auto: orjson when installed, else the stdlib json; stdlib: never orjson")
    args = parser.parse_args(argv)
    if args.json == "stdlib":
        trace_io._orjson = None  # the module's optional accelerator; None means stdlib json only
    backend = "orjson " + trace_io._orjson.__version__ if trace_io._orjson is not None else "stdlib json"

    start = time.perf_counter()
    trace = build_trace(args.events, memory_every=args.memory_every)
    print(f"built {len(trace.events):,} events, {len(trace.memory):,} memory samples, "
          f"{len(trace.graphs)} graphs in {time.perf_counter() - start:.1f} s (not timed below)")
    print(f"python {sys.version.split()[0]}, {backend}, {os.cpu_count()} CPUs, "
          f"target {TARGET_S:.1f} s per save and per load\n")

    recorded = as_recording(trace)
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as folder:
        cases = [(".json", trace), (".json.gz", trace)] + ([("rec.json.gz", recorded)] if recorded else [])
        for suffix, source in cases:
            path = os.path.join(folder, "trace" + suffix)
            save_s, save_cpu, _ = _median_time(lambda path=path, source=source: source.save(path), args.repeats)
            load_s, load_cpu, loaded = _median_time(lambda path=path: Trace.load(path), args.repeats)
            _spot_check(trace, loaded)
            size_mb = os.path.getsize(path) / 1e6
            rows.append((suffix, size_mb, save_s, load_s, save_cpu, load_cpu))
            if source is trace:  # the target; a recording's save is shown for scale
                ok = ok and save_s <= TARGET_S and load_s <= TARGET_S
        start = time.perf_counter()
        n_materialized = sum(1 for _ in loaded.events)
        iterate_s = time.perf_counter() - start

    print(f"{'file':<11} {'size MB':>8} {'save s':>7} {'load s':>7} {'save CPU s':>10} {'load CPU s':>10}  result")
    for suffix, size_mb, save_s, load_s, save_cpu, load_cpu in rows:
        verdict = "PASS" if save_s <= TARGET_S and load_s <= TARGET_S else "FAIL"
        print(f"{suffix:<11} {size_mb:8.1f} {save_s:7.2f} {load_s:7.2f} {save_cpu:10.2f} {load_cpu:10.2f}  {verdict}")
    if recorded:
        print("\nrec.json.gz: the same events saved from a recording's RecordedEvents (kept as field values, "
              "never built as Events), as record() hands them to Trace.save; not part of the target")
    print(f"\n(for scale, not part of the target: building all {n_materialized:,} Event objects of a loaded "
          f"trace by iterating it once took {iterate_s:.2f} s; load builds them lazily)")
    print("PASS: save and load within target" if ok else f"FAIL: a median is over {TARGET_S:.1f} s")
    return 0 if ok else 1


def as_recording(trace: Trace) -> Trace | None:
    """The trace with its events kept the way a recording keeps them (ckpt_viz.trace.rows), or None."""
    try:
        from ckpt_viz.events import ROW_FIELDS
        from ckpt_viz.trace.rows import RecordedEvents
    except ImportError:
        return None
    recorded = RecordedEvents()
    keep = getattr(recorded, "keep", None)
    if keep is None:
        return None
    for event in trace.events:
        keep(tuple(getattr(event, name) for name in ROW_FIELDS))
    return Trace(events=recorded, memory=trace.memory, graphs=trace.graphs, meta=trace.meta)


def _spot_check(original: Trace, loaded: Trace) -> None:
    # A full comparison of a million events takes longer than the load; compare a sample.
    assert len(loaded.events) == len(original.events)
    rng = random.Random(1)
    for i in [0, len(original.events) - 1, *rng.sample(range(len(original.events)), 200)]:
        assert loaded.events[i] == original.events[i], i
    assert loaded.memory == original.memory and loaded.graphs == original.graphs and loaded.meta == original.meta


if __name__ == "__main__":
    raise SystemExit(main())
