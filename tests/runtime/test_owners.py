"""The per-module cache of owned parameters and buffers (NOTE [ Owner facts cache ] in runtime/owners.py).

It must always say what `module.parameters()` / `module.buffers()` say now, after any change to the
module tree, and never keep a module alive.
"""
from __future__ import annotations

import gc
import weakref

import msgspec
import torch
from torch import nn

from ckpt_viz.events import CapturedParam
from ckpt_viz.recording import record
from ckpt_viz.runtime import checkpoint, owners


def _same(module: nn.Module) -> bool:
    found = owners.facts(module)
    return ([id(p) for p in found.params] == [id(p) for p in module.parameters()]
            and [id(b) for b in found.buffers] == [id(b) for b in module.buffers()])


def test_the_cache_follows_every_change_to_the_module_tree() -> None:
    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.GELU())
    assert _same(block) and owners.facts(block) is owners.facts(block)  # cached while nothing changed
    block[0].weight = nn.Parameter(torch.randn(4, 4))  # replaced
    assert _same(block)
    del block[0].bias  # deleted
    assert _same(block)
    block[0].register_parameter("bias", nn.Parameter(torch.zeros(4)))  # added back
    assert _same(block)
    block[2] = nn.Linear(4, 4)  # a submodule replaced
    assert _same(block)
    block.append(nn.Linear(4, 2))  # a submodule added
    assert _same(block)
    block[1].register_buffer("extra", torch.zeros(1))  # a buffer added deeper down
    assert _same(block)
    block[1]._parameters["weight"] = nn.Parameter(torch.ones(4))  # written into the dict directly
    assert _same(block)
    shared = nn.Linear(4, 4)
    tied = nn.Sequential(shared, shared)  # a shared submodule counts once, as in parameters()
    assert _same(tied)


def test_requires_grad_is_read_at_each_use() -> None:
    lin = nn.Linear(4, 4)
    assert owners.owned_parameters(lin) == [lin.weight, lin.bias]
    lin.bias.requires_grad_(False)
    assert owners.owned_parameters(lin) == [lin.weight]
    assert owners.owned_parameters(lin, {id(lin.weight)}) == []


def test_the_cache_keeps_no_module_alive() -> None:
    block = nn.Sequential(nn.Linear(4, 4))
    owners.facts(block)
    ref = weakref.ref(block)
    del block
    gc.collect()
    assert ref() is None


def test_the_captured_report_names_the_parameters_the_module_has_now() -> None:
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    with record(model=lin):
        checkpoint(lin, x, use_reentrant=True).sum().backward()
    lin.weight = nn.Parameter(torch.randn(3, 4))  # a new, smaller layer under the same name
    lin.out_features = 3
    lin.bias = nn.Parameter(torch.randn(3))
    with record(model=lin) as rec:
        checkpoint(lin, x, use_reentrant=True).sum().backward()
    (routed,) = rec.trace.of_kind("grads_routed")
    assert routed.captured == (CapturedParam(shape=(3, 4), name="weight", accumulated=True),
                               CapturedParam(shape=(3,), name="bias", accumulated=True))


def test_the_captured_report_says_which_parameters_the_backward_reached_and_is_shared_when_equal() -> None:
    # NOTE [ Captured report cache ]: read at every backward, kept per (shapes, names, accumulated).
    lin = nn.Linear(4, 4)
    frozen = nn.Parameter(torch.randn(4))  # captured by closure below, never reached by the replay
    x = torch.randn(2, 4, requires_grad=True)
    params = [lin.weight, lin.bias, frozen]
    lin.bias.grad = torch.zeros(4)  # an old .grad the backward writes into in place
    frozen.grad = torch.ones(4)  # an old .grad nobody touches
    before = owners.grad_states(params)
    lin(x).sum().backward()
    report = owners.captured_report(before)
    assert report == (CapturedParam(shape=(4, 4), name=None, accumulated=True),
                      CapturedParam(shape=(4,), name=None, accumulated=True),
                      CapturedParam(shape=(4,), name=None, accumulated=False))
    before = owners.grad_states(params)
    assert owners.captured_report(before) == tuple(msgspec.structs.replace(r, accumulated=False)
                                                   for r in report)  # no backward
    lin(x).sum().backward()
    assert owners.captured_report(before) is report  # the same facts: the same report
    lin.weight.grad = None
    before = owners.grad_states(params)
    frozen.data = torch.randn(2)  # a new shape under the same parameter
    lin(x).sum().backward()
    assert [r.shape for r in owners.captured_report(before)] == [(4, 4), (4,), (2,)]


