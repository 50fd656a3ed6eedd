"""The context of the code that launched the running backward: the bus's fallback on autograd worker threads.

See NOTE [ Recording scopes ], rule 5, in ckpt_viz/bus.py (which re-exports these names). Standard
library only.
"""
from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, TypeVar, overload

__all__ = ["context_value", "launch_context", "set_launch_context"]

_launch_context: Callable[[], contextvars.Context | None] | None = None
_MISSING: Any = object()
_T = TypeVar("_T")


def set_launch_context(fn: Callable[[], contextvars.Context | None] | None) -> None:
    """Install the reader of the context that launched the running backward; see NOTE [ Recording scopes ], rule 5."""
    global _launch_context
    _launch_context = fn


def launch_context() -> contextvars.Context | None:
    """The context of the code that launched the running backward, if the engine carries one here."""
    return reader() if (reader := _launch_context) is not None else None


@overload
def context_value(var: contextvars.ContextVar[_T | None], default: _T) -> _T: ...
@overload
def context_value(var: contextvars.ContextVar[_T | None], default: None = None) -> _T | None: ...


def context_value(var: contextvars.ContextVar[Any], default: Any = None) -> Any:
    """`var`'s value in this context, else in the backward's launch context, else `default`."""
    value = var.get(_MISSING)
    if value is _MISSING or value is None:
        launched = launch_context()
        if launched is not None:
            value = launched.get(var, value)
    return default if value is _MISSING or value is None else value
