"""Lifetimes, the way the app and the CLI drive the runtime: nothing of a run outlives it.

`tests/runtime/test_lifetimes_frames.py` builds its steps by hand; this file runs the
real ones (`ckpt_viz.run.scenarios.run_scenario` on every built-in model in every mode,
the pipeline's sessions with prefire included, and every broken scenario of
`ckpt_viz.run.broken`, whose steps end in an error) and keeps what a user keeps: the
returned trace. After `gc.collect()` no frame, holder, handle, session activation,
excluded-region cache or tape, invocation, execution state, replay watch or bus
channel/scope made by the run may survive. Each case also counts the frames and
handles the run made (a run that made none would pass for nothing).

The last tests check a lifetime that was wrong before the typed events (session 9, LEAKr_log.md):
a reentrant handle the user keeps after its `record()` block closed kept that recording's
whole event list alive, through the rows it kept for `release_seq` / `collected_seq`. It
now keeps its `released` event only (a frozen event refers to nothing), so the closed
recording's trace is freed.
"""
from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ckpt_viz
from ckpt_viz import bus
from ckpt_viz.run.blocks import checkpointed
from ckpt_viz.run.broken import broken_scenarios, record_broken
from ckpt_viz.run.harness import RunSession, inputs_requiring_grad
from ckpt_viz.run.scenarios import MODES, run_scenario
from ckpt_viz.run.zoo import BUILTIN_MODELS, build_builtin
from ckpt_viz.runtime import (
    ReentrantCheckpointHandle,
    backward_input,
    checkpoint,
    clear_recompute_session,
    exclude_nonreentrant,
    exclude_reentrant,
    nonreentrant,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
    recompute_state,
    reentrant_checkpoint_scope,
)
from ckpt_viz.runtime.divergence import ReplayWatch
from ckpt_viz.runtime.exclude_common import ExcludeCache
from ckpt_viz.runtime.session import SessionActivation
from ckpt_viz.runtime.state import ExecutionState
from ckpt_viz.trace import Trace
from models import leaf

TRACKED = (
    nonreentrant.NonReentrantFrame, nonreentrant._Holder, ReentrantCheckpointHandle, SessionActivation,
    ExcludeCache, exclude_nonreentrant._NonReentrantEntry, exclude_reentrant._Tape, recompute_state._Invocation,
    ExecutionState, ReplayWatch, bus.Channel, bus.Scope,
)
FRAMES = (nonreentrant.NonReentrantFrame, ReentrantCheckpointHandle)


def _tracked() -> set[int]:
    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, TRACKED)}


def _run_and_count(run: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, int, list[str]]:
    """(what `run()` returned, frames and handles it made, type names of tracked objects it left alive)."""
    made = [0]
    for cls in FRAMES:
        init = cls.__init__

        def counting(self: Any, *args: Any, _init: Callable = init, **kwargs: Any) -> None:
            made[0] += 1
            _init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting)
    before = _tracked()
    kept = run()
    gc.collect()
    left = sorted(type(o).__name__ for o in gc.get_objects() if isinstance(o, TRACKED) and id(o) not in before)
    monkeypatch.undo()
    return kept, made[0], left


def _pairs() -> list[tuple[str, str]]:
    """Every built-in model in every mode it runs in (`pipeline` needs a model with stages)."""
    pairs = []
    for name in BUILTIN_MODELS:
        for mode in MODES:
            if (mode == "pipeline") == (name == "pipeline"):
                pairs.append((name, mode))
    return pairs


