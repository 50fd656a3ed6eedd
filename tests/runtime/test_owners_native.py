"""The C twins of the captured-parameter check (ckpt_viz/csrc/ownersfast.c) against owners.py's Python, and whole
recordings made with the C bus and owners against the same recordings made with the Python only.

NOTE [ Captured report cache ], rule 3, in ckpt_viz/runtime/owners.py; NOTE [ Cost with nobody listening ], rule 6,
in ckpt_viz/bus.py.
"""
from __future__ import annotations

import gc
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

import ckpt_viz
from ckpt_viz import bus
from ckpt_viz.runtime import checkpoint, owners, reentrant_checkpoint_scope

native = owners._native
pytestmark = pytest.mark.skipif(native is None, reason="no C compiler here: the Python is the only path")


def _python_current(module: nn.Module) -> bool:
    entry = owners._CACHE.get(id(module))
    return entry is not None and entry[0]() is module and entry[1].current(module)


def test_current_facts_agrees_with_the_signature_check() -> None:
    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.GELU())
    edits = [
        lambda: None,
        lambda: setattr(block[0], "weight", nn.Parameter(torch.randn(4, 4))),
        lambda: delattr(block[0], "bias"),
        lambda: block[0].register_parameter("bias", nn.Parameter(torch.zeros(4))),
        lambda: block.__setitem__(2, nn.Linear(4, 4)),
        lambda: block.append(nn.Linear(4, 2)),
        lambda: block[1].register_buffer("extra", torch.zeros(1)),
        lambda: block[1]._parameters.__setitem__("weight", nn.Parameter(torch.ones(4))),
        lambda: setattr(block[0], "_parameters", _NotADict(block[0]._parameters)),  # Python decides: odd tree
    ]
    for edit in edits:
        found = owners.facts(block)  # cached (or rebuilt) now
        assert native.current_facts(owners._CACHE[id(block)], block) is found
        edit()
        entry = owners._CACHE[id(block)]
        try:
            expected = _python_current(block)
        except (AttributeError, TypeError):
            expected = False
        assert (native.current_facts(entry, block) is entry[1]) is expected
        assert [id(p) for p in owners.facts(block).params] == [id(p) for p in block.parameters()]
    other = nn.Linear(2, 2)
    assert native.current_facts(owners._CACHE[id(block)], other) is None  # another module: never its facts
    assert native.current_facts(("not", "an entry"), block) is None and native.current_facts((), block) is None


class _NotADict(dict):
    pass


def _params() -> list[torch.Tensor]:
    a, b, c = (nn.Parameter(torch.randn(3)) for _ in range(3))
    c.requires_grad_(False)
    a.grad = torch.ones(3)
    return [a, b, c, torch.zeros(2)]


def _same(x: tuple, y: tuple) -> bool:
    return len(x) == len(y) and all(len(p) == len(q) and all(u is v or u == v for u, v in zip(p, q))
                                    for p, q in zip(x, y))


def test_grad_states_is_python_s() -> None:
    params = _params()
    for given in (params, tuple(params), iter(params), [], params[2:]):
        listed = list(given) if not isinstance(given, list | tuple) else given
        assert _same(native.grad_states(listed), owners._grad_states(listed))
    with pytest.raises(AttributeError):
        native.grad_states([object()])
    with pytest.raises(AttributeError):
        owners._grad_states([object()])


def test_report_key_is_python_s_for_every_change_of_grad() -> None:
    a, b, c, d = (nn.Parameter(torch.randn(2, 3)) for _ in range(4))
    b.grad, c.grad, d.grad = torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3)
    before = owners._grad_states([a, b, c, d])
    a.grad = torch.ones(2, 3)  # a new .grad
    b.grad.add_(1)  # the old one written in place: its version moved
    d.grad = None  # gone
    named = SimpleNamespace(names={id(a): "a", id(c): "c"})
    inner = SimpleNamespace(names={id(a): "inner_a", id(b): None})
    for channels in ((), (SimpleNamespace(names={}),), (named,), (named, inner), (inner, named)):
        key = native.report_key(before, channels)
        assert key is not None and key == owners._report_key(before, channels)
        assert key[2] == (True, True, False, False)
    odd = SimpleNamespace(names=_NotADict({id(a): "a"}))
    assert native.report_key(before, (odd,)) is None  # Python decides
    assert owners._report_key(before, (odd,))[1] == ("a", None, None, None)
    assert native.report_key((before[0], before[1]), ()) is None


def test_captured_states_is_grad_states_of_the_owner_s_facts() -> None:
    block = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    block[0].weight.grad = torch.ones(4, 4)
    assert owners.captured_states(block) is None  # not cached yet: Python looks
    owners.facts(block)
    expected = owners._grad_states(owners.facts(block).params)
    assert _same(owners.captured_states(block), expected)
    assert _same(owners.captured_states(block.forward), expected)  # a bound method: its module
    assert owners.captured_states(lambda x: x) is None
    assert owners.captured_states(torch.relu) is None
    block.append(nn.Linear(4, 4))  # the tree changed: Python rebuilds
    assert owners.captured_states(block) is None


