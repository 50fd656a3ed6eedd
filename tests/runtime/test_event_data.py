"""Event fields the runtime may keep per region and reuse between equal events (issue 14's hot path).

`handle_created` (per function, while its calls look the same) must say exactly what a fresh build says, and
change when a call changes.
"""
from __future__ import annotations

import torch
from torch import nn

from ckpt_viz.events import TensorMeta, fields_of
from ckpt_viz.recording import record
from ckpt_viz.runtime import checkpoint


def _created(rec):
    return [fields_of(e) for e in rec.trace.of_kind("handle_created")]


def test_handle_created_data_is_shared_while_the_call_looks_the_same_and_rebuilt_when_it_changes() -> None:
    block = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    with record() as rec:
        for x in (torch.randn(2, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True),
                  torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)):
            checkpoint(block, x, use_reentrant=True).sum().backward()
        checkpoint(block, torch.randn(2, 4, requires_grad=True), use_reentrant=True,
                   preserve_rng_state=False).sum().backward()
    first, second, third, fourth, fifth = _created(rec)
    assert first == second  # the same facts
    assert first == {"split": False, "input_count": 1, "param_input_mask": (False,), "collector": "none",
                     "preserve_rng_state": True, "function": "Sequential", "label": "Sequential",
                     "runtime": "ckpt_viz", "early_stop": None, "determinism_check": None, "via": None,
                     "inputs": (TensorMeta(shape=(2, 4), dtype="float32", device="cpu", requires_grad=True,
                                           nbytes=32),)}
    assert third["inputs"][0].shape == (3, 4) and third["inputs"][0].nbytes == 48
    assert fourth["inputs"][0].requires_grad is False and fifth["preserve_rng_state"] is False
    assert len({repr(d) for d in (first, third, fourth, fifth)}) == 4


def test_handle_created_names_each_function_even_when_an_id_is_reused() -> None:
    x = torch.randn(2, 4, requires_grad=True)
    names = []
    for name in ("first_region", "second_region"):
        def region(t: torch.Tensor) -> torch.Tensor:
            return torch.tanh(t) * 2
        region.__qualname__ = name
        with record() as rec:
            checkpoint(region, x, use_reentrant=True).sum().backward()
        names += [d["function"] for d in _created(rec)]
        del region  # the next function may get the same id
    assert names == ["first_region", "second_region"]
