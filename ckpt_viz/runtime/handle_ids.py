"""Handle ids (spec D2): sequential, numbered per recording, shared by both checkpoint kinds.

Owns `new_handle_id` and `restart_handle_ids`. Standard library and the bus only.

NOTE [ Handle numbering ]
  1. Each outermost recording numbers the handles created in its scope (see NOTE
     [ Recording scopes ] in bus.py) from its own counter, kept in the scope's
     `shared` dict, so nested recordings and threads handed the recording share it,
     and two threads recording the same code at once get the ids a solo run gets.
     Handles created outside any recording use one process-wide counter.
  2. Ids never collide with a handle this thread can still reach: a new counter
     starts after the highest id still alive among the handles made outside any
     recording and those of this thread's earlier recordings (h0 when none is).
     Handles of other threads' recordings do not count, so they do not shift ids.
  3. `restart_handle_ids()` says whether the next recording here starts at h0, and
     restarts the process-wide counter when nothing numbered by it is alive. A run
     that must start at h0 and gets False collects garbage and asks again.
"""
from __future__ import annotations

import functools
import itertools
import threading
import weakref
from collections.abc import Iterator
from operator import call, is_not
from typing import Any

from ckpt_viz import bus

__all__ = ["new_handle_id", "restart_handle_ids"]

_KEY = "handle_ids"
_is_something = functools.partial(is_not, None)


class _Live:
    """The live objects among those added: a weak reference each, without a callback.

    A `weakref.WeakSet` costs a Python-level add and a Python callback when each handle
    dies (every checkpoint call, recorded or not); this keeps plain `weakref.ref`s and
    drops the dead ones while adding, once their number has doubled (amortized O(1)).
    Adding happens under `_LOCK`; reading (rare: a recording opening, a debug call)
    only filters.
    """

    __slots__ = ("_limit", "_refs")

    def __init__(self) -> None:
        self._refs: list[weakref.ref[Any]] = []
        self._limit = 64

    def add(self, owner: Any) -> None:
        refs = self._refs
        refs.append(weakref.ref(owner))
        if len(refs) >= self._limit:
            refs[:] = [r for r in refs if r() is not None]
            self._limit = max(64, 2 * len(refs))

    def alive(self) -> list[Any]:
        """The live objects, dropping the references to dead ones (call under `_LOCK`)."""
        owners = list(filter(_is_something, map(call, self._refs)))  # C-level passes: r() of each, not None
        if len(owners) < len(self._refs):  # weakref.ref(o) hands back o's existing plain reference
            self._refs, self._limit = list(map(weakref.ref, owners)), max(64, 2 * len(owners))
        return owners

    def __iter__(self) -> Iterator[Any]:
        return iter([owner for r in self._refs[:] if (owner := r()) is not None])

    def __len__(self) -> int:
        return sum(1 for r in self._refs[:] if r() is not None)


class _Numbering:
    __slots__ = ("ids", "live", "thread")

    def __init__(self, start: int, thread: int | None) -> None:
        self.ids = itertools.count(start)
        self.live = _Live()
        self.thread = thread


_OUTSIDE = _Numbering(0, None)  # handles created outside any recording
_RECORDED: list[_Numbering] = []  # recordings' numberings that may still have live handles
_LIVE = _Live()  # every handle and frame still alive, whoever numbered it
_LOCK = threading.Lock()


def _reachable() -> list[_Numbering]:
    """This thread's numberings with live handles, and the process-wide one; see NOTE rule 2."""
    me = threading.get_ident()
    _RECORDED[:] = [n for n in _RECORDED if n.live.alive()]
    return [_OUTSIDE, *(n for n in _RECORDED if n.thread == me)]


def _first_free() -> int:
    alive = [getattr(owner, "handle_id", -1) for n in _reachable() for owner in n.live.alive()]
    return max(alive, default=-1) + 1


_UNSET: Any = object()


def new_handle_id(owner: Any = None, scope: Any = _UNSET) -> int:
    """Next handle id of this context's recording (or the process-wide one outside recordings).

    `scope`: `bus.current_scope()` when the caller has just read it (None: no recording listens).
    """
    if scope is _UNSET:
        scope = bus.current_scope() if bus.enabled else None
    with _LOCK:
        if scope is None or not scope.channels:
            numbering = _OUTSIDE
        else:
            numbering = scope.shared.get(_KEY)
            if numbering is None:
                numbering = scope.shared[_KEY] = _Numbering(_first_free(), threading.get_ident())
                _RECORDED.append(numbering)
        handle_id = next(numbering.ids)
        if owner is not None:
            numbering.live.add(owner)
            _LIVE.add(owner)
    return handle_id


def restart_handle_ids() -> bool:
    """Say whether the next recording opened here numbers from h0; see NOTE [ Handle numbering ], rule 3."""
    global _OUTSIDE
    with _LOCK:
        if any(n.live.alive() for n in _reachable()):
            return False
        _OUTSIDE = _Numbering(0, None)
        return True
