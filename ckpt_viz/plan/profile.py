"""The plan's one measurement: a step's allocations, and per block what it saves, keeps and costs.

Owns `profiling` (a context manager around one training step of the user's own loop),
`profile_spec` (the same for a `ModelSpec`: built-ins, model files, HF models) and
`attach` (the profile into a trace's meta). Imports torch; the profile it makes is plain
data (`ckpt_viz.plan.schema.PlanProfile`) that the torch-free planner reads.

NOTE [ Plan profile ]
  1. One step, with the named blocks NOT checkpointed. The loop's own checkpointing (ours,
     torch's `checkpoint` however it was imported, HF's `gradient_checkpointing`, torch's
     `checkpoint_wrapper`) is suspended for the profiled step and put back after it, so a loop
     profiles the same whatever policy it runs with; the profile says which checkpoints it
     suspended. The suspension replaces what `torch.utils.checkpoint.checkpoint` looks up when it
     is called (`_checkpoint_without_reentrant_generator`, `CheckpointFunction`: torch internals,
     checked against the torch versions pyproject.toml allows) and `ckpt_viz.checkpoint`'s
     `_dispatch`, so a `checkpoint` bound by name in the user's module is suspended too.
  2. What is measured, exactly: the allocator's record of the step (ckpt_viz/plan/_alloc.py):
     every allocation and free with its size, in order; marks at each block's forward start
     and end, at the gradient of its output (its backward starts) and of its input (its
     backward ends), and at the first `torch.autograd.backward` / `grad` call. A saved-tensor
     hook (outermost, so it sees every tensor autograd saves) notes each saved storage and the
     block whose forward saved it; module hooks note each block's input and output storages
     and time its forward (`time.perf_counter_ns`; the memory-only profiler adds no Python
     call per op). After the step, the storages that became parameter gradients (`.grad`) and
     gradients of the given leaf inputs are found by address.
  3. Each allocation gets a role: saved by one block only and made in its forward
     ("private": what checkpointing that block drops), saved otherwise ("saved"), a parameter
     gradient, a leaf input's gradient, or other; and the index of the event that frees it.
  4. With `ops=True` a dispatch mode also records, per op in a block's forward, its name, the
     bytes of the storages it makes and which of them autograd saved, its time and FLOPs
     (torch.utils.flop_counter's formulas). It costs a Python call per op, so block times of
     such a profile are inflated; `PlanProfile.ops_timed` says so.
  6. Block times: the profiled step's, or with `profile_spec(timed=k)` the fastest of k + 1 steps:
     preemption on a shared machine only adds. The time to the last saved tensor (where a
     non-reentrant replay stops) is that less the shortest time after the block's last saved tensor,
     of k more steps with a saved-tensor hook that notes only the time (all its calls fall before
     the last saved tensor, none in what follows) and of the profiled step. Each block counts the tensors its forward
     saved (`saved_count`), each excluded-region candidate likewise; with the replay costs of
     ckpt_viz/plan/calibrate.py (NOTE [ Replay cost ], stored in the profile) they give the recompute.
  5. Inside a `record()` that keeps saved-tensor hooks of its own, the profile's hook notes each
     saved tensor and hands it on to the hooks that were on top when the profile began (torch keeps
     one pair of hooks active, the innermost), so they still see what autograd saves. Inside
     `record(memory=True)` the profile is refused: both read the allocator through torch's
     profiler, and one runs at a time (ckpt_viz/plan/_alloc.py).
  7. Replays (`profile_spec`, not a user's own loop): after the profiled step the model runs recorded with
     every block checkpointed, in each kind (a pipeline: as its stages run, split reentrant), without the
     recording's divergence checks (`divergence.unchecked`, this thread only: a checked replay is slower, and
     training without a recording checks none): a warm-up run and REPLAY_RUNS runs per kind; a block's replay
     is its handle's `replay_started` to `replay_finished` (per micro-batch in a pipeline), the fastest of
     those runs.
"""
from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ckpt_viz.errors import CkptVizError
from ckpt_viz.plan._alloc import Allocations, Record
from ckpt_viz.plan.calibrate import forward_times
from ckpt_viz.plan.schema import (
    ROLE_INPUT_GRAD,
    ROLE_OTHER,
    ROLE_PARAM_GRAD,
    ROLE_PRIVATE,
    ROLE_SAVED,
    BlockProfile,
    OpProfile,
    PlanProfile,
    RegionProfile,
)

__all__ = ["Profiling", "attach", "default_blocks", "profile_spec", "profiling"]

_API = "ckpt_viz.plan.profiling"


