"""`derived(trace, key, build)`: a result computed once per trace (while the trace is unchanged).

Every fact the analysis derives is built by one function and kept on the trace it came from (`Trace._derived`),
so the pages, the CLI and the lessons that ask for it share one object. A trace that grows (a recording still
open) or has its lists replaced is seen as changed and the result is built again. Standard library only.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from ckpt_viz.trace import Trace

__all__ = ["derived"]

T = TypeVar("T")


def _version(trace: Trace) -> tuple[int, ...]:
    return (id(trace.events), len(trace.events), id(trace.memory), len(trace.memory), id(trace.graphs),
            len(trace.graphs), id(trace.meta))


def derived(trace: Trace, key: Any, build: Callable[[Trace], T]) -> T:
    """`build(trace)`, computed on the first call for `key` and kept while the trace is unchanged."""
    version = _version(trace)
    found = trace._derived.get(key)
    if found is not None and found[0] == version:
        return cast(T, found[1])  # what `build` returned for this key (`Trace._derived` holds any type)
    value = build(trace)
    trace._derived[key] = (version, value)
    return value
