"""`record()`: capture what the runtime emits while a block runs, with memory and graphs on request.

Owns the `Recording` context manager. It imports torch only when memory or graph
capture is asked for (then through `probe_memory` / `probe_graph`), so opening a
saved trace never needs torch.

NOTE [ What a recording captures ]
  1. Events: every event emitted while the block is open, in order.
  2. memory=True: live bytes by category (see NOTE [ Memory categories ] in
     probe_memory.py) read right after every event; a `MemorySample` is stored
     when the reading differs from the previous one, so the memory at any event
     is that of the last sample at or before it (a step function).
  3. PyTorch's own errors in a top-level `torch.autograd.backward` / `grad` call
     become `error` events even when the caller catches them (R13 needs that).
  4. graphs=True: a `GraphSnapshot` of the roots of every top-level
     `torch.autograd.backward` / `torch.autograd.grad` call made in the block
     (`Tensor.backward` and the split helpers included), taken just before the
     call runs, plus any `rec.snapshot(tensors, label)` the user asks for.
     Snapshots never replay a checkpoint.
"""
from __future__ import annotations

import functools
import sys
from types import TracebackType
from typing import Any

from ckpt_viz import bus
from ckpt_viz.errors import RecordingError, error_code
from ckpt_viz.events import Event
from ckpt_viz.trace import MemorySample, Trace

__all__ = ["Recording", "record"]


class Recording:
    """A context manager whose `.trace` holds what was emitted while it was open."""

    def __init__(self, *, memory: bool = False, graphs: bool = False, model: Any = None,
                 tensors: Any = ()) -> None:
        self.trace = Trace()
        self.memory = memory
        self.graphs = graphs
        self.model = model
        self._tensors = tensors
        self._unsubscribe: Any = None
        self._probe: Any = None
        self._names: dict[int, str] = {}
        self._restore: list[tuple[Any, str, Any]] = []
        self._last_reading: Any = None
        self._named: list[Any] = []

    def _on_event(self, event: Event) -> None:
        self.trace.events.append(event)
        if self._probe is not None:
            reading = self._probe.sample()
            if reading != self._last_reading:  # memory is a step function: store only the steps
                self._last_reading = reading
                totals, by_stage, device = reading
                self.trace.memory.append(MemorySample(seq=event.seq, t_ns=event.t_ns, bytes_by_category=totals,
                                                      device_allocated=device, by_stage=by_stage))

    # ------------------------------------------------------------ graphs

    def snapshot(self, roots: Any, label: str) -> None:
        """Add a graph snapshot of the graph behind `roots` now (needs graphs=True or works anyway)."""
        from ckpt_viz.probe.graph import capture_graph

        seq = self.trace.events[-1].seq if len(self.trace.events) else -1
        self.trace.graphs.append(capture_graph(roots, label=label, seq=seq, names=self._names))

    def _patch_autograd(self) -> None:
        """Watch top-level backward passes: snapshot them (graphs=True) and record PyTorch's own errors."""
        import torch

        recording = self

        def wrap(name: str, original: Any, roots_keyword: str) -> Any:
            @functools.wraps(original)
            def patched(*args: Any, **kwargs: Any) -> Any:
                if torch._C._current_graph_task_id() != -1:  # an inner backward (a replay): not the user's pass
                    return original(*args, **kwargs)
                if recording.graphs:
                    count = sum(1 for g in recording.trace.graphs if g.label.startswith("before"))
                    roots = args[0] if args else kwargs.get(roots_keyword)
                    recording.snapshot(roots, f"before {name} #{count + 1}")
                try:
                    return original(*args, **kwargs)
                except Exception as exc:  # e.g. "Trying to backward through the graph a second time" (R13)
                    bus.emit_error(exc, name, data={"retain_graph": kwargs.get("retain_graph"),
                                                    "code": error_code(exc)})
                    raise

            return patched

        for name, roots_keyword in (("backward", "tensors"), ("grad", "outputs")):
            original = getattr(torch.autograd, name)
            self._restore.append((torch.autograd, name, original))
            setattr(torch.autograd, name, wrap(f"autograd.{name}", original, roots_keyword))

    # ------------------------------------------------------------ lifetime

    def __enter__(self) -> "Recording":
        if self._unsubscribe is not None:
            raise RecordingError("ckpt_viz.record: this recording is already open.\nTip: use a new record() block.")
        handles = sys.modules.get("ckpt_viz.runtime.reentrant_handle")  # loaded only if checkpoints ran here
        if handles is not None and not bus.enabled:
            handles.restart_handle_ids()  # a run recorded twice gets the same ids (only when none is alive)
        if self.model is not None:
            self._names = {id(p): n for n, p in self.model.named_parameters()}
            for name, param in self.model.named_parameters():  # routing events name captured parameters
                param._ckpt_viz_name = name
                self._named.append(param)
        if self.memory:
            from ckpt_viz.probe.memory import MemoryProbe

            params = list(self.model.parameters()) if self.model is not None else []
            buffers = list(self.model.buffers()) if self.model is not None else []
            self._probe = MemoryProbe(params=params, tensors=[*buffers, *_tensors_in(self._tensors)])
            self._probe.__enter__()
        self._patch_autograd()
        self._unsubscribe = bus.subscribe(self._on_event)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None:  # once: an error the runtime or an autograd call already reported is not repeated
                bus.emit_error(exc, "record")
        finally:
            self._unsubscribe()
            self._unsubscribe = None
            for owner, name, original in reversed(self._restore):
                setattr(owner, name, original)
            self._restore.clear()
            for param in self._named:
                del param._ckpt_viz_name
            self._named.clear()
            if self._probe is not None:
                self._probe.__exit__(exc_type, exc, tb)
                self._probe = None


def _tensors_in(value: Any) -> list[Any]:
    from torch.utils._pytree import tree_flatten

    import torch

    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def record(*, memory: bool = False, graphs: bool = False, model: Any = None, tensors: Any = ()) -> Recording:
    """Record the runtime's events (and optionally memory and graphs) while the block runs.

    Args:
        memory: sample live bytes by category after every event.
        graphs: snapshot the autograd graph before every top-level backward.
        model: the module being run: names its parameters in snapshots and counts
            them as "parameters" from the start.
        tensors: tensors that exist before the block (inputs) to count from the start.

    Example:
        with ckpt_viz.record(memory=True, graphs=True, model=model) as rec:
            loss = model(x).sum(); loss.backward()
        rec.trace.save("trace.json")
    """
    return Recording(memory=memory, graphs=graphs, model=model, tensors=tensors)
