"""torch's own checkpoint, as users call it, observed inside `ckpt_viz.record()` (ckpt_viz/runtime/torch_observer.py).

Every front door (a direct call, checkpoint_sequential, checkpoint_wrapper / apply_activation_checkpointing),
both kinds: one handle per region with its forward, replay and release, gradients bit-identical to the same
step unrecorded, torch's own errors still raised, and what cannot be observed said in the trace and by info.
"""
from __future__ import annotations

import functools
import sys
import warnings

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import ckpt_viz
from ckpt_viz.analysis.handles import observed_mode
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.cli.info import summarize
from ckpt_viz.runtime import checkpoint as ckpt_viz_checkpoint
from ckpt_viz.runtime import torch_observer

KINDS = [True, False]
MODE = {True: "reentrant", False: "nonreentrant"}
# The lifecycle of one region in an ordinary training step (NOTE [ Observing torch's checkpoint ], rule 3).
STEP = {True: ["handle_created", "forward_started", "forward_finished", "backward_entered", "replay_started",
               "replay_finished", "released"],
        False: ["handle_created", "forward_started", "forward_finished", "replay_started", "early_stopped",
                "replay_finished", "released"]}


class Net(torch.nn.Module):
    def __init__(self, width: int = 8, depth: int = 3, dropout: float = 0.2) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Dropout(dropout), torch.nn.GELU())
            for _ in range(depth))

    def forward(self, x: torch.Tensor, use_reentrant: bool | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) if use_reentrant is None else checkpoint(layer, x, use_reentrant=use_reentrant)
        return x


def _step(net: torch.nn.Module, x: torch.Tensor, **kwargs: object) -> dict[str, torch.Tensor]:
    net.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # dropout: the replay must draw the forward's masks again
    net(x, **kwargs).pow(2).sum().backward()
    return {n: p.grad.clone() for n, p in net.named_parameters()}


def _by_handle(trace: ckpt_viz.Trace) -> dict[int, list[str]]:
    kinds: dict[int, list[str]] = {}
    for e in trace.events:
        if e.handle_id is not None:
            kinds.setdefault(e.handle_id, []).append(e.kind)
    return kinds


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    assert [n for n in want if not torch.equal(got[n], want[n])] == []


@pytest.mark.parametrize("use_reentrant", KINDS)
def test_a_direct_call_is_a_handle_per_region_with_bit_identical_gradients(use_reentrant: bool) -> None:
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8, requires_grad=True)
    want = _step(net, x, use_reentrant=use_reentrant)  # 1. torch's checkpoint, nobody recording
    with ckpt_viz.record(memory=True) as rec:  # 2. the same step, recorded (no model given)
        got = _step(net, x, use_reentrant=use_reentrant)
    _equal(got, want)
    trace = rec.trace
    created = trace.of_kind("handle_created")
    # 3. one handle per layer, named by its qualified name (found on the stack: Net.forward holds them), torch's
    assert [e.label for e in created] == ["layers.0", "layers.1", "layers.2"]
    assert {(e.mode, e.runtime, e.via) for e in created} == {(MODE[use_reentrant], "torch",
                                                                             "checkpoint")}
    assert list(_by_handle(trace).values()) == [STEP[use_reentrant]] * 3
    # 4. the replays run last layer first, each released after its backward
    replayed = [e.handle_id for e in trace.of_kind("replay_started")]
    assert replayed == [e.handle_id for e in reversed(created)]
    assert {e.reason for e in trace.of_kind("released")} == {"ordinary_backward_complete"}
    # 5. the lifecycle reads them as ckpt_viz's own: released, one replay each; memory sampled at their events
    life = lifecycle(trace)
    assert set(life.states_at(None).values()) == {"released"}
    assert [life.replays(h) for h in life.handle_ids] == [1, 1, 1]
    assert len(trace.memory) > 0 and "mode" not in trace.meta  # no model given: the caller names the run
    assert summarize(trace).splitlines()[0] == f"model ?  mode {MODE[use_reentrant]} (torch)"  # info reads the handles
    # 6. torch's own classes are back once the block closed
    assert tuc.CheckpointFunction is torch_observer._BASE
    assert tuc._checkpoint_without_reentrant_generator is torch_observer._BASE_GENERATOR


