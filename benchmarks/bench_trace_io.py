"""How long do `Trace.save` and `Trace.load` take on a big trace?

Builds a realistic trace (default 1,000,000 events: handles created, packed,
phased, replayed, routed and released, in tagged micro-batches, with memory
samples and a few graph snapshots), then times save and load, median of
`--repeats`, for each way a user comes to save a trace, and checks them against
the target (0.8 s each, the performance issue's figure for `.json.gz`). Beside
each wall time the process's CPU time is shown: on a loaded machine the wall time
includes waiting for a core.

The rows (`--rows`), each the same events:
  recording  THE USER PATH of the target: what `record()` hands over
             (`ckpt-viz record`, `rec.trace.save(...)`): a `RecordedEvents` that the
             real bus fed, one `bus.emit` per event inside `bus.tag()` blocks (its
             `keep` sink, ROW_FIELDS tuples), never built as Events.
  loaded     a trace loaded from a file and saved again untouched (after `ckpt-viz
             export`, or a file opened and re-saved).
  merged     `ckpt-viz merge`'s output: `merge_traces` of two rank traces (Event
             objects, each with its own tags dict, as the merge builds them).
  events     a list of `Event` objects built by hand (`Trace.from_events`); kept for
             comparison with earlier figures: no ckpt_viz path saves a million of
             these, and reading 11 fields of a million objects alone costs about 0.6 s.

    python benchmarks/bench_trace_io.py                 # 1,000,000 events
    python benchmarks/bench_trace_io.py --events 20000  # quick

Exits 1 when a median of the recording or loaded row misses the target. Standard
library plus ckpt_viz; no torch.
"""
from __future__ import annotations

import argparse
import contextlib
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


ROWS = ("recording", "loaded", "merged", "events")
TARGET_ROWS = ("recording", "loaded")  # the user paths the figure is about (see the docstring)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the trace (default 1,000,000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell; the median is shown")
    parser.add_argument("--memory-every", type=int, default=16,
                        help="one memory sample per this many events (1: every event, as record(memory=True); 0: none)")
    parser.add_argument("--json", choices=("auto", "stdlib"), default="auto",
                        help="auto: orjson when installed, else the stdlib json; stdlib: never orjson")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="which rows to time")
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

    rows, ok = [], True
    with tempfile.TemporaryDirectory() as folder:
        sources = {
            "recording": lambda: as_recording(trace),
            "loaded": lambda: _loaded(trace, os.path.join(folder, "source.json.gz")),
            "merged": lambda: as_merged(trace),
            "events": lambda: trace,
        }
        for row in args.rows:
            start = time.perf_counter()
            source = sources[row]()
            built_s = time.perf_counter() - start
            loads = []
            for suffix in (".json", ".json.gz") if row in ("recording", "events") else (".json.gz",):
                path = os.path.join(folder, row + suffix)
                save_s, save_cpu, _ = _median_time(lambda path=path, source=source: source.save(path), args.repeats)
                load_s, load_cpu, loaded = _median_time(lambda path=path: Trace.load(path), args.repeats)
                loads.append(loaded)
                rows.append((f"{row} {suffix}", os.path.getsize(path) / 1e6, save_s, load_s, save_cpu, load_cpu))
                if row in TARGET_ROWS and suffix == ".json.gz":
                    ok = ok and save_s <= TARGET_S and load_s <= TARGET_S
            for loaded in loads:  # after every save: reading a recording's events builds them (a slower save)
                _spot_check(source, loaded)
            print(f"{row}: source made in {built_s:.1f} s (not timed)")
            source = loaded = loads = None

    print(f"\n{'row':<20} {'size MB':>8} {'save s':>7} {'load s':>7} {'save CPU s':>10} {'load CPU s':>10}  result")
    for name, size_mb, save_s, load_s, save_cpu, load_cpu in rows:
        verdict = "PASS" if save_s <= TARGET_S and load_s <= TARGET_S else "FAIL"
        print(f"{name:<20} {size_mb:8.1f} {save_s:7.2f} {load_s:7.2f} {save_cpu:10.2f} {load_cpu:10.2f}  {verdict}")
    print(f"\nthe target applies to the .json.gz rows of {' and '.join(TARGET_ROWS)} (the user paths; see --help)")
    print("PASS: save and load within target" if ok else f"FAIL: a median is over {TARGET_S:.1f} s")
    return 0 if ok else 1


def as_recording(trace: Trace) -> Trace:
    """The trace's events as `record()` keeps them: emitted through the bus into a recording's channel.

    Each event goes through `bus.emit` with its kind, handle, mode, phase, session, site and
    data, inside a `bus.tag()` block per micro-batch (so the tags are one object per block, as
    in a run); the bus stamps t_ns and thread_id itself. The channel's sink is the
    `RecordedEvents.keep` that `record()` opens (NOTE [ Lazy events ] in ckpt_viz/trace/rows.py).
    The memory samples go to a `RecordedMemory.keep`, as record(memory=True)'s probe hands them over.
    """
    from ckpt_viz import bus
    from ckpt_viz.trace.rows import RecordedEvents, RecordedMemory

    recorded = RecordedEvents()
    channel = bus.open_channel(rows=recorded.keep)
    try:
        block, tags = contextlib.ExitStack(), None
        with block:
            for e in trace.events:
                if e.tags is not tags:
                    block.close()
                    tags = e.tags
                    block.enter_context(bus.tag(**tags))
                bus.emit(e.kind, handle_id=e.handle_id, mode=e.mode, phase=e.phase, session_id=e.session_id,
                         site=e.site, data=dict(e.data))
    finally:
        channel.close()
    assert recorded.pending == len(trace.events)
    memory = RecordedMemory()  # what record(memory=True) keeps: each change of reading as its probe hands it over
    for s in trace.memory:
        memory.keep(s.seq, s.t_ns, s.bytes_by_category, s.device_allocated, s.by_stage)
    return Trace(events=recorded, memory=memory, graphs=trace.graphs, meta=trace.meta)


def as_merged(trace: Trace) -> Trace:
    """`ckpt-viz merge`'s output for a two-rank run: `merge_traces` of two rank traces of half the events each.

    Both ranks run at once (their clocks start together), so the merged events interleave.
    """
    from ckpt_viz.cli.merge import merge_traces

    ranks = {}
    for rank in (0, 1):
        part = build_trace(len(trace.events) // 2 + rank * (len(trace.events) % 2), seed=rank,
                           memory_every=_memory_every(trace))
        header = {"rank": rank, "run_id": "bench", "world_size": 2, "clock": {"offset_to_rank0_ns": 0}}
        ranks[rank] = Trace(events=part.events, memory=part.memory, meta={**trace.meta, "distributed": header})
    return merge_traces(ranks, "bench")


def _memory_every(trace: Trace) -> int:
    if not trace.memory:
        return 0
    return max(1, round(len(trace.events) / len(trace.memory)))


def _loaded(trace: Trace, path: str) -> Trace:
    trace.save(path)
    return Trace.load(path)


def _spot_check(original: Trace, loaded: Trace) -> None:
    # A full comparison of a million events takes longer than the load; compare a sample (reading a
    # recording's events builds them all, after its saves were timed).
    assert len(loaded.events) == len(original.events)
    rng = random.Random(1)
    n = len(original.events)
    for i in [0, n - 1, *rng.sample(range(n), min(n, 200))]:
        assert loaded.events[i] == original.events[i], i
    assert loaded.memory == original.memory and loaded.graphs == original.graphs and loaded.meta == original.meta


if __name__ == "__main__":
    raise SystemExit(main())
