"""The same built-in run records the same trace: twice in one process, in a second process, and 8 at once.

"The same" is every event's seq, kind, handle, mode, phase, session, tags, site and data, every
memory sample (seq, bytes by category and stage) and every graph snapshot; only timestamps and
thread ids may differ (and, for runs at once on threads, the memory probe: see below).
"""
from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ckpt_viz.run.scenarios import MODES, run_scenario
from ckpt_viz.run.zoo import BUILTIN_MODELS, build_builtin

# Every built-in model in every mode it runs in (the pipeline mode needs a model with stages).
RUNS = [(model, mode) for model in BUILTIN_MODELS for mode in MODES
        if mode != "pipeline" or build_builtin(model).stages]
THREADS = 8


def comparable(trace: Any) -> dict[str, Any]:
    """The trace without timestamps and thread ids, as plain JSON values (every other field of every event)."""
    events = [msgspec.to_builtins(msgspec.structs.replace(e, t_ns=0, thread_id=0)) | {"kind": e.kind}
              for e in trace.events]
    memory = [[m.seq, m.bytes_by_category, m.device_allocated, m.by_stage] for m in trace.memory]
    graphs = [[g.seq, g.label, msgspec.to_builtins(g.nodes), g.edges] for g in trace.graphs]
    meta = {k: v for k, v in trace.meta.items() if k != "versions"}
    return json.loads(json.dumps({"events": events, "memory": memory, "graphs": graphs, "meta": meta},
                                 sort_keys=True, default=repr))


def record_run(model: str, mode: str) -> dict[str, Any]:
    return comparable(run_scenario(build_builtin(model), mode, memory=True, graphs=True))


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    for part in ("events", "memory", "graphs", "meta"):
        if a[part] != b[part]:
            if isinstance(a[part], dict):
                return f"meta: {a[part]} != {b[part]}"
            for i, (x, y) in enumerate(zip(a[part], b[part])):
                if x != y:
                    return f"{part}[{i}]: {x} != {y}"
            return f"{part}: {len(a[part])} entries != {len(b[part])}"
    return "none"


@pytest.fixture
def collector_extremes() -> Iterator[tuple[Any, Any]]:
    """Two ways to run: the garbage collector running all the time, and not at all."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()

    def often() -> None:
        gc.enable()
        gc.set_threshold(1, 1, 1)

    def never() -> None:
        gc.disable()

    try:
        yield often, never
    finally:
        gc.set_threshold(*thresholds)
        (gc.enable if enabled else gc.disable)()


@pytest.mark.parametrize(("model", "mode"), RUNS)
def test_recording_a_run_twice_in_one_process_gives_the_same_trace(model: str, mode: str,
                                                                    collector_extremes: tuple[Any, Any]) -> None:
    often, never = collector_extremes
    often()  # garbage freed by the collector, not by reference counting, would land at other points
    first = record_run(model, mode)
    never()
    second = record_run(model, mode)
    assert first["events"], "the run recorded nothing"
    assert first["memory"], "the run recorded no memory samples"
    assert first == second, first_difference(first, second)


@pytest.fixture(scope="module")
def second_process() -> dict[str, Any]:
    """Every run of `RUNS`, recorded in a fresh interpreter."""
    out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300,
                         cwd=Path.cwd())
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize(("model", "mode"), RUNS)
def test_a_run_records_the_same_trace_in_a_second_process(model: str, mode: str,
                                                          second_process: dict[str, Any]) -> None:
    here = record_run(model, mode)
    there = second_process[f"{model} {mode}"]
    assert here == there, first_difference(here, there)


def test_a_split_nonreentrant_run_has_its_own_session_shown_by_a_local_name() -> None:
    from ckpt_viz.run.harness import RunSession

    one, other = RunSession("step"), RunSession("step")
    assert one == one and one != other and len({one, other}) == 2  # two runs never share a session
    trace = run_scenario(build_builtin("mlp"), "split-nonreentrant")
    assert {e.session_id for e in trace.events if e.session_id is not None} == {"step"}
    assert trace.count("session_activated") >= 1


def _on_threads(jobs: list[Any]) -> list[Any]:
    """Run every job at once, one thread each; return their results (or what they raised)."""
    start = threading.Barrier(len(jobs))
    results: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            start.wait()
            results[i] = jobs[i]()
        except BaseException as exc:  # reported by the caller, with the job it came from
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a run did not finish"
    return results


def test_runs_on_threads_beside_a_dropout_run_give_the_solo_gradients() -> None:
    """torch's generator is one per process: see NOTE [ One generator per process ] in run/rng.py."""
    picks = ["dropout", "mlp", "dropout", "closure", "dropout", "transformer", "dropout", "excluded"]

    def digest(model: str) -> str:
        return run_scenario(build_builtin(model), "reentrant").meta["grad_sha256"]

    solo = {model: digest(model) for model in set(picks)}
    results = _on_threads([lambda model=model: digest(model) for model in picks])
    assert results == [solo[model] for model in picks]


@pytest.mark.parametrize("mode", MODES)
def test_eight_concurrent_runs_on_threads_give_the_solo_traces(mode: str) -> None:
    models = [model for model, m in RUNS if m == mode]
    picks = [models[i % len(models)] for i in range(THREADS)]
    solo = {model: record_run(model, mode) for model in set(picks)}
    results = _on_threads([lambda model=model: record_run(model, mode) for model in picks])
    for i, result in enumerate(results):
        assert not isinstance(result, BaseException), f"thread {i} ({picks[i]} {mode}) raised {result!r}"
        want = solo[picks[i]]
        if result["meta"]["memory_probe"] == "dispatch":
            # torch's profiler is one thread's (probe/stream.py NOTE rule 1): the other threads read memory with
            # the dispatch tracker, which reads the same at every event and sampling point but keeps no
            # high-water mark between them, so its samples are the solo run's without those
            assert _subsequence(result["memory"], want["memory"]), f"thread {i} ({picks[i]} {mode})"
            assert [_at(result["memory"], e["seq"]) for e in want["events"]] == [
                _at(want["memory"], e["seq"]) for e in want["events"]], f"thread {i} ({picks[i]} {mode})"
            result = {**result, "memory": want["memory"], "meta": {**result["meta"], "memory_probe": "allocator"}}
        assert result == want, f"thread {i} ({picks[i]} {mode}): {first_difference(want, result)}"


def _subsequence(part: list[Any], whole: list[Any]) -> bool:
    rest = iter(whole)
    return all(item in rest for item in part)


def _at(memory: list[Any], seq: int) -> Any:
    """The reading right after event `seq`: the first sample of that seq, else the last one before."""
    before = [m for m in memory if m[0] <= seq]
    return next((m[1:] for m in before if m[0] == seq), before[-1][1:] if before else None)


if __name__ == "__main__":  # the second process of `second_process`
    print(json.dumps({f"{model} {mode}": record_run(model, mode) for model, mode in RUNS}))