def default_blocks(model: torch.nn.Module) -> tuple[str, ...]:
    """The blocks to plan over when none are named: HF's checkpointable layers, else the children of the
    longest `nn.ModuleList` / `nn.Sequential` in the model (its layers)."""
    from ckpt_viz.usermodel import hf

    layers = tuple(n for n, m in model.named_modules() if n and hf.is_hf_layer(m))
    if layers:
        return layers
    best: tuple[str, ...] = ()
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)) and len(module) > len(best):
            best = tuple(f"{name}.{child}" if name else child for child, _ in module.named_children())
    return best


def _storages(value: Any) -> list[tuple[int, int]]:
    """(address, nbytes) of each distinct storage of the tensors in `value`."""
    seen: dict[int, int] = {}
    for t in tree_flatten(value)[0]:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_sparse:
            storage = t.untyped_storage()
            if storage.nbytes():
                seen.setdefault(storage.data_ptr(), storage.nbytes())
    return list(seen.items())


class _Suspended:
    """NOTE [ Plan profile ], rule 1: checkpointing off for the profiled step, put back after."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.names: list[str] = []
        self._undo: list[Callable[[], None]] = []

    def _patch(self, owner: Any, attr: str, value: Any) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return
        setattr(owner, attr, value)
        self._undo.append(functools.partial(setattr, owner, attr, original))

    def __enter__(self) -> _Suspended:
        import torch.utils.checkpoint as tc

        from ckpt_viz.runtime import checkpoint as ours

        note = self._note

        def without_reentrant(function: Callable, *_: Any, **__: Any) -> Any:
            note(getattr(function, "__name__", "checkpoint"))
            yield  # torch's checkpoint runs function(*args) between the two steps of this generator

        class Reentrant:
            @staticmethod
            def apply(function: Callable, preserve: bool, *args: Any) -> Any:
                note(getattr(function, "__name__", "checkpoint"))
                return function(*args)

        def dispatch(function: Callable, args: tuple, kwargs: dict, *_: Any) -> Any:
            note(getattr(function, "__name__", "checkpoint"))
            return function(*args, **kwargs)

        # torch.utils.checkpoint.checkpoint looks these up when it is called, so a `checkpoint` imported by name
        # anywhere (the user's module, HF's partial, torch's checkpoint_wrapper) is suspended too
        self._patch(tc, "_checkpoint_without_reentrant_generator", without_reentrant)
        self._patch(tc, "CheckpointFunction", Reentrant)
        self._patch(ours, "_dispatch", dispatch)  # ckpt_viz.checkpoint, likewise
        for name, module in self.model.named_modules():
            if getattr(module, "gradient_checkpointing", False) is True:  # HF layers: the cache stays as it was
                module.gradient_checkpointing = False
                self._undo.append(functools.partial(setattr, module, "gradient_checkpointing", True))
                self._note(name)
        return self

    def _note(self, name: str) -> None:
        if name not in self.names and len(self.names) < 4096:
            self.names.append(name)

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            self._undo.pop()()


class _OpRecorder:
    """NOTE [ Plan profile ], rule 4: a dispatch mode that records the ops of the blocks' forwards."""

    def __init__(self, profiler: Profiling) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        registry = flop_registry
        owner = profiler

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                kwargs = kwargs or {}
                block = owner._stack[-1] if owner._stack and not owner._in_hook else None
                before = owner._alloc.mark() if block is not None and not owner._backward_started else None
                start = time.perf_counter_ns()
                out = func(*args, **kwargs)
                spent = time.perf_counter_ns() - start
                if before is not None:
                    flops = None
                    packet = func._overloadpacket
                    if packet in registry:
                        try:
                            flops = int(registry[packet](*args, **kwargs, out_val=out))
                        except Exception:
                            flops = None
                    owner._ops.append((block, str(packet).removeprefix("aten."), _storages(out), spent, flops,
                                       before, owner._alloc.mark()))
                return out

        self.mode = Mode()


