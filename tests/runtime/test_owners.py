"""The per-module cache of owned parameters and buffers (NOTE [ Owner facts cache ] in runtime/owners.py).

It must always say what `module.parameters()` / `module.buffers()` say now, after any change to the
module tree, and never keep a module alive.
"""
from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

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
    assert routed.data["captured"] == [{"shape": [3, 4], "name": "weight", "accumulated": True},
                                       {"shape": [3], "name": "bias", "accumulated": True}]


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
    assert report == [{"shape": [4, 4], "name": None, "accumulated": True},
                      {"shape": [4], "name": None, "accumulated": True},
                      {"shape": [4], "name": None, "accumulated": False}]
    before = owners.grad_states(params)
    assert owners.captured_report(before) == [dict(r, accumulated=False) for r in report]  # no backward
    lin(x).sum().backward()
    assert owners.captured_report(before) is report  # the same facts: the same list
    lin.weight.grad = None
    before = owners.grad_states(params)
    frozen.data = torch.randn(2)  # a new shape under the same parameter
    lin(x).sum().backward()
    assert [r["shape"] for r in owners.captured_report(before)] == [[4, 4], [4], [2]]


def test_nested_recordings_name_captured_parameters_from_the_innermost_that_knows_them() -> None:
    inner, outer = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    with record(model=outer) as out_rec, record(model=inner) as in_rec:
        checkpoint(inner, x, use_reentrant=True).sum().backward()
        checkpoint(outer, x, use_reentrant=True).sum().backward()
    for rec in (in_rec, out_rec):  # every recording here keeps the same event: inner's name, else outer's
        got = [[c["name"] for c in e.data["captured"]] for e in rec.trace.of_kind("grads_routed")]
        assert got == [["weight", "bias"], ["0.weight", "0.bias"]]
