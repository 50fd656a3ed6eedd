"""Unasked accumulation (NOTE [ Unasked accumulation ] in ckpt_viz/runtime/unasked.py) and PhaseNotSetError's tip.

An unscoped reentrant checkpoint answers every backward with a full backward over its replay: reached by
torch.autograd.grad or backward(inputs=...), it writes .grad of the parameters it captured although the call did
not ask for them. Found with and without a recording; the warning once per run.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import ckpt_viz
from ckpt_viz.errors import PhaseNotSetError
from ckpt_viz.events import fields_of
from ckpt_viz.runtime import backward_input, backward_weight, checkpoint, reentrant_checkpoint_scope, unasked
from ckpt_viz.runtime.unasked import UnaskedAccumulationWarning


@pytest.fixture(autouse=True)
def fresh_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unasked, "pending", True)  # each test is a new run: nothing warned yet


def _block() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))


def _x() -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)


def _unasked(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, UnaskedAccumulationWarning)]


def test_autograd_grad_warns_once_per_run_naming_the_handle_and_the_fix() -> None:
    block, x = _block(), _x()
    first = _unasked(lambda: torch.autograd.grad(checkpoint(block, x, use_reentrant=True).sum(), [x]))
    assert len(first) == 1 and first[0].filename == __file__  # the user's line, not the runtime's
    message = str(first[0].message)
    assert message.startswith("ckpt_viz.checkpoint: reentrant checkpoint h")
    assert "(Sequential) outside a split scope" in message and "4 parameter(s)" in message
    assert message.splitlines()[-1].startswith("Tip: build the stage with ckpt_viz.pipelining.PipelineStage")
    assert "reentrant_checkpoint_scope" in message.splitlines()[-1]
    assert all(p.grad is not None for p in block.parameters())  # the side effect the seed documents (spec 3.5)
    again = _unasked(lambda: torch.autograd.grad(checkpoint(block, x, use_reentrant=True).sum(), [x]))
    assert again == []


@pytest.mark.parametrize("inputs", ["x", "x+one"])
def test_backward_with_inputs_warns_for_the_parameters_left_out(inputs: str) -> None:
    block, x = _block(), _x()
    asked = [x] if inputs == "x" else [x, block[0].weight]
    caught = _unasked(lambda: checkpoint(block, x, use_reentrant=True).sum().backward(inputs=asked))
    assert len(caught) == 1 and f"{4 if inputs == 'x' else 3} parameter(s)" in str(caught[0].message)


@pytest.mark.parametrize("call", ["backward", "inputs=all"])
def test_no_warning_when_every_written_grad_was_asked_for(call: str) -> None:
    block, x = _block(), _x()
    y = checkpoint(block, x, use_reentrant=True).sum()
    run = (lambda: y.backward()) if call == "backward" else (lambda: y.backward(inputs=[x, *block.parameters()]))
    assert _unasked(run) == []
    assert unasked.pending  # nothing found: the next run still checks


def test_no_warning_when_the_region_captures_nothing() -> None:
    w, x = torch.randn(4, 4, requires_grad=True), _x()
    assert _unasked(lambda: torch.autograd.grad(checkpoint(torch.mm, x, w, use_reentrant=True).sum(), [x])) == []
    assert w.grad is None  # an explicit input's gradient goes through the outer engine, which filters it


def test_split_handles_are_not_reported() -> None:
    block, x = _block(), _x()
    params = list(block.parameters())

    def run() -> None:
        with reentrant_checkpoint_scope(params) as handles:
            y = checkpoint(block, x, use_reentrant=True).sum()
        backward_input(y, None, [x], handles=handles)
        backward_weight(y, None, params, handles=handles)

    assert _unasked(run) == []


def test_recorded_runs_get_an_event_per_backward_and_one_warning_per_recording() -> None:
    block, x = _block(), _x()
    for _ in range(2):  # the second recording is a new run: it warns again
        with ckpt_viz.record(model=block) as rec:
            caught = _unasked(lambda: [torch.autograd.grad(checkpoint(block, x, use_reentrant=True).sum(), [x])
                                       for _ in range(2)])
        assert len(caught) == 1
        events = rec.trace.of_kind("unasked_grads_accumulated")
        handles = [e.handle_id for e in rec.trace.of_kind("handle_created")]
        assert [e.handle_id for e in events] == handles and [e.warned for e in events] == [True, False]
        assert fields_of(events[0]) == {"count": 4, "params": ("0.weight", "0.bias", "2.weight", "2.bias"),
                                        "shapes": ((4, 4), (4,), (4, 4), (4,)), "function": "Sequential",
                                        "warned": True}
        assert events[0].site.rsplit(":", 1)[0].endswith("test_unasked.py")  # the autograd.grad line


def test_correct_runs_keep_bit_identical_gradients() -> None:
    def grads(recorded: bool) -> list[torch.Tensor]:
        block, x = _block(), _x()
        if recorded:
            with ckpt_viz.record():
                checkpoint(block, x, use_reentrant=True).pow(2).sum().backward()
        else:
            checkpoint(block, x, use_reentrant=True).pow(2).sum().backward()
        return [x.grad, *(p.grad for p in block.parameters())]

    block, x = _block(), _x()
    block(x).pow(2).sum().backward()
    reference = [x.grad, *(p.grad for p in block.parameters())]
    for recorded in (False, True):
        got = grads(recorded)
        assert all(torch.equal(a, b) for a, b in zip(got, reference))


# PhaseNotSetError's tip fits the caller (issue 28, item 6) ----------------------------------------------------------

def test_phase_not_set_tip_for_a_plain_backward_names_the_helpers() -> None:
    block, x = _block(), _x()
    with reentrant_checkpoint_scope(list(block.parameters())):
        y = checkpoint(block, x, use_reentrant=True).sum()
    with pytest.raises(PhaseNotSetError) as info:
        y.backward()
    tip = str(info.value).splitlines()[-1]
    assert tip.startswith("Tip: call handle.set_phase('dx')") and "backward_input / backward_weight" in tip


@pytest.mark.parametrize("helper", ["backward_input", "backward_weight"])
def test_phase_not_set_tip_for_a_helper_caller_names_the_missing_handle(helper: str) -> None:
    block, x = _block(), _x()
    w = torch.randn(4, 4, requires_grad=True)  # an explicit input: DW reaches the first region through it
    params = [w, *block.parameters()]
    with reentrant_checkpoint_scope(params) as handles:
        h = checkpoint(lambda a, b: torch.tanh(a @ b), x, w, use_reentrant=True)
        y = checkpoint(block, h, use_reentrant=True).sum()
    with pytest.raises(PhaseNotSetError) as info:
        if helper == "backward_input":
            backward_input(y, None, [x], handles=handles[1:])  # the first handle forgotten
        else:
            backward_weight(y, None, params, handles=handles[1:])
    message = str(info.value)
    assert info.value.helper == f"ckpt_viz.{helper}" and f"reached by ckpt_viz.{helper}" in message
    tip = message.splitlines()[-1]
    assert tip.startswith(f"Tip: pass every handle of the micro-batch's scope in `handles=` of ckpt_viz.{helper} "
                          f"(h{handles[0].handle_id} was not among them")
    assert "use ckpt_viz.runtime.backward_input" not in tip