class Profiling:
    """Profile one training step for the planner; see NOTE [ Plan profile ].

    Use `profiling(model, ...)`; after the block, `.profile` holds the `PlanProfile`.
    """

    def __init__(self, model: torch.nn.Module, blocks: Sequence[str] | None = None, *, ops: bool = False,
                 regions: Sequence[str] | None = None, tensors: Any = (), label: str = "",
                 stages: Sequence[str] = (), microbatches: int = 0, costs: bool = True) -> None:
        if not isinstance(model, torch.nn.Module):
            raise CkptVizError(f"{_API}: model must be a torch.nn.Module, got {type(model).__name__}.\n"
                               "Tip: pass the model whose blocks you want to plan over.")
        self.model = model
        names = tuple(blocks) if blocks is not None else default_blocks(model)
        if not names:
            raise CkptVizError(f"{_API}: found no blocks to plan over in {type(model).__name__} (no HF layers, no "
                               "nn.ModuleList or nn.Sequential).\nTip: name them: blocks=['layers.0', 'layers.1'].")
        self.block_names = names
        self.blocks: list[tuple[str, torch.nn.Module]] = []
        for name in names:
            try:
                self.blocks.append((name, model.get_submodule(name)))
            except AttributeError:
                raise CkptVizError(f"{_API}: the model has no submodule {name!r}.\nTip: use names from "
                                   f"model.named_modules(), e.g. {[n for n, _ in model.named_modules()][1:4]}."
                                   ) from None
        self.ops = ops
        self.costs = costs
        self.region_names = tuple(dict.fromkeys((*self._fixed, *(regions or ()))))
        self.label = label
        self.stage_names = tuple(stages)
        self.microbatches = microbatches
        self._stage_calls: list[dict[str, Any]] = []
        self._tensors = tensors
        self.profile: PlanProfile | None = None
        # filled while the step runs
        self._stack: list[int] = []
        self._calls: list[dict[str, Any]] = []  # one per block call, in forward order
        self._region_calls: list[dict[str, Any]] = []
        self._packs: list[tuple[int, int, int, int | None, int]] = []  # (ptr, nbytes, mark, call, t_ns)
        self._ops: list[tuple[int, str, list[tuple[int, int]], int, int | None, int, int]] = []
        self._in_hook = False
        self._backward_started = False
        self._backward_mark: int | None = None
        self._outer: tuple[Callable, Callable] | None = None

    @property
    def _fixed(self) -> tuple[str, ...]:
        """The model's own excluded regions inside blocks (`checkpoint_exclude_wrapper` modules)."""
        from ckpt_viz.runtime.exclude import CheckpointExcludeWrapper

        found = []
        for name, block in self.blocks:
            for sub, module in block.named_modules():
                if sub and isinstance(module, CheckpointExcludeWrapper):
                    found.append(f"{name}.{sub}")
        return tuple(found)

    # ------------------------------------------------------------ hooks

    def _pre(self, index: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        call = {"block": index, "f0": self._alloc.mark(), "t0": time.perf_counter_ns(),
                "inputs": _storages((args, kwargs)), "packs": 0}
        self._stack.append(len(self._calls))
        self._calls.append(call)
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None:
                t.register_hook(functools.partial(self._grad_mark, call, "w1"))
                break

    def _post(self, index: int, module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        call = self._calls[self._stack.pop()]
        call["t1"] = time.perf_counter_ns()
        call["f1"] = self._alloc.mark()
        call["outputs"] = _storages(out)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(functools.partial(self._grad_mark, call, "w0"))
                break

    def _grad_mark(self, call: dict, key: str, grad: torch.Tensor) -> None:
        if key not in call:
            call[key] = self._alloc.mark()
            call["t_" + key] = time.perf_counter_ns()

    def _stage_pre(self, index: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        call = {"block": index, "f0": self._alloc.mark(), "t0": time.perf_counter_ns(), "inputs": []}
        self._stage_calls.append(call)
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None:
                t.register_hook(functools.partial(self._stage_input_grad, call))
                break

    def _stage_input_grad(self, call: dict, grad: torch.Tensor) -> None:
        if "w1" not in call:
            call["w1"] = self._alloc.mark()
            call["grad"] = _storages(grad)

    def _stage_post(self, index: int, module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        call = next(c for c in reversed(self._stage_calls) if c["block"] == index and "f1" not in c)
        call["t1"] = time.perf_counter_ns()
        call["f1"] = self._alloc.mark()
        call["outputs"] = _storages(out)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(functools.partial(self._grad_mark, call, "w0"))
                break

    def _region_pre(self, index: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self._region_calls.append({"region": index, "call": self._stack[-1] if self._stack else None,
                                   "f0": self._alloc.mark(), "t0": time.perf_counter_ns(),
                                   "inputs": _storages((args, kwargs)), "first_pack": len(self._packs)})

    def _region_post(self, index: int, module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        for call in reversed(self._region_calls):
            if call["region"] == index and "f1" not in call:
                call["t1"] = time.perf_counter_ns()
                call["f1"] = self._alloc.mark()
                call["outputs"] = _storages(out)
                call["last_pack"] = len(self._packs)
                break

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "cpu" and not tensor.is_sparse and not self._backward_started:
            storage = tensor.untyped_storage()
            call = self._stack[-1] if self._stack else None
            if call is not None:
                self._calls[call]["packs"] += 1
            self._packs.append((storage.data_ptr(), storage.nbytes(), self._alloc.mark(), call,
                                time.perf_counter_ns()))
        if self._outer is not None:  # NOTE [ Plan profile ], rule 5: the hooks that were on top keep working
            return self._outer[0](tensor)
        # an op's own output, returned as is, would hold its grad_fn in a reference cycle
        if tensor.grad_fn is None:
            return tensor
        self._in_hook = True
        try:
            return tensor.detach()
        finally:
            self._in_hook = False

    # ------------------------------------------------------------ lifetime

    def __enter__(self) -> Profiling:
        self._exit = contextlib.ExitStack()
        stack = self._exit
        try:
            self._suspended = stack.enter_context(_Suspended(self.model))
            for index, (_, module) in enumerate(self.blocks):
                stack.callback(module.register_forward_pre_hook(functools.partial(self._pre, index),
                                                                with_kwargs=True).remove)
                stack.callback(module.register_forward_hook(functools.partial(self._post, index),
                                                            with_kwargs=True).remove)
            for index, name in enumerate(self.stage_names):
                module = self.model.get_submodule(name)
                stack.callback(module.register_forward_pre_hook(functools.partial(self._stage_pre, index),
                                                                with_kwargs=True).remove)
                stack.callback(module.register_forward_hook(functools.partial(self._stage_post, index),
                                                            with_kwargs=True).remove)
            for index, name in enumerate(self.region_names):
                module = self.model.get_submodule(name)
                stack.callback(module.register_forward_pre_hook(functools.partial(self._region_pre, index),
                                                                with_kwargs=True).remove)
                stack.callback(module.register_forward_hook(functools.partial(self._region_post, index),
                                                            with_kwargs=True).remove)
            self._watch_backward(stack)
            self._base = self._known_bytes()
            self._alloc = Allocations(_API)
            self._alloc.start()
            stack.callback(self._alloc.__exit__, None, None, None)
            self._start_ns = time.perf_counter_ns()
            self._outer = _top_saved_tensors_hooks()
            unpack = self._outer[1] if self._outer is not None else _same
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, unpack))
            if self.ops:
                stack.enter_context(_OpRecorder(self).mode)
        except BaseException:
            stack.close()
            raise
        return self

    def _watch_backward(self, stack: contextlib.ExitStack) -> None:
        """Mark the first `torch.autograd.backward` / `grad` call: the step's backward starts there."""
        for name in ("backward", "grad"):
            original = getattr(torch.autograd, name)

            def watched(*args: Any, __original: Callable = original, **kwargs: Any) -> Any:
                if not self._backward_started:
                    self._backward_started = True
                    self._backward_mark = self._alloc.mark()
                    self._backward_ns = time.perf_counter_ns()
                return __original(*args, **kwargs)

            setattr(torch.autograd, name, watched)
            stack.callback(setattr, torch.autograd, name, original)

    def _known_bytes(self) -> dict[str, int]:
        """Bytes that exist before the step: parameters, buffers, their gradients, the given tensors."""
        seen: set[int] = set()
        out = {"parameters": 0, "gradients": 0, "other": 0}
        for category, tensors in (("parameters", list(self.model.parameters())),
                                  ("gradients", [p.grad for p in self.model.parameters() if p.grad is not None]),
                                  ("other", [*self.model.buffers(), *tree_flatten(self._tensors)[0]])):
            for ptr, nbytes in _storages(tensors):
                if ptr not in seen:
                    seen.add(ptr)
                    out[category] += nbytes
        return out

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            end = self._alloc.mark() if exc is None else None
            end_ns = time.perf_counter_ns()
            record = self._alloc.stop()
        finally:
            self._exit.close()
        if exc is None:
            assert end is not None
            self.profile = self._build(record, end, end_ns)
            if self.costs:
                from ckpt_viz.plan.calibrate import replay_costs

                self.profile.replay_costs = replay_costs()

    # ------------------------------------------------------------ the profile

    def _build(self, record: Record, end_mark: int, end_ns: int) -> PlanProfile:
        sizes, ptrs, marks = record.sizes, record.ptrs, record.marks
        n = len(sizes)
        free_of = [-1] * n
        open_at: dict[int, int] = {}  # address -> index of its live allocation
        alloc_of_free = [-1] * n
        for i, (ptr, size) in enumerate(zip(ptrs, sizes)):
            if size > 0:
                open_at[ptr] = i
            else:
                j = open_at.pop(ptr, -1)
                if j >= 0:
                    free_of[j] = i
                    alloc_of_free[i] = j

        # allocations live at a mark, by address (NOTE rule 3): rebuild on demand from the order
        allocs_by_ptr: dict[int, list[int]] = {}
        for i, (ptr, size) in enumerate(zip(ptrs, sizes)):
            if size > 0:
                allocs_by_ptr.setdefault(ptr, []).append(i)

        def alloc_at(ptr: int, index: int) -> int:
            """The allocation at `ptr` live just before event `index`, or -1 (older than the record)."""
            found = -1
            for i in allocs_by_ptr.get(ptr, ()):
                if i < index:
                    found = i
                else:
                    break
            if found >= 0 and 0 <= free_of[found] < index:
                return -1
            return found

        role = [ROLE_OTHER] * n
        owner = [-1] * n
        calls = self._calls
        savers: dict[int, set[int | None]] = {}  # allocation -> the calls (None: outside blocks) that saved it
        pack_alloc: list[int] = []
        for ptr, _, mark, call, _ in self._packs:
            a = alloc_at(ptr, marks[mark])
            pack_alloc.append(a)
            if a >= 0:
                savers.setdefault(a, set()).add(call)
        outputs_of: dict[int, set[int]] = {}
        for c, call in enumerate(calls):
            if "f1" in call:
                for ptr, _ in call["outputs"]:
                    a = alloc_at(ptr, marks[call["f1"]])
                    if a >= 0:
                        outputs_of.setdefault(a, set()).add(c)
        for a, who in savers.items():
            c = next(iter(who))
            if len(who) == 1 and c is not None and "f1" in calls[c] \
                    and marks[calls[c]["f0"]] <= a < marks[calls[c]["f1"]] and a not in outputs_of:
                role[a], owner[a] = ROLE_PRIVATE, c
            else:
                role[a] = ROLE_SAVED
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        for ptr, _ in _storages(grads):
            a = alloc_at(ptr, n)
            if a >= 0:
                role[a] = ROLE_PARAM_GRAD
        leaf_grads = [t.grad for t in tree_flatten(self._tensors)[0]
                      if isinstance(t, torch.Tensor) and t.is_leaf and t.grad is not None]
        for ptr, _ in _storages(leaf_grads):
            a = alloc_at(ptr, n)
            if a >= 0:
                role[a] = ROLE_INPUT_GRAD

        end = marks[end_mark]
        backward = marks[self._backward_mark] if self._backward_mark is not None else end
        blocks: list[BlockProfile] = []
        last_pack: dict[int, tuple[int, int]] = {}
        for _, _, mark, call, t_ns in self._packs:
            if call is not None:
                last_pack[call] = (marks[mark], t_ns)
        ops_by_call: dict[int, list[OpProfile]] = {}
        saved_allocs = {a for a in pack_alloc if a >= 0}
        for call, name, outs, spent, flops, before, mark in self._ops:
            made = [(a, nb) for a, (_, nb) in ((alloc_at(ptr, marks[mark]), o) for ptr, o in zip(
                (ptr for ptr, _ in outs), outs)) if a >= marks[before]]  # new storages only, not views
            saved = sum(nb for a, nb in made if a in saved_allocs)
            ops_by_call.setdefault(call, []).append(OpProfile(
                name=name, out_bytes=sum(nb for _, nb in made), saved_bytes=saved, time_ns=spent, flops=flops,
                out_allocs=[a for a, _ in made]))
        for c, call in enumerate(calls):
            if "f1" not in call:
                raise CkptVizError(f"{_API}: block {self.block_names[call['block']]!r} started its forward and "
                                   "did not finish it inside the profiled step.\nTip: profile one whole step "
                                   "(forward, loss, backward) inside the block.")
            f0, f1 = marks[call["f0"]], marks[call["f1"]]
            inputs = []
            for ptr, nbytes in call["inputs"]:
                inputs.append((alloc_at(ptr, f0), nbytes))
            outputs = []
            for ptr, nbytes in call["outputs"]:
                outputs.append((alloc_at(ptr, f1), nbytes))
            lp_index, lp_ns = last_pack.get(c, (f0, call["t0"]))
            params = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                      for p in self.blocks[call["block"]][1].parameters()}
            ops = ops_by_call.get(c, [])
            flops = sum(o.flops for o in ops if o.flops is not None) if ops else None
            blocks.append(BlockProfile(
                name=self._call_name(c), f0=f0, f1=f1,
                w0=marks[call["w0"]] if "w0" in call else -1, w1=marks[call["w1"]] if "w1" in call else -1,
                last_pack=lp_index, time_ns=call["t1"] - call["t0"], time_to_last_pack_ns=lp_ns - call["t0"],
                backward_time_ns=(call["t_w1"] - call["t_w0"]) if "t_w1" in call and "t_w0" in call else None,
                input_allocs=[a for a, _ in inputs], input_bytes=[b for _, b in inputs],
                output_allocs=[a for a, _ in outputs], output_bytes=[b for _, b in outputs],
                param_bytes=sum(params.values()), flops=flops, ops=ops, saved_count=call["packs"]))
        regions = []
        for r in self._region_calls:
            if "f1" in r and r["call"] is not None:
                outs = [alloc_at(ptr, marks[r["f1"]]) for ptr, _ in r["outputs"]]
                ins = [alloc_at(ptr, marks[r["f0"]]) for ptr, _ in r["inputs"]]
                saved = sorted({a for a in pack_alloc[r["first_pack"]:r["last_pack"]] if a >= 0})
                regions.append(RegionProfile(name=self.region_names[r["region"]], block=r["call"],
                                             f0=marks[r["f0"]], f1=marks[r["f1"]], time_ns=r["t1"] - r["t0"],
                                             output_allocs=outs, input_allocs=ins, saved_allocs=saved,
                                             fixed=self.region_names[r["region"]] in self._fixed,
                                             saved_count=r["last_pack"] - r["first_pack"]))
        stages = []
        for st in self._stage_calls:
            if "f1" not in st:
                continue
            grads = [alloc_at(ptr, marks[st["w1"]]) for ptr, _ in st.get("grad", [])] if "w1" in st else []
            stages.append(BlockProfile(
                name=self.stage_names[st["block"]], f0=marks[st["f0"]], f1=marks[st["f1"]],
                w0=marks[st["w0"]] if "w0" in st else -1, w1=marks[st["w1"]] if "w1" in st else -1,
                time_ns=st["t1"] - st["t0"],
                output_allocs=[alloc_at(ptr, marks[st["f1"]]) for ptr, _ in st["outputs"]],
                output_bytes=[b for _, b in st["outputs"]],
                input_allocs=grads, input_bytes=[b for _, b in st.get("grad", [])],
                param_bytes=sum(p.untyped_storage().nbytes()
                                for p in self.model.get_submodule(self.stage_names[st["block"]]).parameters())))
        return PlanProfile(
            label=self.label, sizes=sizes, stage_calls=stages, microbatches=self.microbatches, free_of=free_of,
            role=role, owner=owner, blocks=blocks,
            regions=regions, backward_start=backward, end=end, base=self._base,
            step_time_ns=end_ns - self._start_ns, suspended=list(self._suspended.names), ops_timed=self.ops,
            rng_state_bytes=int(torch.get_rng_state().numel()),
            dx_targets=any(isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad
                           for t in tree_flatten(self._tensors)[0]))

    def _call_name(self, c: int) -> str:
        index = self._calls[c]["block"]
        earlier = sum(1 for call in self._calls[:c] if call["block"] == index)
        name = self.block_names[index]
        return name if earlier == 0 else f"{name}#{earlier}"


@contextlib.contextmanager
def _tails(model: torch.nn.Module, blocks: Sequence[str]) -> Any:
    """Per block call (in the order they end) of the step the block runs: the time from its last saved tensor to
    its forward's end, from module hooks and a saved-tensor hook that notes the time of each saved tensor."""
    tails: list[int] = []
    last: list[int] = []  # per open block call: its last saved tensor's time (its start until one is saved)
    handles = []

    def pre(*_: Any) -> None:
        last.append(time.perf_counter_ns())

    def post(*_: Any) -> None:
        tails.append(time.perf_counter_ns() - last.pop())

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if last:
            last[-1] = time.perf_counter_ns()
        return tensor.detach() if tensor.grad_fn is not None else tensor  # no cycle through its own grad_fn

    for name in blocks:
        module = model.get_submodule(name)
        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, _same):
            yield tails
    finally:
        for handle in handles:
            handle.remove()


def _fastest(profile: PlanProfile, timings: list[list[int]], tails: list[list[int]] = ()) -> None:
    """NOTE [ Plan profile ], rule 6: each block's time, the fastest over the timed steps and the profiled one;
    the time to its last saved tensor is that less the shortest time after its last saved tensor (the tail
    steps' and the profiled step's)."""
    n = len(profile.blocks)
    for block_index, block in enumerate(profile.blocks):
        best = min([block.time_ns, *(t[block_index] for t in timings if len(t) == n)])
        tail = min([block.time_ns - block.time_to_last_pack_ns, *(t[block_index] for t in tails if len(t) == n)])
        block.time_ns = best
        block.time_to_last_pack_ns = max(0, best - tail)


def _same(value: Any) -> Any:
    return value


def _top_saved_tensors_hooks() -> tuple[Callable, Callable] | None:
    """The saved-tensor hooks on top of this thread's stack (a `record(memory=True)` probe's), or None."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(False) if top is not None else None


def profiling(model: torch.nn.Module, blocks: Sequence[str] | None = None, *, ops: bool = False,
              regions: Sequence[str] | None = None, tensors: Any = (), label: str = "", stages: Sequence[str] = (),
              microbatches: int = 0, costs: bool = True) -> Profiling:
    """Profile the one training step the block runs; see NOTE [ Plan profile ].

    Args:
        model: the module the step trains.
        blocks: qualified names of the blocks the plan may checkpoint, in forward order (default:
            `default_blocks(model)`).
        ops: also record each op of the blocks' forwards (per-op save/recompute policies).
        regions: submodules inside blocks that may be excluded regions (default: the model's
            `checkpoint_exclude_wrapper` modules inside blocks).
        tensors: the step's inputs (and targets): counted as existing before the step, and a leaf
            input's gradient is told apart from other allocations.
        label: a name for the profile (the model's), shown by the planner.
        stages, microbatches: for a pipeline: the stage modules in order, and how many micro-batches
            the step's batch is one of (the profiled step runs one micro-batch through every stage).
        costs: when the step ends, store this process's replay costs in the profile
            (ckpt_viz.plan.calibrate: measured once per process, on a thread of its own, about a
            second), so its recompute includes what the runtime adds to each replay.

    Example:
        with ckpt_viz.record(memory=True, model=model) as rec:
            with ckpt_viz.plan.profiling(model, tensors=(x,)) as prof:
                loss = model(x).sum(); loss.backward()
        ckpt_viz.plan.attach(rec.trace, prof.profile)
    """
    return Profiling(model, blocks, ops=ops, regions=regions, tensors=tensors, label=label, stages=stages,
                     microbatches=microbatches, costs=costs)


def attach(trace: Any, profile: PlanProfile) -> None:
    """Store `profile` in `trace.meta["plan_profile"]` (a plain JSON object, checked on load)."""
    import msgspec

    trace.meta["plan_profile"] = msgspec.to_builtins(profile)


REPLAY_RUNS = 3  # recorded runs per kind whose replays are measured (each block's fastest), after a warm-up run


def _replays_by_label(trace: Any) -> dict[str, int]:
    """Each block's replay in `trace` (`recompute_time`'s per-handle replays, by the handles' region names), per
    replay: a block replayed once per micro-batch counts the mean of its replays."""
    from ckpt_viz.analysis.handles import handle_labels
    from ckpt_viz.analysis.lifecycle import lifecycle, recompute_time

    labels, life = handle_labels(trace), lifecycle(trace)
    total: dict[str, int] = {}
    count: dict[str, int] = {}
    for handle, ns in recompute_time(trace).by_handle.items():
        label = labels.get(handle, "")
        total[label] = total.get(label, 0) + ns
        count[label] = count.get(label, 0) + max(1, life.replays(handle))
    return {label: ns // count[label] for label, ns in total.items()}


def measure_replays(spec: Any, blocks: Sequence[str], *, microbatch: int | None = None, seed: int = 0,
                    runs: int = REPLAY_RUNS) -> dict[str, dict[str, int]]:
    """NOTE [ Plan profile ], rule 7: kind -> block -> one replay of the block, measured in recorded runs of the
    model with every block checkpointed in that kind (a pipeline's: "split-reentrant", as its stages run)."""
    import dataclasses

    from ckpt_viz.plan.schema import KINDS
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.runtime.divergence import unchecked

    checked = dataclasses.replace(spec, checkpoint=tuple(blocks))
    pipeline = microbatch is not None and bool(spec.stages)
    modes = {"split-reentrant": "pipeline"} if pipeline else {kind: kind for kind in KINDS}

    def run(mode: str) -> Any:
        for p in spec.model.parameters():
            p.grad = None
        with unchecked():  # a replay as training runs it: no divergence check (a checked one is slower)
            return run_scenario(checked, mode, seed=seed, microbatches=microbatch or 4)

    found: dict[str, dict[str, int]] = {}
    for kind, mode in modes.items():
        run(mode)  # a warm-up run of this kind
        best: dict[str, int] = {}
        for _ in range(runs):
            for label, ns in _replays_by_label(run(mode)).items():
                best[label] = min(best.get(label, ns), ns)
        found[kind] = {name: best[name] for name in blocks if name in best}
    for p in spec.model.parameters():
        p.grad = None
    return found


def profile_spec(spec: Any, *, seed: int = 0, ops: bool = False, microbatch: int | None = None,
                 warmup: int = 1, timed: int = 2, costs: bool = True, replays: bool = True) -> PlanProfile:
    """Profile one step of a `ModelSpec` (a built-in, a model file's, an HF model's) without checkpointing.

    Args:
        spec: the model spec; its `checkpoint` names are the blocks (default_blocks when empty).
        seed: the RNG seed for the step.
        ops: also record the blocks' ops (per-op policies).
        microbatch: for a pipeline: profile one micro-batch of `microbatch` micro-batches (its
            batch split as the pipeline splits it), so the plan sees what one micro-batch keeps.
        warmup: unprofiled steps run first (same inputs, gradients dropped after), so block times are
            those of a warm step, as a replay's are.
        timed: more unprofiled steps whose block forwards are timed (module hooks only); each
            block's time is the fastest of these and the profiled step's (a busy machine only
            ever adds time), and as many again that time what follows each block's last saved
            tensor (NOTE [ Plan profile ], rule 6).
        costs: store this process's replay costs in the profile (ckpt_viz.plan.calibrate, measured
            on the first call), so its recompute includes what the runtime adds to each replay.
        replays: also measure each block's replay in each kind in recorded runs of the model
            (`measure_replays`, NOTE [ Plan profile ], rule 7): the recompute the plan predicts is then
            those replays. 16 more runs of the step; False predicts from the formula alone.
    """
    from ckpt_viz.run.harness import inputs_requiring_grad
    from ckpt_viz.run.rng import rng_guard

    model = spec.model
    inputs, kwargs, targets = spec.inputs, spec.kwargs, spec.targets
    if microbatch is not None:
        from ckpt_viz.run.batch import split_batch

        batches = split_batch(spec.inputs, spec.kwargs, spec.targets, microbatch, api="ckpt_viz.plan.profile_spec",
                              roots=spec.extra.get("input_keys"), single=bool(spec.extra.get("single_input")))
        inputs, kwargs, targets = batches[0]
    blocks = tuple(spec.checkpoint) or default_blocks(model)
    with rng_guard(model):
        args = inputs_requiring_grad(tuple(inputs))
        kw = dict(zip(kwargs, inputs_requiring_grad(tuple(kwargs.values()))))
        if microbatch is not None and spec.stages:
            args = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in inputs)  # stage 0: no input grad
        for p in model.parameters():
            p.grad = None
        torch.manual_seed(seed)
        from ckpt_viz.usermodel import hf

        hf_layers = {n: model.get_submodule(n) for n in blocks if hf.is_hf_layer(model.get_submodule(n))}
        with contextlib.ExitStack() as stack:
            if hf_layers:
                stack.enter_context(hf.own_checkpointing(model, hf_layers, None))
            timings: list[list[int]] = []
            tails: list[list[int]] = []
            steps: list[int] = []
            for step in range(warmup + 2 * timed):  # first calls pay for lazy initialisation: not what a replay costs
                clock = forward_times(model, blocks) if step < warmup + timed else _tails(model, blocks)
                with torch.random.fork_rng(), clock as times:
                    start = time.perf_counter_ns()
                    spec.loss_of(model(*args, **kw), targets).backward()
                    spent = time.perf_counter_ns() - start
                if step >= warmup:
                    (timings if step < warmup + timed else tails).append(times)
                    if step < warmup + timed:
                        steps.append(spent)
                for p in model.parameters():
                    p.grad = None
                for t in tree_flatten((args, kw))[0]:
                    if isinstance(t, torch.Tensor):
                        t.grad = None
            torch.manual_seed(seed)
            pipeline = {"stages": tuple(spec.stages), "microbatches": microbatch} if microbatch else {}
            with profiling(model, blocks, ops=ops, tensors=(args, kw, targets), label=spec.name, costs=False,
                           **pipeline) as prof:
                loss = spec.loss_of(model(*args, **kw), targets)
                loss.backward()
                del loss
        assert prof.profile is not None
        _fastest(prof.profile, timings, tails)
        prof.profile.step_time_ns = min([prof.profile.step_time_ns, *steps])  # the fastest step, as block times
        for p in model.parameters():
            p.grad = None
    assert prof.profile is not None
    if replays:  # outside the run lock: run_scenario takes it
        for kind, by_block in measure_replays(spec, blocks, microbatch=microbatch, seed=seed).items():
            for block in prof.profile.blocks:
                if block.name in by_block:
                    block.replay_ns[kind] = by_block[block.name]
    if costs:  # outside the run lock: the calibration runs its own model (NOTE [ Replay cost ], rule 5)
        from ckpt_viz.plan.calibrate import replay_costs

        prof.profile.replay_costs = replay_costs()
    return prof.profile