@pytest.mark.parametrize(("model", "mode"), _pairs())
def test_a_scenario_leaves_nothing_but_its_trace(model: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = build_builtin(model)
    trace, made, left = _run_and_count(lambda: run_scenario(spec, mode, seed=3), monkeypatch)
    assert (len([e for e in trace.events if e.handle_id is not None]) > 0) == (made > 0)  # (backward_called: none)
    assert (made > 0) == (mode != "none"), f"the {mode} run of {model} made {made} frames/handles"
    assert left == [], f"the {mode} run of {model} left {left} alive (its trace kept, everything else dropped)"


@pytest.mark.parametrize("name", sorted(broken_scenarios()))
def test_a_broken_run_leaves_nothing_but_its_trace(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The error paths: each broken scenario ends in the runtime's error (or a silent misuse) part-way."""
    trace, made, left = _run_and_count(lambda: record_broken(name, seed=1), monkeypatch)
    assert trace.of_kind("handle_created") and made > 0
    assert left == [], f"broken scenario {name!r} left {left} alive"


ENDINGS = {
    "reentrant": ("backward", "backward_raises", "no_backward"),
    "nonreentrant": ("backward", "backward_raises", "no_backward"),
    "split-reentrant": ("dx_only", "dx_raises", "no_backward"),
    "split-nonreentrant": ("dx_only", "dx_raises", "no_backward"),
    "prefire-nonreentrant": ("backward", "prefire_only", "backward_raises"),
}


class _Refused(Exception):
    pass


def _refuse(grad: torch.Tensor) -> None:
    raise _Refused("a hook on the loss refuses the backward before any replay")


def _drive(spec: Any, mode: str, ending: str, recorded: bool) -> None:
    """A zoo model's step the way `run_scenario` drives it, but ended early: what the scenarios never do."""
    model = spec.model
    inputs = inputs_requiring_grad(spec.inputs)
    params = [p for p in model.parameters() if p.requires_grad]
    reentrant = mode == "split-reentrant" or mode == "reentrant"
    session = RunSession("s")
    with ckpt_viz.record() if recorded else contextlib.nullcontext():
        collect = (reentrant_checkpoint_scope(lambda: params) if mode == "split-reentrant"
                   else recompute_handle_collector_ctx())
        with checkpointed(model, spec.checkpoint, use_reentrant=reentrant), collect as handles:
            loss = spec.loss_of(model(*inputs), spec.targets)
        if ending.endswith("raises"):
            loss.register_hook(_refuse)
        try:
            if mode.startswith("split") and ending != "no_backward":
                backward_input(loss, None, list(inputs), handles=handles,
                               session_id=None if reentrant else session)
            elif mode.startswith("prefire"):
                for handle in handles:
                    recompute_handle(handle, session)
                if ending != "prefire_only":
                    with recompute_session_ctx(session):
                        loss.backward()
            elif ending != "no_backward":
                loss.backward()
        except _Refused:
            assert ending.endswith("raises")
        if mode.startswith("prefire") and ending == "backward":
            clear_recompute_session(session)
    for p in params:
        p.grad = None


def _early_cases() -> list[tuple[str, str, str, bool]]:
    cases = [(m, mode, e, False) for m in ("mlp", "excluded") for mode, ends in ENDINGS.items() for e in ends]
    return cases + [("excluded", mode, e, True) for mode, ends in ENDINGS.items() for e in ends]


@pytest.mark.parametrize(("model", "mode", "ending", "recorded"), _early_cases())
def test_a_step_ended_early_leaves_nothing(model: str, mode: str, ending: str, recorded: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Graph dropped without backward, a backward refused by a hook, DX only, prefire only: all collectable."""
    spec = build_builtin(model)
    _, made, left = _run_and_count(lambda: _drive(spec, mode, ending, recorded), monkeypatch)
    assert made > 0
    assert left == [], f"{model} {mode} ended by {ending} left {left} alive"


def test_a_memory_and_graphs_recording_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probes of record(memory=True, graphs=True) hold no frame or handle past the run."""
    spec = build_builtin("excluded")
    trace, made, left = _run_and_count(
        lambda: run_scenario(spec, "split-nonreentrant", memory=True, graphs=True), monkeypatch)
    assert len(trace.memory) > 0 and made > 0
    assert left == []


def _recording_with_kept_handles(steps: int, held: list | None = None) -> tuple[list, weakref.ref[Trace], Any, int]:
    x, w = leaf((8, 16), seed=1), leaf((16, 16), seed=2)
    kept: list = []
    with ckpt_viz.record() as rec:
        for _ in range(steps):
            with recompute_handle_collector_ctx() as handles:
                loss = checkpoint(lambda a: torch.tanh(a @ w) @ w, x, use_reentrant=True).sum()
            loss.backward()
            kept.extend(handles)
    count = len(rec.trace.events)
    alive = weakref.ref(rec.trace), rec.trace.events[0]  # a frozen event refers to nothing: it keeps no list
    if held is not None:
        held.append(rec.trace)
    with ckpt_viz.record():  # ckpt_viz.last_trace() keeps the last closed recording on purpose: not that one
        pass
    return kept, *alive, count


def _alive_event_lists(first: Any, count: int) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is list and len(o) == count and o[0] is first)


def test_dropped_handles_free_their_recordings_events() -> None:
    """Control for the next test: with the handles dropped too, the closed recording's events are freed."""
    held: list = []
    kept, trace, first, count = _recording_with_kept_handles(20, held)
    assert count > 100 and all(h.released for h in kept)
    assert trace() is held[0] and _alive_event_lists(first, count) == 1  # the measure sees a held trace's events
    held.clear()
    kept.clear()
    gc.collect()
    assert trace() is None and _alive_event_lists(first, count) == 0


def test_a_kept_handle_does_not_keep_a_closed_recordings_events() -> None:
    kept, trace, first, count = _recording_with_kept_handles(20)
    assert kept[0].release_seq is not None and kept[0].release_site  # what a handle keeps its event for
    del kept[1:]
    gc.collect()
    assert trace() is None, "a handle kept after record() closed keeps its recording's trace"
    assert _alive_event_lists(first, count) == 0, "... or its recording's events"
    assert kept[0].release_seq < count
