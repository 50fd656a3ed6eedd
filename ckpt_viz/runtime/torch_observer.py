"""torch's own checkpoint, observed inside `record()`: each `torch.utils.checkpoint` region becomes a handle.

Owns `install` / `uninstall` (called by ckpt_viz/recording.py with its autograd watch) and
the events of torch's regions. Imports torch; never the UI, never `render`.

NOTE [ Observing torch's checkpoint ]
  1. Where. Every way users reach torch's checkpoint ends in the one function
     `torch.utils.checkpoint.checkpoint`: a direct call, `checkpoint_sequential`, Hugging Face's
     `gradient_checkpointing_enable()` (a `functools.partial(checkpoint, **kwargs)` stored on each
     layer), torch's `checkpoint_wrapper` / `apply_activation_checkpointing` (torchtitan; a
     partial made when the wrapper is built). Those references are taken long before a
     recording opens, so wrapping the function itself would miss most of them. What the function
     looks up in its module *at each call* is `CheckpointFunction` (use_reentrant=True; public,
     in `torch.utils.checkpoint.__all__`) and `_checkpoint_without_reentrant_generator`
     (use_reentrant=False; private). While a recording is open those two module attributes are
     ours:
       - `CheckpointFunction`: a subclass of torch's, with the same name (the backward node is
         still `CheckpointFunctionBackward`), whose forward and backward call torch's and emit
         around them. torch keeps `run_function` in ctx and calls it again in backward; we hand
         torch a wrapper of it, so that second call is the replay.
       - the generator: a function with its signature that calls torch's with `context_fn`
         composed with ours. `context_fn` is checkpoint's public extension point: its first
         context is entered around the original forward, its second around each recompute.
         Ours enter the caller's own contexts (selective checkpointing's modes) inside them.
     Nothing else of torch's is replaced or read: no saved-tensor hooks, holders or frames.
     The choice over the alternatives: saved_tensors_hooks of our own would sit under torch's
     (the innermost hooks win) and see nothing of a region; `context_fn` can only be passed per
     call; wrapping `checkpoint` misses the partials above.
  2. Behaviour. torch's code runs the same function on the same tensors under the same RNG,
     autocast and contexts; ours emits events and keeps weak references, so gradients are
     bit-identical with and without a recording, and torch's own errors (use_reentrant=True
     under `torch.autograd.grad`, the recompute checks) raise as before: the observer never
     swallows an exception. With no recording here (another thread's is open) every call goes
     straight to torch's code.
  3. Release. A non-reentrant region: torch's frame holds `recompute_fn`, whose closure holds
     our recompute context, and the frame lives exactly as long as the region's saved tensors
     (each one's unpack hook refers to it). A `weakref.finalize` on that context therefore fires
     when the last saved tensor of the region is freed: `released` (reason
     ordinary_backward_complete) after a replay, `node_collected` before any (its outputs were
     dropped, or no backward needed it). A reentrant region: `released` when its backward
     returns (the engine frees the saved inputs then; with retain_graph=True it keeps them and
     a second backward replays again), `node_collected` when its node is collected before any
     backward (a finalize on the region object, which only ctx holds).
  4. Not observed, and said so (`trace.meta["unobserved"]`, which `ckpt-viz info` prints):
     non-reentrant calls with `debug=True` or torch's checkpoint debug on (torch refuses any
     context_fn then), calls under torch.compile tracing (the region is a higher-order op that
     never runs this code), and a torch whose checkpoint module lacks what rule 1 names or has
     another generator signature (nothing of that kind is observed; meta says why). A region
     whose forward ran before the recording opened runs torch's own classes: it is invisible.
  5. Modes. mode is "reentrant" or "nonreentrant" as for ckpt_viz's handles: the trace schema,
     the lifecycle (NOTE [ Handle states ]) and the renderers key on it, and the kind of
     checkpoint is the same concept; `handle_created`'s data["runtime"] = "torch" says whose
     handle it is (ckpt_viz's say "ckpt_viz" implicitly: no key). Handle ids come from the
     recording's numbering (NOTE [ Handle numbering ]), shared with ckpt_viz's own handles.
  6. Install and uninstall follow the autograd watch (NOTE [ What a recording captures ], rule 5,
     in recording.py): in place while at least one recording is open in the process; put back
     only where the module still holds ours (someone who replaced ours since keeps theirs).
"""
from __future__ import annotations

