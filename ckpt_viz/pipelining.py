"""ckpt_viz inside `torch.distributed.pipelining`: a stage whose I action is DX and whose W action is DW.

Owns `PipelineStage` (a subclass of torch's manual-frontend stage) and the guard
for torch's `pipeline()` tracing frontend. Imports torch, the runtime and the bus;
never the UI, the renderers or the trace. Design facts: shared/spec/distributed.md.

NOTE [ Actions and phases ]
  1. Every action runs inside `tag(rank=, stage=, microbatch=, action=)`, action
     being "F", "I", "W", "B" or "META" (metadata inference, microbatch -1). F, I,
     W and B run inside `bus.action(...)`, which also marks the action's start and
     end (`action_started`, `action_finished`), so its timeline box covers all its
     work; META, not an action of the schedule, is only tagged.
  2. F runs the stage module inside `reentrant_checkpoint_scope`, so its reentrant
     checkpoints are split; their handles are kept per micro-batch in a `_Slot`.
  3. I is `backward_input` (phase dx) with the outer `retain_graph=True`; W is
     `backward_weight` (phase dw) over the stage's parameters and the handles'
     triggers; both under one session id per (stage, micro-batch, forward). B is
     DX then DW in one action. So every region replays once per micro-batch.
  4. Stage 0's input needs no grad: its I computes nothing and its handles replay
     in W (torch's own stage does the whole backward of stage 0 in W as well).
  5. Bookkeeping torch expects after I: `bwd_cache[mb]` holds the input gradients
     of the positional inputs (sent upstream or handed to the same-rank stage of a
     V schedule) and `dw_runner[mb]` exists (the base W asserts it).
  6. The last stage's outputs are detached only after W (torch detaches them in
     I, which would break a W that walks loss -> output -> parameters).

NOTE [ Metadata inference ]
  1. In DYNAMIC mode (no `input_args`/`output_args`) the first `step()` runs the
     stage module and an `autograd.grad` once, outside any action, on empty
     tensors for every stage but the first. A checkpoint that wrote `.grad` there
     would corrupt step 0's gradients.
  2. So `_prepare_forward_infra` runs inside a scope (tag action "META"), and
     `_prepare_backward_infra` sets those handles to phase dx (no `.grad` is
     touched) and releases them afterwards.
  3. STATIC mode: example inputs of a non-first stage (and example outputs of a
     non-last one) that do not require grad would set up no gradient buffers, and
     the gradients would silently be wrong; they are copied with
     `requires_grad=True`.

NOTE [ dw_builder ]
  1. torch's stage takes `dw_builder`, a zero-argument callable returning a "dw runner"
     that computes weight gradients the stage module deferred itself (custom
     autograd.Functions that return no weight gradient and queue that work). With it,
     torch runs I as one full backward (`stage_backward`, no `inputs=` filter) and keeps
     `dw_runner[mb] = dw_builder()`, W calls that runner, and B calls `dw_builder()()`
     right after its full backward (stage.py, `backward_one_chunk` /
     `backward_weight_one_chunk`).
  2. This stage does the same, through torch's own methods: a second pass (DX then DW)
     would run the module's custom backward twice and queue its deferred work twice. The
     micro-batch's split handles are set to phase dw first, so that one full backward
     replays each once, accumulates its captured parameters and releases it; handles it
     did not reach are released after it.
  3. The built runners are wrapped to emit `dw_runner_called` (tags: the action, W or B)
     before they run, so the trace shows where the deferred weight work ran.

Relies on these private members of torch 2.13's stage: `fwd_cache`, `bwd_cache`,
`dw_runner`, `_stage_meta` (set in __init__), and `_retrieve_recv_grads`, `_check_chunk_id`,
`_prepare_forward_infra`, `_prepare_backward_infra` (checked at import).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed import pipelining as _tp

from ckpt_viz import bus
from ckpt_viz.errors import CheckpointUsageError
from ckpt_viz.events import DwRunnerCalled
from ckpt_viz.runtime import backward_input, backward_weight, reentrant_checkpoint_scope

__all__ = ["PipelineStage", "pipeline"]

_API = "ckpt_viz.pipelining.PipelineStage"
_PRIVATE = ("_retrieve_recv_grads", "_check_chunk_id", "_prepare_forward_infra", "_prepare_backward_infra")
_serial = itertools.count()

_missing = [name for name in _PRIVATE if not hasattr(_tp.PipelineStage, name)]
if _missing:
    raise ImportError(
        f"ckpt_viz.pipelining: torch {torch.__version__}'s PipelineStage lacks {', '.join(_missing)}, which the DX/DW "
        "routing relies on.\nTip: use torch 2.13, or ckpt_viz's in-process pipeline mode.")


@dataclass
class _Slot:
    """What the stage keeps for one micro-batch between F, I and W."""

    handles: list = field(default_factory=list)
    session_id: tuple = ()
    outputs: tuple = ()            # (loss,) on the last stage, else the stage outputs that need grad
    grads: tuple | None = None     # the gradients received for `outputs` (None: the scalar loss)
    stage_output: tuple = ()       # detached after W on the last stage (NOTE [ Actions and phases ], rule 6)


def _refuse_traced(submodule: nn.Module, stage_index: int) -> None:
    if isinstance(submodule, torch.fx.GraphModule):
        raise CheckpointUsageError(
            f"{_API}: stage {stage_index}'s module is a traced torch.fx.GraphModule (from "
            "torch.distributed.pipelining.pipeline() or torch.export), whose tracing replaces ckpt_viz's checkpoint "
            "autograd.Function by its inlined forward, so the stage would run without any checkpoint (or fail with "
            "'Expected positional argument for parameter ...').\nTip: build the stage from your own nn.Module "
            "(the layers this rank owns) and pass it to ckpt_viz.pipelining.PipelineStage.")
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", ())
    fsdp = getattr(getattr(torch.distributed, "fsdp", None), "FSDPModule", ())
    if isinstance(submodule, ddp) or (fsdp and isinstance(submodule, fsdp)):
        raise CheckpointUsageError(
            f"{_API}: stage {stage_index}'s module is wrapped in {type(submodule).__name__}; routing I and W through "
            "ckpt_viz bypasses torch's no_sync / gradient-sync handling, so data-parallel gradients would be "
            "reduced at the wrong time.\nTip: pass the unwrapped module (data parallelism inside a ckpt_viz stage "
            "is not supported yet).")


def pipeline(*args: Any, **kwargs: Any) -> Any:
    """Refuse torch's `pipeline()` tracing frontend, which cannot carry ckpt_viz's checkpoint.

    Raises:
        CheckpointUsageError: always; build stages manually with `PipelineStage`.
    """
    raise CheckpointUsageError(
        "ckpt_viz.pipelining.pipeline: torch's tracing frontend (torch.distributed.pipelining.pipeline, built on "
        "torch.export) mangles ckpt_viz's checkpoint, a custom autograd.Function: the traced stage fails with "
        "'Expected positional argument for parameter ...' or runs without checkpointing.\nTip: split the model "
        "yourself and wrap each rank's part in ckpt_viz.pipelining.PipelineStage(module, stage_index, num_stages, "
        "device).")


def _tensors(values: Any) -> tuple:
    if isinstance(values, torch.Tensor):
        return (values,)
    return tuple(values or ())


def _needing_grad(examples: Any) -> Any:
    """STATIC-mode examples with every floating tensor requiring grad (None stays None)."""
    if examples is None:
        return None
    return tuple(t.detach().requires_grad_(True)
                 if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.requires_grad else t
                 for t in _tensors(examples))


def _announced(builder: Any, stage_index: int) -> Any:
    """`builder` whose runners emit `dw_runner_called` before they run (NOTE [ dw_builder ], rule 3)."""

    def build() -> Any:
        runner = builder()

        def run(*args: Any, **kwargs: Any) -> Any:
            if bus.enabled:
                bus.emit(DwRunnerCalled, capture_site=False, stage=stage_index, runner=_name(runner))
            return runner(*args, **kwargs)

        return run

    return build


def _name(function: Any) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


class PipelineStage(_tp.PipelineStage):
    """torch's manual `PipelineStage`, with I routed to `backward_input` and W to `backward_weight`.

    Construct it exactly like `torch.distributed.pipelining.PipelineStage` and hand it to
    any schedule of torch 2.13 (GPipe, 1F1B, Interleaved1F1B, LoopedBFS,
    InterleavedZeroBubble, ZBVZeroBubble, DualPipeV). The stage module checkpoints with
    `ckpt_viz.checkpoint(..., use_reentrant=True)`. See NOTE [ Actions and phases ] and
    NOTE [ Metadata inference ].

    Raises:
        CheckpointUsageError: the module is a traced GraphModule (from `pipeline()`) or
            wrapped for data parallelism.
    """

    def __init__(self, submodule: nn.Module, stage_index: int, num_stages: int, device: torch.device,
                 input_args: Any = None, output_args: Any = None, *args: Any, **kwargs: Any) -> None:
        _refuse_traced(submodule, stage_index)
        if stage_index > 0:  # See NOTE [ Metadata inference ], rule 3.
            input_args = _needing_grad(input_args)
        if stage_index < num_stages - 1:
            output_args = _needing_grad(output_args)
        super().__init__(submodule, stage_index, num_stages, device, input_args, output_args, *args, **kwargs)
        self._slots: dict[int, _Slot] = {}
        self._meta_handles: list = []
        if self.dw_builder is not None:  # See NOTE [ dw_builder ], rule 3.
            self.dw_builder = _announced(self.dw_builder, stage_index)

    # ------------------------------------------------------------ tags

    def _tag(self, action: str, microbatch: int) -> Any:
        return bus.tag(rank=self.group_rank, stage=self.stage_index, microbatch=microbatch, action=action)

    def _action(self, action: str, microbatch: int) -> Any:
        """One schedule action: tagged, between its start and end events (NOTE [ Actions and phases ], rule 1)."""
        return bus.action(rank=self.group_rank, stage=self.stage_index, microbatch=microbatch, action=action)

    def _params(self) -> list[torch.Tensor]:
        return [p for p in self.submod.parameters() if p.requires_grad]

    # ------------------------------------------------------------ metadata inference

    def _prepare_forward_infra(self, *args: Any, **kwargs: Any) -> Any:
        with self._tag("META", -1), reentrant_checkpoint_scope(self.submod.parameters) as handles:
            result = super()._prepare_forward_infra(*args, **kwargs)
        self._meta_handles = list(handles)
        return result

    def _prepare_backward_infra(self, *args: Any, **kwargs: Any) -> Any:
        handles, self._meta_handles = self._meta_handles, []
        with self._tag("META", -1):
            try:
                for handle in handles:
                    if not handle.released:
                        handle.set_phase("dx")  # dx never writes .grad (NOTE [ Metadata inference ], rule 2)
                return super()._prepare_backward_infra(*args, **kwargs)
            finally:
                for handle in handles:
                    handle.release()

    # ------------------------------------------------------------ actions

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        with self._action("F", fwd_chunk_id), reentrant_checkpoint_scope(self.submod.parameters) as handles:
            output = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        self._slots[fwd_chunk_id] = _Slot(
            handles=list(handles), session_id=("ckpt_viz.pipelining", self.stage_index, fwd_chunk_id, next(_serial)))
        return output

    def backward_one_chunk(self, bwd_chunk_id: int, loss: Any = None, full_backward: bool = True,
                           last_backward: bool = False) -> None:
        if not self.has_backward:
            return
        action = "B" if full_backward else "I"
        with self._action(action, bwd_chunk_id):
            if self.dw_builder is not None:
                self._full_backward(bwd_chunk_id, loss, full_backward, last_backward)
                return
            self._backward_input(bwd_chunk_id, loss)
            if full_backward:
                self._backward_weight(bwd_chunk_id)

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False) -> None:
        if not self.has_backward:
            return
        if self.dw_builder is not None:  # torch's W: the runner built in I (NOTE [ dw_builder ])
            with self._action("W", bwd_chunk_id):
                return super().backward_weight_one_chunk(bwd_chunk_id, last_backward)
        if bwd_chunk_id not in self._slots or bwd_chunk_id not in self.dw_runner:
            raise CheckpointUsageError(
                f"{_API}.backward_weight_one_chunk: stage {self.stage_index} got W for micro-batch {bwd_chunk_id} "
                "before its I (backward_one_chunk(full_backward=False)).\nTip: a schedule runs I before W for every "
                "micro-batch; check a custom schedule's action order.")
        with self._action("W", bwd_chunk_id):
            self._backward_weight(bwd_chunk_id)

    # ------------------------------------------------------------ DX and DW

    def _full_backward(self, mb: int, loss: Any, full_backward: bool, last_backward: bool) -> None:
        """I or B with a `dw_builder`: torch's own, one full backward; see NOTE [ dw_builder ], rule 2."""
        slot = self._slots.pop(mb, None)
        handles = slot.handles if slot is not None else []
        for handle in handles:
            if not handle.released:
                handle.set_phase("dw")
        try:
            super().backward_one_chunk(mb, loss=loss, full_backward=full_backward, last_backward=last_backward)
        finally:
            for handle in handles:
                handle.release()

    def _backward_input(self, mb: int, loss: Any) -> None:
        self._check_chunk_id(mb)
        slot = self._slots.setdefault(mb, _Slot(session_id=("ckpt_viz.pipelining", self.stage_index, mb,
                                                            next(_serial))))
        stage_output, input_values = self.fwd_cache.pop(mb)
        slot.stage_output = tuple(stage_output)
        if self.is_last:
            slot.outputs, slot.grads = (loss,), None
        else:
            received = tuple(self._retrieve_recv_grads(mb))
            pairs = [(o, g) for o, g in zip(stage_output, received)  # an output the next stage did not use: no grad
                     if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
            slot.outputs = tuple(o for o, _ in pairs)
            slot.grads = tuple(g for _, g in pairs)
        if slot.outputs:
            grads_input = backward_input(slot.outputs, slot.grads, list(input_values),
                                         handles=slot.handles, session_id=slot.session_id)
        else:
            grads_input = (None,) * len(input_values)
        self.dw_runner[mb] = lambda: None  # See NOTE [ Actions and phases ], rule 5.
        self.bwd_cache[mb] = tuple(grads_input[:len(self._stage_meta.inputs)])

    def _backward_weight(self, mb: int) -> None:
        self.dw_runner.pop(mb, None)
        slot = self._slots.pop(mb)
        if slot.outputs:
            backward_weight(slot.outputs, slot.grads, self._params(), handles=slot.handles,
                            session_id=slot.session_id)
        else:
            for handle in slot.handles:
                handle.release()
        if self.is_last and not self.is_first:  # See NOTE [ Actions and phases ], rule 6.
            for t in slot.stage_output:
                if isinstance(t, torch.Tensor) and not t._is_view():
                    t.detach_()
