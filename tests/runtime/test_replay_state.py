"""What a replay sees and leaves behind on the CPU-only path, and the hot path's bookkeeping.

The CPU-only replay saves and restores the RNG state by hand and enters `autocast` only
when it would change the CPU's settings (NOTE [ What a replay must see ] in
runtime/state.py); handles are tracked by plain weak references (runtime/handle_ids.py);
a backward's call site is found once per graph task (runtime/reentrant.py).
"""
from __future__ import annotations

import gc

import pytest
import torch

import ckpt_viz
from ckpt_viz.runtime import checkpoint, handle_ids

MODES = [True, False]


def _seen(log: list[tuple[bool, torch.dtype]]):
    def region(x: torch.Tensor) -> torch.Tensor:
        log.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return torch.tanh(x @ x.T)
    return region


@pytest.mark.parametrize("reentrant", MODES, ids=["reentrant", "nonreentrant"])
def test_a_replay_under_an_ambient_autocast_runs_with_the_forwards_settings(reentrant: bool) -> None:
    log: list[tuple[bool, torch.dtype]] = []
    x = torch.randn(4, 4, requires_grad=True)
    y = checkpoint(_seen(log), x, use_reentrant=reentrant)
    before = torch.get_autocast_dtype("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y.sum().backward()
        assert torch.is_autocast_enabled("cpu")  # the ambient settings are back after the replay
    assert log == [(False, before), (False, before)]  # forward, then a replay with the forward's settings
    ref = x.detach().clone().requires_grad_()
    loss = torch.tanh(ref @ ref.T).sum()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the backward's own ops run under it in both
        loss.backward()
    assert torch.equal(x.grad, ref.grad)


@pytest.mark.parametrize("reentrant", MODES, ids=["reentrant", "nonreentrant"])
def test_a_replay_leaves_the_callers_rng_stream_untouched(reentrant: bool) -> None:
    def noisy(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, 0.5, training=True) * 3

    x = torch.randn(6, 6, requires_grad=True)
    torch.manual_seed(7)
    want = noisy(x)
    want.sum().backward()
    want_grad, x.grad = x.grad, None
    torch.manual_seed(7)
    y = checkpoint(noisy, x, use_reentrant=reentrant)
    after_forward = torch.get_rng_state()
    y.sum().backward()  # the replay draws the forward's mask again, then restores the caller's state
    assert torch.equal(torch.get_rng_state(), after_forward)
    assert torch.equal(y, want) and torch.equal(x.grad, want_grad)


def test_handles_that_die_leave_the_live_set_without_a_callback() -> None:
    live = handle_ids._Live()

    class Owner:
        pass

    kept = [Owner() for _ in range(3)]
    for _ in range(200):  # far past the pruning limit: the references list stays bounded
        live.add(Owner())
    for owner in kept:
        live.add(owner)
    gc.collect()
    assert len(live) == 3 and set(map(id, live)) == set(map(id, kept))
    assert len(live._refs) < 200
    assert [id(o) for o in live.alive()] == [id(o) for o in kept] and len(live._refs) == 3
    del kept, owner
    gc.collect()
    assert live.alive() == [] and len(live) == 0


def test_each_backward_call_gets_its_own_call_site() -> None:
    x = torch.randn(3, 3, requires_grad=True)
    with ckpt_viz.record() as rec:
        a = checkpoint(torch.tanh, x, use_reentrant=True)
        b = checkpoint(torch.sin, x, use_reentrant=True)
        a.sum().backward()  # first backward call
        b.sum().backward()  # second backward call
    sites = [e.site for e in rec.trace.events if e.kind in ("backward_entered", "released")]
    assert len(sites) == 4 and sites[0] == sites[1] != sites[2] == sites[3]
    assert sites[0].endswith(f":{_line_of('# first backward call')}")
    assert sites[2].endswith(f":{_line_of('# second backward call')}")


def _line_of(marker: str) -> int:
    with open(__file__) as source:
        return next(i for i, line in enumerate(source, 1) if line.rstrip().endswith(marker) and "_line_of" not in line)