import functools
import inspect
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint as _tuc

from ckpt_viz import bus
from ckpt_viz.events import BackwardEntered, Released
from ckpt_viz.runtime.handover import carried
from ckpt_viz.runtime.torch_region import TorchRegion

__all__ = ["UNOBSERVED_KEY", "install", "notes", "uninstall"]

UNOBSERVED_KEY = "torch_checkpoint_unobserved"  # in a recording scope's `shared` dict: reason -> count
_GENERATOR = "_checkpoint_without_reentrant_generator"
_GENERATOR_PARAMS = ("fn", "preserve_rng_state", "context_fn", "determinism_check", "debug", "early_stop", "args",
                     "kwargs")
_REASONS = {
    "debug": "torch non-reentrant checkpoint with debug=True (torch accepts no context_fn with debug)",
    "compiling": "torch checkpoint under torch.compile tracing (a higher-order op; this code never runs)",
    "reentrant_missing": "torch reentrant checkpoint: this torch's torch.utils.checkpoint has no CheckpointFunction "
                         "class to observe",
    "generator_changed": "torch non-reentrant checkpoint: this torch's torch.utils.checkpoint has no "
                         f"{_GENERATOR}{_GENERATOR_PARAMS} to observe",
    "replaced": "torch checkpoint: another library replaced torch.utils.checkpoint's internals; not observed",
}
_LOCK = threading.Lock()
_installed = 0
_originals: dict[str, Any] = {}
_missing: list[str] = []  # reasons (keys of _REASONS) a kind cannot be observed in this torch at all


def _listening() -> Any:
    """This context's recording scope, or None when no recording listens here (NOTE rule 2)."""
    if not bus.enabled:
        return None
    scope = bus.current_scope()
    return scope if scope.channels else None


def _unobserved(scope: Any, reason: str) -> None:
    counts = scope.shared.setdefault(UNOBSERVED_KEY, Counter())
    counts[reason] += 1


def notes(scope: Any) -> list[dict[str, Any]]:
    """What this recording could not observe (NOTE rule 4): [{"what": words, "count": calls or None}]."""
    found: list[dict[str, Any]] = [{"what": _REASONS[r], "count": None} for r in _missing]
    counts = scope.shared.get(UNOBSERVED_KEY) if scope is not None else None
    for reason, count in sorted((counts or {}).items()):
        found.append({"what": _REASONS[reason], "count": count})
    return found


# ---------------------------------------------------------------- use_reentrant=True

_BASE: Any = getattr(_tuc, "CheckpointFunction", None)


def _reentrant_run(region: TorchRegion, run_function: Callable) -> Callable:
    """`run_function` as torch's CheckpointFunction calls it: once in forward, again (the replay) in backward."""

    def run(*args: Any) -> Any:
        if not region.state.forward_done:
            try:
                outputs = run_function(*args)
            except BaseException as exc:
                region.forward_ended(exc)
                raise
            region.forward_ended(None, outputs)
            return outputs
        if not bus.enabled:
            return run_function(*args)
        site = region.replay_started()
        try:
            outputs = run_function(*args)
        except BaseException as exc:
            region.replay_ended(exc, site)
            raise
        region.replay_ended(None, site)
        return outputs

    return run