def test_the_c_checks_hold_no_stray_references() -> None:
    block = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    block[0].weight.grad = torch.ones(4, 4)
    owners.facts(block)
    channels = (SimpleNamespace(names={id(block[0].weight): "w"}),)
    watched = [block, block[0].weight, block[0].weight.grad, owners._CACHE[id(block)]]
    for _ in range(3):
        native.report_key(owners.captured_states(block), channels)
    gc.collect()
    counts = [sys.getrefcount(o) for o in watched]
    for _ in range(300):
        before = owners.captured_states(block)
        native.report_key(before, channels)
        native.current_facts(owners._CACHE[id(block)], block)
        native.grad_states(owners.facts(block).params)
    del before
    gc.collect()
    assert [sys.getrefcount(o) for o in watched] == counts


# ---------------------------------------------------------------- whole recordings, C against Python

def _python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    bus.use_native(False)
    monkeypatch.setattr(owners, "_native", None)
    monkeypatch.setattr(owners, "grad_states", owners._grad_states)
    monkeypatch.setattr(owners, "captured_states", owners._no_states)


def _step(split: bool) -> list[tuple]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(3)])
    x = torch.randn(4, 8, requires_grad=True)
    with ckpt_viz.record(model=model) as rec:
        if split:
            with reentrant_checkpoint_scope(list(model.parameters())) as handles:
                h = x
                for block in model:
                    h = checkpoint(block, h, use_reentrant=True)
            for handle in handles:
                handle.set_phase("dx")
            torch.autograd.backward(h.sum(), inputs=[x], retain_graph=True)
            for handle in handles:
                handle.set_phase("dw")
            torch.autograd.backward(h.sum(), inputs=[*model.parameters(), *(hd.backward_trigger for hd in handles)])
        else:
            h = x
            for block in model:
                h = checkpoint(block, h, use_reentrant=True)
            h.sum().backward()
        del h
        gc.collect()
    grads = [p.grad.clone() for p in model.parameters()]
    events = [(e.seq, e.kind, e.handle_id, e.mode, e.phase, e.session_id, e.tags, e.site, e.data)
              for e in rec.trace.events]
    return [*events, ("grads", [g.tolist() for g in grads])]


@pytest.mark.parametrize("split", [False, True], ids=["ordinary", "split"])
def test_a_recording_is_the_same_with_and_without_c(monkeypatch: pytest.MonkeyPatch, split: bool) -> None:
    assert bus.use_native(True)
    with_c = _step(split)
    with monkeypatch.context() as patch:
        _python_only(patch)
        python = _step(split)
    bus.use_native(True)
    assert with_c == python
    kinds = [e[1] for e in with_c[:-1]]
    assert "grads_routed" in kinds and "node_collected" in kinds and "released" in kinds
    captured = [e[8]["captured"] for e in with_c[:-1] if e[1] == "grads_routed" and "captured" in e[8]]
    assert captured and all(c["name"] and c["accumulated"] for report in captured for c in report)


def _debug_story(monkeypatch: pytest.MonkeyPatch | None) -> str:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    x = torch.randn(2, 4, requires_grad=True)
    with ckpt_viz.record():
        out = checkpoint(block, x, use_reentrant=True, debug=True)
        frame = next(h for h in _live_handles() if getattr(h, "_debug_story", None) is not None)
        out.sum().backward()
        story = frame._debug_story
    return str([(line[1], line[2], line[3]) for line in story.head])


def _live_handles() -> list[Any]:
    from ckpt_viz.runtime.handle_ids import _LIVE

    return list(_LIVE)


def test_a_debug_story_is_the_same_with_and_without_c(monkeypatch: pytest.MonkeyPatch) -> None:
    assert bus.use_native(True)
    with_c = _debug_story(None)
    with monkeypatch.context() as patch:
        _python_only(patch)
        python = _debug_story(patch)
    bus.use_native(True)
    assert with_c == python
    assert "forward_started" in with_c and "replay_finished" in with_c and "released" in with_c


@pytest.mark.parametrize("use_c", [True, False], ids=["c", "python"])
def test_a_recorded_backward_accumulates_grads_in_place_as_unrecorded(monkeypatch: pytest.MonkeyPatch,
                                                                       use_c: bool) -> None:
    """The captured check reads each .grad before and after the backward: the grads stay the same tensors, summed in
    place, and the report says both parameters accumulated."""
    if not use_c:
        _python_only(monkeypatch)
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    x = torch.randn(4, 8, requires_grad=True)
    checkpoint(block, x, use_reentrant=True).sum().backward()
    grads = [p.grad for p in block.parameters()]
    expected = [g.clone() * 2 for g in grads]
    with ckpt_viz.record() as rec:
        checkpoint(block, x, use_reentrant=True).sum().backward()
    bus.use_native(True)
    assert all(p.grad is g for p, g in zip(block.parameters(), grads))  # written in place, as unrecorded
    assert all(torch.equal(p.grad, e) for p, e in zip(block.parameters(), expected))
    (routed,) = rec.trace.of_kind("grads_routed")
    assert [c["accumulated"] for c in routed.data["captured"]] == [True, True]