@pytest.mark.parametrize("use_reentrant", KINDS)
def test_checkpoint_sequential_segments_are_handles_named_by_their_modules(use_reentrant: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
                                         for _ in range(6)])
    x = torch.randn(4, 8, requires_grad=True)

    def step() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        checkpoint_sequential(model.layers, 3, x, use_reentrant=use_reentrant).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    want = step()
    with ckpt_viz.record(model=model) as rec:
        got = step()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    created = rec.trace.of_kind("handle_created")
    # 3 segments, the last one not checkpointed (torch's rule); each named as a slice of the model's container
    assert [e.label for e in created] == ["layers[0:2]", "layers[2:4]"]
    assert {e.via for e in created} == {"checkpoint_sequential"}
    assert list(_by_handle(rec.trace).values()) == [STEP[use_reentrant]] * 2
    with ckpt_viz.record() as rec:  # no model and no parent module on the stack: by position
        step()
    assert [e.label for e in rec.trace.of_kind("handle_created")] == [
        "checkpoint_sequential[0:2]", "checkpoint_sequential[2:4]"]


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.Linear(8, 8)
        self.mlp = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(torch.relu(self.attn(x)))


class Titan(torch.nn.Module):
    """torchtitan's shape: a ModuleDict of layers, checkpoint-wrapped in place."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleDict({str(i): Block() for i in range(3)})
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return self.norm(x)


@pytest.mark.parametrize("use_reentrant", KINDS)
def test_apply_activation_checkpointing_as_torchtitan_uses_it(use_reentrant: bool) -> None:
    torch.manual_seed(0)
    model, x = Titan(), torch.randn(4, 8, requires_grad=True)
    reference = Titan()
    reference.load_state_dict(model.state_dict())
    impl = CheckpointImpl.REENTRANT if use_reentrant else CheckpointImpl.NO_REENTRANT
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                                                  checkpoint_impl=impl),
                                   check_fn=lambda m: isinstance(m, Block))
    reference(x).sum().backward()
    with ckpt_viz.record(model=model) as rec:  # the wrappers are built before the recording opens
        model(x).sum().backward()
    want = {n: p.grad for n, p in reference.named_parameters()}
    got = {n.replace("._checkpoint_wrapped_module", ""): p.grad for n, p in model.named_parameters()}
    _equal(got, want)
    created = rec.trace.of_kind("handle_created")
    # the layer's name as torchtitan's state dict spells it, not "layers.0._checkpoint_wrapped_module"
    assert [e.label for e in created] == ["layers.0", "layers.1", "layers.2"]
    assert {e.via for e in created} == {"checkpoint_wrapper"}
    assert list(_by_handle(rec.trace).values()) == [STEP[use_reentrant]] * 3


def test_reentrant_under_autograd_grad_still_raises_torchs_error_and_the_trace_says_so() -> None:
    lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    with ckpt_viz.record() as rec:
        y = checkpoint(lin, x, use_reentrant=True)
        with pytest.raises(RuntimeError, match=r"When use_reentrant=True, torch\.utils\.checkpoint is incompatible"):
            torch.autograd.grad(y.sum(), x)
    assert [e.kind for e in rec.trace.events] == ["handle_created", "forward_started", "forward_finished",
                                                  "backward_called", "backward_entered", "released", "error"]
    assert rec.trace.of_kind("released")[0].reason == "backward_exception"
    assert "incompatible with .grad()" in rec.trace.of_kind("error")[0].message


def test_dropped_outputs_are_collected_and_a_retained_graph_replays_again() -> None:
    lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    with ckpt_viz.record() as rec:
        for use_reentrant in KINDS:
            y = checkpoint(lin, x, use_reentrant=use_reentrant)
            del y  # no backward will ever need it
    assert [e.kind for e in rec.trace.events if e.kind in ("node_collected", "released")] == ["node_collected"] * 2
    assert set(lifecycle(rec.trace).states_at(None).values()) == {"collected"}
    for use_reentrant in KINDS:
        with ckpt_viz.record() as rec:
            loss = checkpoint(lin, x, use_reentrant=use_reentrant).sum()
            loss.backward(retain_graph=True)
            loss.backward()
            del loss
        assert rec.trace.count("replay_started") == 2, use_reentrant  # torch replays for each backward
        assert lifecycle(rec.trace).states_at(None) == {rec.trace.events[0].handle_id: "released"}


def test_selective_checkpointing_contexts_still_run_inside_ours() -> None:
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(8, 8), torch.randn(4, 8, requires_grad=True)

    def policy(ctx: object, op: object, *args: object, **kwargs: object) -> tuc.CheckpointPolicy:
        return tuc.CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else \
            tuc.CheckpointPolicy.PREFER_RECOMPUTE

    def step() -> torch.Tensor:
        lin.zero_grad(set_to_none=True)
        contexts = functools.partial(tuc.create_selective_checkpoint_contexts, policy)
        checkpoint(lambda t: torch.relu(lin(t)).sin(), x, use_reentrant=False, context_fn=contexts).sum().backward()
        return lin.weight.grad.clone()

    want = step()
    with ckpt_viz.record() as rec:
        got = step()
    assert torch.equal(got, want)
    assert list(_by_handle(rec.trace).values()) == [STEP[False]]


def test_a_region_that_cannot_be_observed_is_said_in_the_trace_and_by_info() -> None:
    lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    with ckpt_viz.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        checkpoint(lin, x, use_reentrant=False, debug=True).sum().backward()  # torch refuses a context_fn here
    assert [e.kind for e in rec.trace.events] == ["backward_called"]  # the user's backward, no handle
    assert rec.trace.meta["unobserved"] == [{"what": torch_observer._REASONS["debug"], "count": 1}]
    text = summarize(rec.trace)
    assert "not observed: torch non-reentrant checkpoint with debug=True" in text and "(1 calls)" in text
    assert "problems: none" not in text and "problems: not checked" in text


def test_info_never_says_none_about_a_trace_that_saw_no_checkpoint() -> None:
    lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    y = checkpoint(lin, x, use_reentrant=True)  # its forward ran before the block: invisible to it
    with ckpt_viz.record(graphs=True, model=lin) as rec:
        y.sum().backward()
    text = summarize(rec.trace)
    assert text.splitlines()[0] == "model Linear  mode none"
    assert "the graph snapshots hold 1 CheckpointFunctionBackward nodes that no handle stands for" in text
    assert "problems: not checked: this trace holds no checkpoint handle" in text


def test_torchs_and_ckpt_vizs_handles_share_one_numbering_and_say_whose_they_are() -> None:
    lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    with ckpt_viz.record(model=lin) as rec:
        y = checkpoint(lin, x, use_reentrant=False)
        y = ckpt_viz_checkpoint(lin, y, use_reentrant=True)
        y = checkpoint(lin, y, use_reentrant=True)
        y.sum().backward()
    created = rec.trace.of_kind("handle_created")
    assert [(e.handle_id, e.mode, e.runtime) for e in created] == [
        (0, "nonreentrant", "torch"), (1, "reentrant", "ckpt_viz"), (2, "reentrant", "torch")]
    assert observed_mode(rec.trace) == "nonreentrant (torch) + reentrant (ckpt_viz) + reentrant (torch)"
    assert rec.trace.meta["model"] == "Linear"


def test_a_saved_trace_of_torchs_handles_loads_and_reads_the_same(tmp_path: object) -> None:
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8, requires_grad=True)
    with ckpt_viz.record(model=net, memory=True) as rec:
        _step(net, x, use_reentrant=True)
    path = tmp_path / "torch.json"  # type: ignore[operator]
    rec.trace.save(path)
    loaded = ckpt_viz.Trace.load(path)
    assert loaded.events == rec.trace.events
    assert summarize(loaded) == summarize(rec.trace)
    assert "regions: h0 layers.0, h1 layers.1, h2 layers.2" in summarize(loaded)


def test_with_no_recording_here_torchs_code_runs_untouched() -> None:
    """Another thread's recording installs the observer; this thread's checkpoint calls go straight to torch."""
    import threading

    lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    opened, release = threading.Event(), threading.Event()

    def other() -> None:
        with ckpt_viz.record():
            opened.set()
            release.wait(30)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert opened.wait(30)
        assert tuc.CheckpointFunction is torch_observer.CheckpointFunction  # installed, by the other thread
        y = checkpoint(lin, x, use_reentrant=True)
        assert type(y.grad_fn) is torch_observer._BASE._backward_cls  # torch's own node, not ours
        assert not hasattr(y.grad_fn, "_ckpt_viz_region")
    finally:
        release.set()
        thread.join()
    assert "ckpt_viz.runtime.torch_observer" in sys.modules