def _reentrant_backward(ctx: Any, region: TorchRegion, grads: tuple) -> Any:
    state = region.state
    event = state.emit(BackwardEntered, grad_count=len(grads), capture_site=True)
    state.backward_site = event.site if event is not None else None
    try:
        result = _BASE.backward(ctx, *grads)
    except BaseException:
        if not state.released:
            state.released = True
            state.emit(Released, reason="backward_exception", was_replayed=state.replays > 0, site=state.backward_site)
        raise
    state.released = True  # NOTE rule 3: the engine frees the saved inputs now (retain_graph=False)
    state.emit(Released, reason="ordinary_backward_complete", was_replayed=state.replays > 0,
               site=state.backward_site)
    return result


if _BASE is not None:
    class CheckpointFunction(_BASE):  # type: ignore[misc, valid-type]
        """torch's `CheckpointFunction`, observed (NOTE [ Observing torch's checkpoint ], rule 1)."""

        @classmethod
        def apply(cls, *args: Any, **kwargs: Any) -> Any:
            # no recording here, or no graph to build (forward itself always runs with grad off): torch's own class
            if not torch.is_grad_enabled() or _listening() is None:
                return _BASE.apply(*args, **kwargs)
            return super().apply(*args, **kwargs)

        @staticmethod
        def forward(ctx: Any, run_function: Callable, preserve_rng_state: bool, *args: Any) -> Any:
            scope = _listening()
            if scope is None:
                return _BASE.forward(ctx, run_function, preserve_rng_state, *args)
            region = TorchRegion(run_function, "reentrant", scope)
            region.created(args, preserve_rng_state=bool(preserve_rng_state))
            ctx._ckpt_viz_region = region  # only ctx holds it: collected with the node (NOTE rule 3)
            return _BASE.forward(ctx, _reentrant_run(region, run_function), preserve_rng_state, *args)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            region = getattr(ctx, "_ckpt_viz_region", None)
            if region is None or not bus.enabled:
                return _BASE.backward(ctx, *grads)
            return carried(_reentrant_backward, ctx, region, grads)  # a device thread keeps the recording

    CheckpointFunction.__module__ = _BASE.__module__
    CheckpointFunction.__qualname__ = _BASE.__qualname__
else:  # pragma: no cover (a torch without it: NOTE rule 4)
    CheckpointFunction = None  # type: ignore[assignment, misc]


# ---------------------------------------------------------------- use_reentrant=False

class _ForwardContext:
    """Entered by torch around the original forward of a non-reentrant region, with the caller's inside."""

    __slots__ = ("args", "inner", "region")

    def __init__(self, region: TorchRegion, inner: Any, args: tuple, facts: dict[str, Any]) -> None:
        self.region, self.inner, self.args = region, inner, (args, facts)

    def __enter__(self) -> Any:
        (args, facts), self.args = self.args, ()
        self.region.created(args, **facts)
        region = self.region
        try:
            return self.inner.__enter__()
        except BaseException as exc:
            region.forward_ended(exc)
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            suppressed = self.inner.__exit__(exc_type, exc, tb)
        except BaseException as raised:
            self.region.forward_ended(raised)
            raise
        self.region.forward_ended(exc if exc is not None and not suppressed else None)
        return suppressed


class _RecomputeContext:
    """Entered by torch around each recompute; lives exactly as long as torch's frame (NOTE rule 3)."""

    __slots__ = ("__weakref__", "inner", "region", "site")

    def __init__(self, region: TorchRegion, inner: Any) -> None:
        self.region, self.inner, self.site = region, inner, None

    def __enter__(self) -> Any:
        self.site = self.region.replay_started() if bus.enabled else None
        try:
            return self.inner.__enter__()
        except BaseException as exc:
            self.region.replay_ended(exc, self.site)
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            suppressed = self.inner.__exit__(exc_type, exc, tb)
        except BaseException as raised:
            self.region.replay_ended(raised, self.site)
            raise
        if bus.enabled and self.region.state.replays:
            stopped = exc_type is not None and exc_type.__name__ == "_StopRecomputationError" \
                and exc_type.__module__ == _tuc.__name__  # torch's early stop: how a recompute ends early
            self.region.replay_ended(None if suppressed else exc, self.site, early_stopped=stopped)
        return suppressed


