"""ckpt_viz.runtime as a drop-in for torch.utils.checkpoint, side by side with torch 2.13.

Every name is run on the same functions through `torch.utils.checkpoint` and through
`ckpt_viz.runtime`: gradients equal (bit for bit), warnings equal in category and key
phrase, errors with the same key phrase, and the same number of recomputes. Where
ckpt_viz differs on purpose (README, "Differences from torch.utils.checkpoint"), the
test says so and asserts both sides.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import re
import types
import warnings

import pytest
import torch
import torch.utils.checkpoint as tc

import ckpt_viz
import ckpt_viz.runtime as cv
from ckpt_viz import bus
from ckpt_viz.errors import CheckpointError, CheckpointUsageError
from ckpt_viz.runtime import ReentrantCheckpointHandle, recompute_handle_collector_ctx
from models import assert_grads_equal, grads, leaf, reset_grads

IMPLS = {"torch": tc, "ckpt_viz": cv}
KINDS = {"reentrant": True, "nonreentrant": False}


def _chain(seed: int = 0, width: int = 4, depth: int = 6, dropout: float = 0.0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth // 2):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh() if not dropout else torch.nn.Dropout(dropout)]
    return torch.nn.Sequential(*layers)


def _count_calls(model: torch.nn.Sequential) -> list[int]:
    """Forward calls per child (forward + recomputes), counted by hooks."""
    counts = [0] * len(model)
    for i, child in enumerate(model):
        child.register_forward_hook(lambda *_, i=i: counts.__setitem__(i, counts[i] + 1))
    return counts


def _step(impl: types.ModuleType, model: torch.nn.Sequential, segments: int, use_reentrant: bool, *,
          as_list: bool = False, **kw) -> list:
    x = leaf((3, 4), seed=5)
    reset_grads(model.parameters())
    functions = list(model) if as_list else model
    impl.checkpoint_sequential(functions, segments, x, use_reentrant=use_reentrant, **kw).sum().backward()
    return [x.grad.clone(), *grads(model.parameters())]


# 1. checkpoint_sequential ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("depth, segments", [(6, 1), (6, 2), (6, 3), (6, 6), (7, 3), (10, 4)])
def test_checkpoint_sequential_segments_like_torch(kind: str, depth: int, segments: int) -> None:
    # One model per implementation, so that the call counters are separate; same seed, same weights.
    runs = {}
    for name, impl in IMPLS.items():
        model = _chain(depth=depth + depth % 2)[:depth]
        counts = _count_calls(model)
        runs[name] = (_step(impl, model, segments, KINDS[kind]), counts)
    plain = _chain(depth=depth + depth % 2)[:depth]
    x = leaf((3, 4), seed=5)
    plain(x).sum().backward()
    expected = [x.grad, *grads(plain.parameters())]
    assert_grads_equal(runs["ckpt_viz"][0], runs["torch"][0])
    assert_grads_equal(runs["ckpt_viz"][0], expected)
    assert runs["ckpt_viz"][1] == runs["torch"][1], "the same children are checkpointed (run twice)"
    if KINDS[kind]:  # (non-reentrant early stop skips the last child of each segment in its recompute)
        size = depth // segments
        assert runs["ckpt_viz"][1] == [2 if i < size * (segments - 1) else 1 for i in range(depth)]


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_sequential_list_and_preserved_rng(kind: str) -> None:
    results = []
    for impl in IMPLS.values():
        model = _chain(depth=6, dropout=0.5)
        model.train()
        torch.manual_seed(7)
        results.append(_step(impl, model, 3, KINDS[kind], as_list=True, preserve_rng_state=True))
    assert_grads_equal(results[1], results[0])


@pytest.mark.parametrize("name", IMPLS)
def test_checkpoint_sequential_rejects_other_keywords(name: str) -> None:
    with pytest.raises(ValueError, match="Unexpected keyword arguments: context_fn,debug"):
        IMPLS[name].checkpoint_sequential(_chain(), 2, leaf((3, 4), seed=1), use_reentrant=False,
                                          context_fn=cv.noop_context_fn, debug=False)


@pytest.mark.parametrize("segments", [0, -1, 7, 2.0])
def test_checkpoint_sequential_segment_count_is_checked(segments: object) -> None:
    # Torch fails here with whatever Python raises (ZeroDivisionError for 0, "range() arg 3 must not be
    # zero" for too many) or silently checkpoints nothing (negative); ckpt_viz says what is wrong.
    with pytest.raises(CheckpointUsageError, match=r"segments must be an int from 1 to len\(functions\) = 6") as info:
        cv.checkpoint_sequential(_chain(), segments, leaf((3, 4), seed=1), use_reentrant=False)
    assert str(info.value).startswith("ckpt_viz.checkpoint_sequential: ")
    assert str(info.value).splitlines()[-1].startswith("Tip: ")
    with pytest.raises((ValueError, ZeroDivisionError, TypeError)) if segments != -1 else contextlib.nullcontext():
        tc.checkpoint_sequential(_chain(), segments, leaf((3, 4), seed=1), use_reentrant=False)


# 2. use_reentrant omitted: a warning, then the reentrant variant ------------------------------------

_PHRASE = "the use_reentrant parameter should be passed explicitly"


def _caught(call) -> tuple[list[warnings.WarningMessage], object]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return [w for w in caught if _PHRASE in str(w.message)], result


@pytest.mark.parametrize("api", ["checkpoint", "checkpoint_sequential"])
def test_omitting_use_reentrant_warns_and_selects_reentrant(api: str) -> None:
    model = _chain()
    x = leaf((3, 4), seed=2)
    call = {"checkpoint": lambda impl: impl.checkpoint(model, x),
            "checkpoint_sequential": lambda impl: impl.checkpoint_sequential(model, 2, x)}[api]
    found = {}
    for name, impl in IMPLS.items():
        with recompute_handle_collector_ctx() as handles:
            found[name], out = _caught(lambda impl=impl: call(impl))
        found[name + "_handles"] = handles
        found[name + "_out"] = out
    for name in IMPLS:
        (warning,) = found[name]
        assert warning.category is UserWarning
    assert f"{api}: {_PHRASE}" in str(found["ckpt_viz"][0].message)
    assert found["ckpt_viz"][0].filename == __file__, "the warning points at the caller's line"
    # The reentrant variant was selected in both: torch's refuses .grad(), ours made a reentrant handle.
    with pytest.raises(RuntimeError, match=r"incompatible with \.grad\(\)"):
        torch.autograd.grad(found["torch_out"].sum(), x)
    assert [type(h) for h in found["ckpt_viz_handles"]] == [ReentrantCheckpointHandle]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", IMPLS)
def test_explicit_use_reentrant_does_not_warn(name: str, kind: str) -> None:
    found, _ = _caught(lambda: IMPLS[name].checkpoint(torch.sin, leaf((2,), seed=1), use_reentrant=KINDS[kind]))
    assert found == []


# 3. set_checkpoint_early_stop -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("context", [None, True, False])
@pytest.mark.parametrize("keyword", [True, False])
def test_early_stop_context_wins_over_the_keyword(keyword: bool, context: bool | None, kind: str) -> None:
    tails = {}
    for name, impl in IMPLS.items():
        runs: list[int] = []

        def region(a: torch.Tensor, runs: list[int] = runs) -> torch.Tensor:
            out = a.sin()  # the only saved tensor
            runs.append(1)  # the tail: re-run only without early stop
            return out

        x = leaf((3,), seed=1)
        with impl.set_checkpoint_early_stop(context):
            y = impl.checkpoint(region, x, use_reentrant=KINDS[kind], early_stop=keyword)
        y.sum().backward()  # outside the block: the setting was taken at forward
        tails[name] = len(runs)
        assert torch.equal(x.grad, torch.cos(x.detach()))
    assert tails["ckpt_viz"] == tails["torch"]
    effective = keyword if context is None else context
    assert tails["ckpt_viz"] == (2 if KINDS[kind] or not effective else 1)


def test_early_stop_context_restores_the_previous_value() -> None:
    with cv.set_checkpoint_early_stop(False):
        with cv.set_checkpoint_early_stop(True):
            assert cv.compat.early_stop_override() is True
        assert cv.compat.early_stop_override() is False
    assert cv.compat.early_stop_override() is None
    with pytest.raises(CheckpointUsageError, match="enable must be bool or None"):
        with cv.set_checkpoint_early_stop("no"):
            pass


# 4. set_checkpoint_debug_enabled / debug=True --------------------------------------------------------

class _Flag:
    on = False


def _shape_changing_region(flag: _Flag):
    def region(a: torch.Tensor) -> torch.Tensor:
        return (a[:2] if flag.on else a).sin()  # sin saves its input: another shape in the recompute
    return region


def _mismatch(impl: types.ModuleType, debug: bool | None, keyword: bool) -> CheckpointError:
    flag = _Flag()
    x = leaf((3, 4), seed=1)
    with impl.set_checkpoint_debug_enabled(debug):
        y = impl.checkpoint(_shape_changing_region(flag), x, use_reentrant=False, debug=keyword)
    flag.on = True
    # torch's debug error is its operator log, which says "non-determinism" instead
    with pytest.raises(impl.CheckpointError, match=r"[Dd]ifferent.*metadata|Detected non-determinism") as info:
        y.sum().backward()
    return info.value


@pytest.mark.parametrize("debug, keyword, on", [(None, False, False), (None, True, True), (True, False, True),
                                                (False, True, False)])
def test_debug_switch_wins_over_the_keyword(debug: bool | None, keyword: bool, on: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging, "raiseExceptions", False)  # torch's operator logging trips pytest's log capture
    ours, theirs = _mismatch(cv, debug, keyword), _mismatch(tc, debug, keyword)
    assert ("Debug story of h" in str(ours)) is on
    assert ("Operations executed during the original forward" in str(theirs)) is on  # torch's debug mode: operator logs
    if on:
        story = str(ours).split("Debug story of h", 1)[1]
        for line in ("handle_created nonreentrant", "tensor_packed", "forward_finished saved 1 tensors",
                     "replay_started trigger=backward", "replay_failed CheckpointError"):
            assert line in story, story
        assert len(story.splitlines()) <= 34
        assert len(str(ours)) < len(str(theirs)) / 3, "far shorter than torch's operator logs"
        assert str(ours).splitlines()[-1].startswith("Tip: "), "the story goes before the tip"


def test_debug_story_of_a_released_reentrant_handle() -> None:
    # Torch's debug mode does nothing for the reentrant variant; ours tells the handle's story.
    x = leaf((3, 4), seed=1)
    y = cv.checkpoint(torch.tanh, x, use_reentrant=True, debug=True)
    loss = y.sum()
    loss.backward(retain_graph=True)
    with pytest.raises(CheckpointError, match="Cannot replay a released reentrant checkpoint") as info:
        loss.backward()
    message = str(info.value)
    assert "Debug story of h" in message
    assert "released reason=ordinary_backward_complete" in message
    assert "replay_refused reason=released" in message
    assert message.splitlines()[-1].startswith("Tip: ")


def test_debug_story_of_a_reentrant_handle_has_every_event_in_order() -> None:
    # forward_started ... released call bus.emit_row themselves (no `_emit` frame): each still reaches the story
    x = leaf((3, 4), seed=1)
    loss = cv.checkpoint(torch.tanh, x, use_reentrant=True, debug=True).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(CheckpointError) as info:
        loss.backward()
    story = re.split(r"Debug story of h\d+ \(10 events\):\n", str(info.value), maxsplit=1)[1].split("\nTip: ")[0]
    assert [line.split()[1] for line in story.splitlines()] == [
        "handle_created", "forward_started", "forward_finished", "backward_entered", "replay_started",
        "replay_finished", "grads_routed", "released", "backward_entered", "replay_refused"]
    seqs = [int(line.split()[0][1:]) for line in story.splitlines()]
    assert seqs == list(range(seqs[0], seqs[0] + 10))  # consecutive: nothing of this handle's is missing


def test_debug_listener_leaves_when_the_handles_die() -> None:
    gc.collect()
    assert not bus.enabled
    x = leaf((3, 4), seed=1)
    y = cv.checkpoint(torch.tanh, x, use_reentrant=False, debug=True)
    assert bus.enabled, "a debug handle is alive: its story is being written"
    y.sum().backward()
    del y
    gc.collect()
    assert not bus.enabled, "no debug handle alive: the bus is off again (spec D8)"


@pytest.mark.parametrize("name", IMPLS)
def test_debug_with_a_custom_context_fn_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="debug=True is incompatible with non-default context_fn"):
        IMPLS[name].checkpoint(torch.sin, leaf((2,), seed=1), use_reentrant=False, debug=True,
                               context_fn=lambda: (contextlib.nullcontext(), contextlib.nullcontext()))


# 5. GraphExecGroup -----------------------------------------------------------------------------------

def _dx_dw(impl: types.ModuleType, group_cls: type | None, region_of) -> tuple[int, list]:
    """A DX pass (autograd.grad for x) and a DW pass (backward into the weights); (calls, gradients)."""
    w1, w2 = leaf((4,), seed=1), leaf((4,), seed=2)
    calls = []

    def region(a: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return region_of(a, w1, w2)

    x = leaf((3, 4), seed=3)
    loss = impl.checkpoint(region, x, use_reentrant=False).sum()
    with (group_cls() if group_cls else contextlib.nullcontext()):
        (dx,) = torch.autograd.grad(loss, [x], retain_graph=True)
        torch.autograd.backward(loss, inputs=[w1, w2])
    return len(calls), [dx, w1.grad, w2.grad]


def _branches(a, w1, w2):
    return a.sin() + w1.cos() * w2  # DX reaches sin's node only, DW the weights' nodes: nothing shared


def _with_tanh(a, w1, w2):
    return a @ torch.diag(w1) * w2  # mm's node saves a tensor for each pass; both passes reach it


@pytest.mark.parametrize("group", ["none", "torch", "ckpt_viz"])
def test_graph_exec_group_recomputes_once_for_dx_and_dw(group: str) -> None:
    group_cls = {"none": None, "torch": tc.GraphExecGroup, "ckpt_viz": cv.GraphExecGroup}[group]
    results = {name: _dx_dw(impl, group_cls, _branches) for name, impl in IMPLS.items()}
    assert results["ckpt_viz"][0] == results["torch"][0] == (3 if group == "none" else 2)
    assert_grads_equal(results["ckpt_viz"][1], results["torch"][1])


def test_graph_exec_group_goes_through_a_session(recorder: ckpt_viz.Recording) -> None:
    with recompute_handle_collector_ctx() as frames:
        calls, _ = _dx_dw(cv, cv.GraphExecGroup, _branches)
    assert calls == 2
    (frame,) = frames
    trace = recorder.trace
    (bound,) = trace.of_kind("session_bound")
    (cleared,) = trace.of_kind("session_cleared")
    assert bound.session_id == cleared.session_id == frame.session_id
    assert str(frame.session_id).startswith("GraphExecGroup#")
    assert frame.recomputed == {}, "leaving the group cleared its recomputed tensors"
    unpacked = trace.of_kind("tensor_unpacked")
    assert unpacked and {e.key_source for e in unpacked} == {"group"}


@pytest.mark.parametrize("group", ["torch", "ckpt_viz"])
def test_graph_exec_group_refuses_overlapping_passes(group: str) -> None:
    group_cls = {"torch": tc.GraphExecGroup, "ckpt_viz": cv.GraphExecGroup}[group]
    for impl in IMPLS.values():
        with pytest.raises(RuntimeError, match="Performing two backward calls that overlap"):
            _dx_dw(impl, group_cls, _with_tanh)


@pytest.mark.parametrize("name", IMPLS)
def test_graph_exec_group_cannot_nest(name: str) -> None:
    with IMPLS[name].GraphExecGroup():
        with pytest.raises(RuntimeError, match="GraphExecGroup contexts cannot be nested"):
            with cv.GraphExecGroup():
                pass
    with cv.GraphExecGroup():  # the failed inner one left the outer state alone, and exit reset it
        pass


def test_graph_exec_group_is_a_no_op_for_reentrant_checkpoints() -> None:
    results = []
    for impl in IMPLS.values():
        w = leaf((4, 4), seed=1)
        x = leaf((3, 4), seed=2)
        with impl.GraphExecGroup():
            impl.checkpoint(lambda a, w=w: torch.tanh(a @ w), x, use_reentrant=True).sum().backward()
        results.append([x.grad, w.grad])
    assert_grads_equal(results[1], results[0])


# 6. No output requires grad ------------------------------------------------------------------------

@pytest.mark.parametrize("kind, phrase", [
    ("reentrant", "none of output has requires_grad=True, this checkpoint\\(\\) is not necessary"),
    ("nonreentrant", "element 0 of tensors does not require grad"),
])
def test_no_output_requires_grad(kind: str, phrase: str) -> None:
    for impl in IMPLS.values():
        x = leaf((3,), seed=1)
        y = impl.checkpoint(lambda a: a.detach() * 2, x, use_reentrant=KINDS[kind])
        with pytest.raises(RuntimeError, match=phrase):
            y.sum().backward()


def test_no_output_requires_grad_is_a_ckpt_viz_error(recorder: ckpt_viz.Recording) -> None:
    with recompute_handle_collector_ctx() as handles:
        y = cv.checkpoint(lambda a: a.detach() * 2, leaf((3,), seed=1), use_reentrant=True)
    with pytest.raises(CheckpointError, match="none of output has requires_grad") as info:
        y.sum().backward()
    assert str(info.value).startswith("ckpt_viz.checkpoint (backward): ")
    assert f"h{handles[0].handle_id}" in str(info.value)
    assert handles[0].release_reason == "backward_exception"


def test_captured_parameters_get_gradients_without_grad_inputs() -> None:
    # A deliberate difference (the seed's dummy input): torch's reentrant checkpoint warns and gives None.
    w = leaf((4, 4), seed=1)
    x = leaf((3, 4), seed=2, requires_grad=False)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = tc.checkpoint(lambda a: torch.tanh(a @ w), x, use_reentrant=True)
    assert not out.requires_grad
    cv.checkpoint(lambda a: torch.tanh(a @ w), x, use_reentrant=True).sum().backward()
    expected = leaf((4, 4), seed=1)
    torch.tanh(x @ expected).sum().backward()
    assert_grads_equal([w.grad], [expected.grad])


# 7. create_graph=True ------------------------------------------------------------------------------

def _cube(a: torch.Tensor) -> torch.Tensor:
    return (a ** 3).sum()


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_create_graph_through_reentrant_is_refused() -> None:
    # Torch returns a gradient that silently has no graph ...
    x = leaf((3,), seed=1)
    tc.checkpoint(_cube, x, use_reentrant=True).backward(create_graph=True)
    assert x.grad.grad_fn is None
    # ... and refuses autograd.grad for the reentrant variant altogether.
    with pytest.raises(RuntimeError, match=r"incompatible with \.grad\(\)"):
        torch.autograd.grad(tc.checkpoint(_cube, x, use_reentrant=True), x, create_graph=True)
    # ckpt_viz says so instead, for both calls.
    for run in (lambda y: y.backward(create_graph=True), lambda y: torch.autograd.grad(y, x, create_graph=True)):
        y = cv.checkpoint(_cube, x, use_reentrant=True)
        with pytest.raises(CheckpointError, match="create_graph=True is not supported through a reentrant "
                                                  "checkpoint") as info:
            run(y)
        assert str(info.value).splitlines()[-1].startswith("Tip: use use_reentrant=False")


def test_create_graph_through_nonreentrant_matches_torch() -> None:
    second = []
    for impl in [*IMPLS.values(), None]:
        x = leaf((3,), seed=1)
        y = _cube(x) if impl is None else impl.checkpoint(_cube, x, use_reentrant=False)
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x)
        second.append([g.detach(), gg])
    assert_grads_equal(second[1], second[0])
    assert_grads_equal(second[1], second[2])
    assert torch.equal(second[1][1], 6 * leaf((3,), seed=1).detach())


# 8. Deliberate differences (README, "Differences from torch.utils.checkpoint"): both sides asserted -------

def test_reentrant_grad_is_allowed_for_split_backward() -> None:
    x, w = leaf((3, 4), seed=1), leaf((4, 4), seed=2)
    with pytest.raises(RuntimeError, match=r"incompatible with \.grad\(\)"):
        torch.autograd.grad(tc.checkpoint(lambda a: torch.tanh(a @ w), x, use_reentrant=True).sum(), x)
    (ours,) = torch.autograd.grad(cv.checkpoint(lambda a: torch.tanh(a @ w), x, use_reentrant=True).sum(), x)
    (plain,) = torch.autograd.grad(torch.tanh(x @ w).sum(), x)
    assert_grads_equal([ours], [plain])


def test_outer_retain_graph_does_not_keep_a_reentrant_handle() -> None:
    calls = []

    def region(a: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return a.sin()

    x = leaf((3,), seed=1)
    loss = tc.checkpoint(region, x, use_reentrant=True).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    assert len(calls) == 3, "torch recomputes on every backward"
    loss = cv.checkpoint(region, x, use_reentrant=True).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(CheckpointError, match="Cannot replay a released reentrant checkpoint"):
        loss.backward()


def test_reentrant_keyword_and_nested_inputs_get_gradients() -> None:
    def region(pair: tuple, *, scale: torch.Tensor) -> torch.Tensor:
        return torch.tanh(pair[0] * scale) + pair[1]

    x, y, s = leaf((3,), seed=1), leaf((3,), seed=2), leaf((3,), seed=3)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        tc.checkpoint(region, (x, y), scale=s, use_reentrant=True)
    cv.checkpoint(region, (x, y), scale=s, use_reentrant=True).sum().backward()
    ours = grads([x, y, s])
    reset_grads([x, y, s])
    region((x, y), scale=s).sum().backward()
    assert_grads_equal(ours, grads([x, y, s]))