def test_nested_recordings_name_captured_parameters_from_the_innermost_that_knows_them() -> None:
    inner, outer = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    with record(model=outer) as out_rec, record(model=inner) as in_rec:
        checkpoint(inner, x, use_reentrant=True).sum().backward()
        checkpoint(outer, x, use_reentrant=True).sum().backward()
    for rec in (in_rec, out_rec):  # every recording here keeps the same event: inner's name, else outer's
        got = [[c.name for c in e.captured] for e in rec.trace.of_kind("grads_routed")]
        assert got == [["weight", "bias"], ["0.weight", "0.bias"]]


# ---------------------------------------------------------------- whole recordings (once the C twins' tests)

def _step(split: bool) -> tuple[list, list]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(3)])
    x = torch.randn(4, 8, requires_grad=True)
    with record(model=model) as rec:
        if split:
            from ckpt_viz.runtime import reentrant_checkpoint_scope

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
    return rec.trace.events, [p.grad.clone() for p in model.parameters()]


def test_a_recorded_step_reports_every_captured_parameter_by_name_and_matches_the_unrecorded_grads() -> None:
    for split in (False, True):
        events, grads = _step(split)
        kinds = [e.kind for e in events]
        assert "grads_routed" in kinds and "node_collected" in kinds and "released" in kinds
        reports = [e.captured for e in events if e.kind == "grads_routed" and e.captured]
        assert reports and all(c.name and c.accumulated for report in reports for c in report)
        names = {c.name for report in reports for c in report}
        assert names == {f"{i}.0.{p}" for i in range(3) for p in ("weight", "bias")}
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(3)])
        x = torch.randn(4, 8, requires_grad=True)
        model(x).sum().backward()
        assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


def test_a_debug_handle_keeps_the_story_of_its_events() -> None:
    from ckpt_viz.runtime.handle_ids import _LIVE

    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    x = torch.randn(2, 4, requires_grad=True)
    with record() as rec:
        out = checkpoint(block, x, use_reentrant=True, debug=True)
        frame = next(h for h in list(_LIVE) if getattr(h, "_story", None) is not None)
        out.sum().backward()
        story = frame._story
    told = [(line[0], line[1]) for line in (*story.head, *story.tail)]
    assert told == [(e.seq, e.kind) for e in rec.trace.events if e.handle_id == frame.handle_id]
    assert {"forward_started", "replay_finished", "released"} <= {kind for _, kind in told}


def test_a_recorded_backward_accumulates_grads_in_place_as_unrecorded() -> None:
    """The captured check reads each .grad before and after the backward: the grads stay the same tensors, summed in
    place, and the report says both parameters accumulated."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    x = torch.randn(4, 8, requires_grad=True)
    checkpoint(block, x, use_reentrant=True).sum().backward()
    grads = [p.grad for p in block.parameters()]
    expected = [g.clone() * 2 for g in grads]
    with record() as rec:
        checkpoint(block, x, use_reentrant=True).sum().backward()
    assert all(p.grad is g for p, g in zip(block.parameters(), grads))  # written in place, as unrecorded
    assert all(torch.equal(p.grad, e) for p, e in zip(block.parameters(), expected))
    (routed,) = rec.trace.of_kind("grads_routed")
    assert [c.accumulated for c in routed.captured] == [True, True]
