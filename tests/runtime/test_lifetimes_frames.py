"""Lifetimes: no checkpoint object of ours outlives the graph that needs it.

A user who leaves ckpt_viz on while training drops each step's loss and outputs; every
frame, handle, cache entry, tape and session activation of that step must then be
collectable (`gc.collect()` after the `del`). A reference cycle that runs through
autograd's C++ graph (a saved tensor's hooks, a custom Function's ctx) is invisible to
Python's collector and would keep the whole step alive forever.

The two cycles this file first caught (both with an excluded region, both fixed):
1. non-reentrant: frame -> recompute state -> invocation resources -> the excluded
   region's cached output -> its autograd graph -> a saved tensor's hooks -> frame
   (alive whenever the frame's replay never ran: graph dropped, backward raised first);
2. reentrant: handle -> replay graph -> the excluded region's bridge node (ctx) ->
   handle (alive when a replayed handle is never released: DX only, prefire only).

Each case is run for every mode (reentrant, non-reentrant, split DX/DW, sessions with
prefire), ending (backward, a partial or failed backward, no backward), with and
without excluded regions (one region; a save_output=False region feeding another),
recorded or not.
"""
from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterator

import pytest
import torch

import ckpt_viz
from ckpt_viz import bus
from ckpt_viz.runtime import (
    ReentrantCheckpointHandle,
    backward_input,
    backward_weight,
    checkpoint,
    checkpoint_exclude_wrapper,
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
from models import leaf

TRACKED = (
    nonreentrant.NonReentrantFrame, nonreentrant._Holder, ReentrantCheckpointHandle, SessionActivation,
    ExcludeCache, exclude_nonreentrant._NonReentrantEntry, exclude_reentrant._Tape, recompute_state._Invocation,
    ExecutionState, ReplayWatch, bus.Channel, bus.Scope,
)

ENDINGS = {
    "nonreentrant": ("backward", "backward_raises", "no_backward"),
    "reentrant": ("backward", "backward_raises", "no_backward"),
    "split-nonreentrant": ("backward", "dx_only", "no_backward"),
    "split-reentrant": ("backward", "dx_only", "no_backward"),
    "prefire-nonreentrant": ("backward", "backward_no_clear", "no_backward"),
    "prefire-reentrant": ("backward", "backward_no_clear", "no_backward"),
}
CASES = [(kind, ending) for kind, endings in ENDINGS.items() for ending in endings]


_TRACKED_TYPES = frozenset(TRACKED)


@pytest.fixture(autouse=True, scope="module")
def _frozen_heap() -> Iterator[None]:
    """Move what exists now out of the collector's sight, so each check scans only what the tests made (fast)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def _tracked() -> dict[int, object]:
    gc.collect()
    return {id(o): o for o in gc.get_objects() if type(o) in _TRACKED_TYPES}


def _survivors(run: Callable[[], None]) -> list[str]:
    """Type names of the tracked objects `run()` created that are still alive after it returned."""
    before = _tracked()
    run()
    after = _tracked()
    return sorted(type(o).__name__ for i, o in after.items() if i not in before)


def _region(exclusion: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if exclusion == "none":
        return lambda t: t * 2.0 - 0.5
    if exclusion == "region":
        return checkpoint_exclude_wrapper(lambda t: t * 2.0 - 0.5)
    first = checkpoint_exclude_wrapper(lambda t: t * 2.0 - 0.5, save_output=False)  # feeds the next region only
    second = checkpoint_exclude_wrapper(lambda t: t * 3.0 + 1)
    return lambda t: second(first(t))


def _step(kind: str, ending: str, exclusion: str, recorded: bool) -> None:
    """One training step in `kind`, ended by `ending`; everything it made is dropped when it returns."""
    x, w1, w2 = leaf((3, 4), seed=1), leaf((4, 5), seed=2), leaf((5, 3), seed=3)
    region = _region(exclusion)
    reentrant = kind.endswith("-reentrant") or kind == "reentrant"
    replays = [0]

    def block(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        replays[0] += 1
        if ending == "backward_raises" and replays[0] > 2:  # both forwards ran; the first replay fails
            raise RuntimeError("replay failed")
        return torch.sin(region(torch.tanh(a @ w)))

    def forward() -> torch.Tensor:
        return checkpoint(block, checkpoint(block, x, w1, use_reentrant=reentrant), w2, use_reentrant=reentrant)

    with ckpt_viz.record() if recorded else contextlib.nullcontext():
        if kind.startswith("split"):
            with (reentrant_checkpoint_scope([w1, w2]) if reentrant else recompute_handle_collector_ctx()) as handles:
                loss = forward().sum()
            if ending != "no_backward":
                backward_input(loss, None, [x], handles=handles, session_id="s")
            if ending == "backward":
                backward_weight(loss, None, [w1, w2], handles=handles, session_id="s")
        elif kind.startswith("prefire"):
            with recompute_handle_collector_ctx() as handles:
                loss = forward().sum()
            for handle in handles:
                recompute_handle(handle, "p")
            if ending != "no_backward":
                with recompute_session_ctx("p"):
                    loss.backward()
            if ending == "backward":
                clear_recompute_session("p")
        else:
            loss = forward().sum()
            if ending == "backward":
                loss.backward()
            elif ending == "backward_raises":
                with pytest.raises(RuntimeError, match="replay failed"):
                    loss.backward()


@pytest.mark.parametrize("recorded", [False, True], ids=["plain", "recorded"])
@pytest.mark.parametrize("exclusion", ["none", "region", "chain"])
@pytest.mark.parametrize(("kind", "ending"), CASES)
def test_nothing_of_a_step_survives_it(kind: str, ending: str, exclusion: str, recorded: bool) -> None:
    assert _survivors(lambda: _step(kind, ending, exclusion, recorded)) == []


def test_the_step_really_made_the_tracked_objects() -> None:
    """Control for the test above: while the step's graph lives, its frames, cache and activation are alive."""
    kept: list = []

    def step() -> None:
        x, w = leaf((3, 4), seed=1), leaf((4, 5), seed=2)
        region = checkpoint_exclude_wrapper(lambda t: t * 2.0)
        with recompute_handle_collector_ctx() as handles:
            y = checkpoint(lambda a: torch.sin(region(a @ w)), x, use_reentrant=False)
        kept.extend([y, handles])

    names = _survivors(step)
    assert {"NonReentrantFrame", "ExcludeCache", "_NonReentrantEntry", "_Holder"} <= set(names)
    kept.clear()
    gc.collect()


@pytest.mark.parametrize("mode", ["nonreentrant", "reentrant"])
def test_a_frame_whose_graph_is_dropped_dies_with_it(mode: str) -> None:
    """The case the last round found (test_exclude's chain, output never backwarded): a finalizer on the frame."""
    collector_of: list = []

    def forward() -> None:
        w = leaf((4, 4), seed=8)
        first = checkpoint_exclude_wrapper(lambda t: t * 2.0 - 0.5, save_output=False)
        second = checkpoint_exclude_wrapper(lambda t: t * 3.0 + 1)
        with recompute_handle_collector_ctx() as handles:
            checkpoint(lambda a: torch.sin(second(first(torch.tanh(a @ w)))), leaf((3, 4), seed=9),
                       use_reentrant=mode == "reentrant")
        collector_of.extend(weakref.finalize(h, lambda: None) for h in handles)

    forward()
    gc.collect()
    assert len(collector_of) == 1 and not collector_of[0].alive, "the frame outlived its dropped graph"


def test_a_live_graph_keeps_its_frame_and_replays_after_the_collect() -> None:
    """The fix must not cut what the graph needs: a kept output still replays its excluded region's cache."""
    w = leaf((4, 4), seed=8)
    region = checkpoint_exclude_wrapper(lambda t: t * 2.0 - 0.5)
    x = leaf((3, 4), seed=9)
    torch.sin(region(torch.tanh(x @ w))).sum().backward()
    want = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    y = checkpoint(lambda a: torch.sin(region(torch.tanh(a @ w))), x, use_reentrant=False)
    gc.collect()
    y.sum().backward()
    assert torch.equal(x.grad, want[0]) and torch.equal(w.grad, want[1])


def test_the_replay_may_change_an_excluded_output_in_place_as_the_forward_did() -> None:
    """The cache keeps the output without its graph (a leaf); the replay hands out a non-leaf again."""
    w, x = leaf((4, 4), seed=8), leaf((3, 4), seed=9)
    region = checkpoint_exclude_wrapper(lambda t: t * 2.0 - 0.5)

    def body(a: torch.Tensor) -> torch.Tensor:
        h = region(torch.tanh(a @ w))
        h.mul_(1.0)  # in place on the region's output, in the forward and in the replay
        return torch.sin(h)

    body(x).sum().backward()
    want = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    checkpoint(body, x, use_reentrant=False).sum().backward()
    assert torch.equal(x.grad, want[0]) and torch.equal(w.grad, want[1])
