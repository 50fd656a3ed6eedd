"""Invocation state shared by a non-reentrant checkpoint's forward and its recomputes (spec 1.3).

Owns `create_recompute_contexts` (a forward context and a recompute context that
share one invocation), `get_recompute_state` / `is_recomputing` (what an excluded
region asks), and `compose_context_fns` (several `context_fn` factories as one).
Imports torch only through nothing; never the UI.

NOTE [ Invocation resources ]
  1. Both contexts of one pair share one invocation: an identity object and a dict
     of resources (the excluded-region cache lives there).
  2. Leaving the recompute context, or leaving either context with an exception,
     clears every resource (each one's `.clear()`), so a partially consumed cache
     cannot leak after an early stop. The forward context keeps them on success.
  3. The contexts are re-enterable objects (not `@contextmanager` generators), so a
     frame that recomputes once per graph task works with the default factory.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Callable
from typing import Any

__all__ = [
    "RecomputeState",
    "compose_context_fns",
    "create_recompute_contexts",
    "get_recompute_state",
    "is_recomputing",
]

_INVOCATION_IDS = itertools.count()


class _Invocation:
    __slots__ = ("invocation_id", "preserve_rng_state", "resources")

    def __init__(self, preserve_rng_state: bool = True) -> None:
        self.invocation_id = next(_INVOCATION_IDS)
        self.resources: dict[Any, Any] = {}
        self.preserve_rng_state = preserve_rng_state

    def clear(self) -> None:
        resources, self.resources = self.resources, {}
        for resource in resources.values():
            clear = getattr(resource, "clear", None)
            if clear is not None:
                clear()


class RecomputeState:
    """What code inside a checkpointed function can ask about its invocation."""

    __slots__ = ("invocation", "is_recomputing")

    def __init__(self, invocation: _Invocation, is_recomputing: bool) -> None:
        self.invocation = invocation
        self.is_recomputing = is_recomputing

    @property
    def invocation_id(self) -> int:
        return self.invocation.invocation_id

    @property
    def preserve_rng_state(self) -> bool:
        return self.invocation.preserve_rng_state

    def get_resource(self, key: Any, factory: Callable[[], Any]) -> Any:
        """The invocation's resource under `key`, created by `factory()` on first use."""
        resources = self.invocation.resources
        if key not in resources:
            resources[key] = factory()
        return resources[key]


_STATE: contextvars.ContextVar[RecomputeState | None] = contextvars.ContextVar("ckpt_viz_recompute_state",
                                                                                default=None)


def get_recompute_state() -> RecomputeState | None:
    """The state of the innermost checkpoint invocation running here, or None."""
    return _STATE.get()


def is_recomputing() -> bool:
    """True inside a non-reentrant checkpoint's recompute."""
    state = _STATE.get()
    return bool(state and state.is_recomputing)


class _StateContext:
    """Sets the recompute state for the block; see NOTE [ Invocation resources ], rule 2."""

    def __init__(self, invocation: _Invocation, recomputing: bool) -> None:
        self._state = RecomputeState(invocation, recomputing)
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> RecomputeState:
        self._tokens.append(_STATE.set(self._state))
        return self._state

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _STATE.reset(self._tokens.pop())
        if exc_type is not None or self._state.is_recomputing:
            self._state.invocation.clear()


def create_recompute_contexts(preserve_rng_state: bool = True) -> tuple[_StateContext, _StateContext]:
    """A (forward_context, recompute_context) pair sharing one invocation."""
    invocation = _Invocation(preserve_rng_state)
    return _StateContext(invocation, False), _StateContext(invocation, True)


class _Composed:
    """Enter several contexts in order and exit them in reverse; unwind on a failed entry."""

    def __init__(self, contexts: list[Any]) -> None:
        self._contexts = contexts
        self._stacks: list[contextlib.ExitStack] = []

    def __enter__(self) -> None:
        stack = contextlib.ExitStack()
        with stack:  # unwinds what entered if a later member fails
            for context in self._contexts:
                stack.enter_context(context)
            self._stacks.append(stack.pop_all())

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return bool(self._stacks.pop().__exit__(exc_type, exc, tb))


def compose_context_fns(*factories: Callable[[], Any]) -> Callable[[], tuple[Any, Any]]:
    """One `context_fn` whose contexts are those of `factories`, in order."""
    from ckpt_viz.runtime.state import noop_context_fn

    factories = tuple(f for f in factories if f is not noop_context_fn)
    if len(factories) == 1:
        return factories[0]

    def composed() -> tuple[_Composed, _Composed]:
        pairs = []
        for factory in factories:
            pair = factory()
            if not (isinstance(pair, tuple) and len(pair) == 2):
                return pair  # ExecutionState.capture reports the bad result
            pairs.append(pair)
        return _Composed([p[0] for p in pairs]), _Composed([p[1] for p in pairs])

    return composed
