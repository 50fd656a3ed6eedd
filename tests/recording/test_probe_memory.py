"""Memory by category: exact against a ground-truth tracker, on every built-in model in every mode.

The ground truth is an independent TorchDispatchMode that sees every storage an op
touches (and the RNG states `torch.get_rng_state` makes outside any op) and forgets it
when its finalizer runs; the probe `record(memory=True)` uses must attribute every live
byte to exactly one category (at most 1% off at every event).
"""
from __future__ import annotations

import bisect
import weakref
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ckpt_viz import bus
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import BUILTIN_MODELS, build_builtin

MODES = ["none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant"]


class GroundTruth(TorchDispatchMode):
    """Live bytes of every storage seen by any op or made by `torch.get_rng_state`, keyed by the storage's C
    pointer."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        for t in tensors:
            self._see(t)

    def __enter__(self) -> GroundTruth:
        original = self._rng = torch.random.get_rng_state

        def get_rng_state() -> torch.Tensor:
            state = original()
            self._see(state)
            return state

        torch.get_rng_state = torch.random.get_rng_state = get_rng_state
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.get_rng_state = torch.random.get_rng_state = self._rng
        super().__exit__(*exc)

    def _see(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self.live:
            self.live[key] = storage.nbytes()
            weakref.finalize(storage, self.live.pop, key, None)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor):
                self._see(t)
        return out

    def total(self) -> int:
        return sum(self.live.values())


def _run_with_ground_truth(model_name: str, mode: str, **options: Any) -> tuple[Any, dict[int, int]]:
    spec = build_builtin(model_name)
    inputs = [t for t in spec.inputs if isinstance(t, torch.Tensor)]
    existing = [*spec.model.parameters(), *spec.model.buffers(), *inputs]
    truth = GroundTruth(existing)
    per_event: dict[int, int] = {}

    def listen(event: Any) -> None:
        per_event[event.seq] = truth.total()

    with truth:
        # A channel around the run's own recording: it numbers the same events from 0 as the recording does,
        # and only this thread's (bus NOTE [ Recording scopes ]).
        channel = bus.open_channel(listen)
        try:
            trace = run_scenario(spec, mode, memory=True, **options)
        finally:
            channel.close()
    return trace, per_event


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_name", sorted(BUILTIN_MODELS))
def test_categories_add_up_to_ground_truth_at_every_event(model_name: str, mode: str) -> None:
    trace, truth = _run_with_ground_truth(model_name, mode)
    assert trace.memory and len(trace.events) > 0
    for event in trace.events:  # memory is stored as steps: the reading at an event is the last sample at or before it
        sample = reading_at(trace, event.seq)
        expected = truth[event.seq]
        got = sum(sample.bytes_by_category.values())
        assert abs(got - expected) <= 0.01 * expected, (
            f"{model_name}/{mode} event {event.seq}: categories sum to {got} B, ground truth {expected} B")


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B", "ZB-H1"])
def test_pipeline_runs_add_up_to_ground_truth_at_every_event(schedule: str) -> None:
    trace, truth = _run_with_ground_truth("pipeline", "pipeline", schedule=schedule, microbatches=4)
    assert trace.meta["schedule"] == schedule
    for event in trace.events:
        sample = reading_at(trace, event.seq)
        expected = truth[event.seq]
        assert abs(sum(sample.bytes_by_category.values()) - expected) <= 0.01 * expected, (schedule, event.seq)
        # per-stage bytes never exceed the total
        assert sum(sum(row.values()) for row in sample.by_stage.values()) <= sum(sample.bytes_by_category.values())


@pytest.mark.gpu
def test_cuda_runs_record_the_allocator_figure() -> None:
    """On CUDA every sample also carries torch.cuda.memory_allocated() (skipped without a GPU)."""
    spec = build_builtin("mlp")
    spec.model.cuda()
    spec.inputs = tuple(t.cuda() for t in spec.inputs)
    trace = run_scenario(spec, "split-reentrant", memory=True)
    assert trace.memory and all(s.device_allocated is not None for s in trace.memory)
    assert max(s.device_allocated for s in trace.memory) >= sum(
        p.numel() * p.element_size() for p in spec.model.parameters())


def reading_at(trace: Any, seq: int) -> Any:
    """The reading right after event `seq`: the first sample with that seq (points and high-water marks after the
    event share it), else the last sample before it (memory is a step function)."""
    seqs = [s.seq for s in trace.memory]
    first = bisect.bisect_left(seqs, seq)
    if first < len(seqs) and seqs[first] == seq:
        return trace.memory[first]
    return trace.memory[first - 1]


def test_checkpointing_holds_fewer_activation_bytes_than_no_checkpoint() -> None:
    # 1. No checkpoint: every block's activations are saved for backward.
    plain, _ = _run_with_ground_truth("mlp", "none")
    # 2. Reentrant: only each block's input is kept (checkpoint_inputs).
    ckpt, _ = _run_with_ground_truth("mlp", "reentrant")
    end_plain = plain.memory[-1].bytes_by_category  # recorded with memory on: the last sample of the run
    peak_plain = max(s.bytes_by_category["activations"] for s in plain.memory)
    peak_ckpt = max(s.bytes_by_category["activations"] + s.bytes_by_category["checkpoint_inputs"]
                    for s in ckpt.memory if s.seq < ckpt.of_kind("backward_entered")[0].seq)
    assert peak_plain > 0 and end_plain["parameters"] > 0
    assert all(s.bytes_by_category["checkpoint_inputs"] == 0 for s in plain.memory)
    assert 0 < peak_ckpt < peak_plain


def test_split_reentrant_holds_replays_between_dx_and_dw() -> None:
    trace, _ = _run_with_ground_truth("mlp", "split-reentrant")
    last_dx = [e.seq for e in trace.events if e.kind == "grads_routed" and e.phase == "dx"][-1]
    first_dw = next(e.seq for e in trace.events if e.phase == "dw")
    between = [reading_at(trace, e.seq) for e in trace.events if last_dx <= e.seq < first_dw]
    assert between and all(s.bytes_by_category["replay_activations"] > 0 for s in between)
    assert trace.memory[-1].bytes_by_category["replay_activations"] == 0  # DW released every replay
    assert trace.memory[-1].bytes_by_category["gradients"] > 0


def test_excluded_region_output_is_its_own_category() -> None:
    for mode in ("reentrant", "nonreentrant"):
        trace, _ = _run_with_ground_truth("excluded", mode)
        saved = trace.of_kind("exclude_saved")
        assert saved
        assert reading_at(trace, saved[-1].seq).bytes_by_category["excluded_outputs"] > 0, mode
