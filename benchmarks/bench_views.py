"""How fast are the queries the app's views make of a big trace?

Moved here from the tests (which keep the same checks without a clock):
  1. the lifecycle (`ckpt_viz.analysis.lifecycle`) of a synthetic 1,000,000-event trace   target < 10 s
  2. cursor queries (states of every handle, the memory reading) at 3 cursors    target < 0.05 s each
  3. `render_graph` of a 5,103-node snapshot, full and collapsed                 target < 5 s for both

    python benchmarks/bench_views.py            # the sizes above
    python benchmarks/bench_views.py --quick    # 20,000 events, 100 blocks: a smoke run; its times mean little

Prints one line per measurement and exits 1 when one misses its target (full run only).
Standard library and ckpt_viz only (no torch); the synthetic traces come from tests/traces.py.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from ckpt_viz.analysis.lifecycle import lifecycle  # noqa: E402
from ckpt_viz.analysis.memory import memory  # noqa: E402
from ckpt_viz.render.graph import render_graph  # noqa: E402
from ckpt_viz.trace import Trace  # noqa: E402
from traces import block_snapshot, synthetic_trace  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; never fails on time")
    args = parser.parse_args(argv)
    n_events, n_blocks = (20_000, 100) if args.quick else (1_000_000, 850)
    rows: list[tuple[str, float, float]] = []

    trace = synthetic_trace(n_events)
    start = time.perf_counter()
    life = lifecycle(trace)
    memory(trace)
    rows.append((f"lifecycle and memory, {n_events:,} events", time.perf_counter() - start, 10.0))
    for cursor in (0, n_events // 2, n_events - 1):
        start = time.perf_counter()
        life.counts_at(cursor)
        memory(trace).at(cursor)
        rows.append((f"cursor queries at {cursor:,}", time.perf_counter() - start, 0.05))

    graph = Trace(graphs=[block_snapshot(n_blocks, replay=True)])
    start = time.perf_counter()
    render_graph(graph, collapse=False)
    render_graph(graph)
    rows.append((f"render_graph x2, {len(graph.graphs[0].nodes):,} nodes", time.perf_counter() - start, 5.0))

    missed = 0
    for name, seconds, target in rows:
        ok = seconds < target
        missed += not ok
        print(f"{name:<40} {seconds:9.3f} s   target < {target:g} s   {'ok' if ok else 'MISSED'}")
    return 1 if missed and not args.quick else 0


if __name__ == "__main__":
    raise SystemExit(main())