def _observed_context_fn(region: TorchRegion, context_fn: Callable, args: tuple, facts: dict[str, Any]) -> Callable:
    def contexts() -> tuple[Any, Any]:
        forward, recompute = context_fn()
        # only torch's frame (through recompute_fn's closure) holds the recompute context, and it the region
        return _ForwardContext(region, forward, args, facts), _RecomputeContext(region, recompute)

    return contexts


def _compiling() -> bool:
    if torch.compiler.is_compiling():
        return True
    check = getattr(_tuc, "_is_compiling", None)  # AOT / export tracing: read, never replaced
    try:
        return bool(check(None, (), {})) if check is not None else False
    except Exception:  # another signature: not ours to call
        return False


_BASE_GENERATOR: Any = getattr(_tuc, _GENERATOR, None)


def _observed_generator(fn: Callable, *rest: Any, **kwargs: Any) -> Any:
    """torch's non-reentrant generator, called with our context_fn (NOTE rule 1); torch's own otherwise."""
    original = _BASE_GENERATOR
    scope = _listening()
    if scope is None or len(rest) < 5 or not torch.is_grad_enabled():
        return original(fn, *rest, **kwargs)
    preserve, context_fn, determinism_check, debug, early_stop, *args = rest
    global_debug = getattr(_tuc, "_checkpoint_debug_enabled", None)
    if (global_debug if global_debug is not None else debug) or _compiling():
        _unobserved(scope, "debug" if not _compiling() else "compiling")
        return original(fn, *rest, **kwargs)
    region = TorchRegion(fn, "nonreentrant", scope)
    facts = {"preserve_rng_state": bool(preserve), "early_stop": bool(early_stop),
             "determinism_check": str(determinism_check)}
    observed = _observed_context_fn(region, context_fn, tuple(args), facts)
    return original(fn, preserve, observed, determinism_check, debug, early_stop, *args, **kwargs)


@functools.lru_cache(maxsize=4)  # torch's generator, read at each install: a record() block per step reads it once
def _generator_fits(generator: Any) -> bool:
    try:
        names = tuple(inspect.signature(generator).parameters)
    except (TypeError, ValueError):
        return False
    return names == _GENERATOR_PARAMS


# ---------------------------------------------------------------- install

def install() -> None:
    """Observe torch's checkpoint from now on (reference-counted; see NOTE rule 6)."""
    global _installed
    with _LOCK:
        _installed += 1
        if _installed > 1:
            return
        _missing.clear()
        current = getattr(_tuc, "CheckpointFunction", None)
        if CheckpointFunction is None or current is None:
            _missing.append("reentrant_missing")
        elif current is _BASE:
            _originals["CheckpointFunction"] = current
            _tuc.CheckpointFunction = CheckpointFunction
        elif current is not CheckpointFunction:
            _missing.append("replaced")
        generator = getattr(_tuc, _GENERATOR, None)
        if _BASE_GENERATOR is None or not _generator_fits(_BASE_GENERATOR):
            _missing.append("generator_changed")
        elif generator is _BASE_GENERATOR:
            _originals[_GENERATOR] = generator
            setattr(_tuc, _GENERATOR, _observed_generator)
        elif generator is not _observed_generator:
            _missing.append("replaced")


def uninstall() -> None:
    """Undo one `install()`; the last one puts torch's back where ours still are."""
    global _installed
    with _LOCK:
        _installed -= 1
        if _installed:
            return
        if _originals.get("CheckpointFunction") is not None and _tuc.CheckpointFunction is CheckpointFunction:
            _tuc.CheckpointFunction = _originals["CheckpointFunction"]
        if _originals.get(_GENERATOR) is not None and getattr(_tuc, _GENERATOR) is _observed_generator:
            setattr(_tuc, _GENERATOR, _originals[_GENERATOR])
        _originals.clear()
