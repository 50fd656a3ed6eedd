"""How long do `Trace.save` and `Trace.load` take on a big trace?

Builds a realistic trace (default 200,000 typed events: handles created, phased, replayed,
routed and released, in tagged micro-batches, with memory samples and a few graph snapshots),
then times save and load, median of `--repeats`, for each way a user comes to save a trace, and
checks the load against the target (1 s: issue 26's bound for a 200,000-event trace). Beside
each wall time the process's CPU time is shown: on a loaded machine the wall time includes
waiting for a core.

The rows (`--rows`), each the same events:
  recording  what `record()` hands over (`ckpt-viz record`, `rec.trace.save(...)`): the events the
             real bus built, one `bus.emit` per event inside `bus.tag()` blocks, kept by a
             recording's channel.
  loaded     a trace loaded from a file and saved again untouched (after `ckpt-viz export`, or a
             file opened and re-saved).
  merged     `ckpt-viz merge`'s output: `merge_traces` of two rank traces.
  events     the events built by hand (`Trace(events=...)`), for comparison.

    python benchmarks/bench_trace_io.py                  # 200,000 events
    python benchmarks/bench_trace_io.py --events 1000000 # the 1M-event figure
    python benchmarks/bench_trace_io.py --events 20000   # quick

Exits 1 when a median load of the recording or loaded row misses the target. Standard library,
msgspec and ckpt_viz; no torch.
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

import msgspec

from ckpt_viz.events import (
    BackwardEntered,
    Event,
    EventBase,
    ExcludeReused,
    ExcludeSaved,
    ForwardFinished,
    ForwardStarted,
    GradsRouted,
    HandleCreated,
    MemorySampled,
    NodeCollected,
    PhaseSet,
    Released,
    ReplayFinished,
    ReplayStarted,
)
from ckpt_viz.trace import GraphNode, GraphSnapshot, MemorySample, Trace, run_meta

TARGET_S = 1.0  # issue 26's bound for loading a 200,000-event trace (the .json.gz file)

_EXCLUDE = {"wrapper": "norm", "wrapper_id": 1, "call_index": 0, "checkpoint_mode": "reentrant"}
# One handle's life in a split (DX/DW) schedule: (event type, phase, fields).
_LIFE = (
    (HandleCreated, "ordinary", {"function": "Block.forward", "split": True, "input_count": 2}),
    (ForwardStarted, "ordinary", {}),
    (ExcludeSaved, None, _EXCLUDE),
    (ForwardFinished, "ordinary", {}),
    (PhaseSet, "dx", {"old": "ordinary", "new": "dx"}),
    (BackwardEntered, "dx", {"retain_graph": True}),
    (ReplayStarted, "dx", {"trigger": "backward"}),
    (ExcludeReused, None, {**_EXCLUDE, "placeholder": False}),
    (ReplayFinished, "dx", {"trigger": "backward"}),
    (GradsRouted, "dx", {"targets": (0,)}),
    (PhaseSet, "dw", {"old": "dx", "new": "dw"}),
    (BackwardEntered, "dw", {"retain_graph": False}),
    (GradsRouted, "dw", {"targets": (0, 1), "explicit_params": (1,)}),
    (Released, "dw", {"reason": "dw_complete", "was_replayed": True}),
    (MemorySampled, None, {}),
    (NodeCollected, None, {"was_replayed": True, "released": True}),
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
            for cls, phase, fields in _LIFE:
                if len(events) == n_events:
                    break
                seq = len(events)
                t_ns += rng.randrange(200, 5_000)
                events.append(cls(
                    seq=seq, t_ns=t_ns, handle_id=handle, mode="reentrant", phase=phase,
                    session_id=session if phase in ("dx", "dw") else None, tags=tags,
                    site=_SITES[seq % len(_SITES)], thread_id=thread_id, **fields,
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
    nodes = [GraphNode(id=0, name="loss", kind="backward", dx_reached=True)]
    edges = []
    for i in range(1, 60):
        kind = ("backward", "checkpoint", "leaf", "trigger")[i % 4]
        nodes.append(GraphNode(id=i, name=f"n{i}", kind=kind, handle_id=i // 4 if kind == "checkpoint" else None,
                               dx_reached=i % 2 == 0, dw_reached=i % 3 == 0, shape=(8, 16) if kind == "leaf" else None))
        edges.append((i - 1, i))
    return GraphSnapshot(seq=seq, label=f"after event {seq}", nodes=tuple(nodes), edges=tuple(edges))


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
    parser.add_argument("--events", type=int, default=200_000, help="events in the trace (default 200,000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell; the median is shown")
    parser.add_argument("--memory-every", type=int, default=16,
                        help="one memory sample per this many events (1: every event, as record(memory=True); 0: none)")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="which rows to time")
    args = parser.parse_args(argv)
    backend = f"msgspec {msgspec.__version__}"

    start = time.perf_counter()
    trace = build_trace(args.events, memory_every=args.memory_every)
    print(f"built {len(trace.events):,} events, {len(trace.memory):,} memory samples, "
          f"{len(trace.graphs)} graphs in {time.perf_counter() - start:.1f} s (not timed below)")
    print(f"python {sys.version.split()[0]}, {backend}, {os.cpu_count()} CPUs, "
          f"target {TARGET_S:.1f} s per load\n")

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
                    ok = ok and load_s <= TARGET_S
            for loaded in loads:
                _spot_check(source, loaded)
            print(f"{row}: source made in {built_s:.1f} s (not timed)")
            source = loaded = loads = None

    print(f"\n{'row':<20} {'size MB':>8} {'save s':>7} {'load s':>7} {'save CPU s':>10} {'load CPU s':>10}  result")
    for name, size_mb, save_s, load_s, save_cpu, load_cpu in rows:
        verdict = "PASS" if load_s <= TARGET_S else "FAIL"
        print(f"{name:<20} {size_mb:8.1f} {save_s:7.2f} {load_s:7.2f} {save_cpu:10.2f} {load_cpu:10.2f}  {verdict}")
    print(f"\nthe target applies to the .json.gz rows of {' and '.join(TARGET_ROWS)} (the user paths; see --help)")
    print("PASS: load within target" if ok else f"FAIL: a median load is over {TARGET_S:.1f} s")
    return 0 if ok else 1


def as_recording(trace: Trace) -> Trace:
    """The trace's events as `record()` keeps them: emitted through the bus into a recording's channel.

    Each event goes through `bus.emit` with its type, handle, mode, phase, session, site and own
    fields, inside a `bus.tag()` block per micro-batch (so the tags are one object per block, as
    in a run); the bus stamps seq, t_ns and thread_id itself, and the channel appends each event to
    the trace's list, as `record()` without a memory probe does. The memory samples are kept as given.
    """
    from ckpt_viz import bus

    recorded = Trace(memory=list(trace.memory), graphs=trace.graphs, meta=trace.meta)
    channel = bus.open_channel(recorded.events.append)
    common = set(EventBase.__struct_fields__)
    try:
        block, tags = contextlib.ExitStack(), None
        with block:
            for e in trace.events:
                if e.tags is not tags:
                    block.close()
                    tags = e.tags
                    block.enter_context(bus.tag(**tags))
                own = {f: getattr(e, f) for f in e.__struct_fields__ if f not in common}
                bus.emit(type(e), handle_id=e.handle_id, mode=e.mode, phase=e.phase, session_id=e.session_id,
                         site=e.site, capture_site=False, **own)
    finally:
        channel.close()
    assert len(recorded.events) == len(trace.events)
    return recorded


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
