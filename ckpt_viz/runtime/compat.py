"""The global switches of `torch.utils.checkpoint`, under the same names.

Owns `set_checkpoint_early_stop`, `set_checkpoint_debug_enabled` and
`GraphExecGroup`, and the small lookups the runtime makes of them. Imports torch and
the session module; never the UI.

NOTE [ Forward-time switches ]
  1. `set_checkpoint_early_stop(enable)` and `set_checkpoint_debug_enabled(enabled)`
     are read when a checkpoint's *forward* runs, as in torch: a checkpoint created
     inside the block keeps the setting even if its backward runs outside. A value
     other than None wins over the `early_stop` / `debug` keyword; None defers to it.
  2. Like torch's, they are process-wide (not per thread or per context), so a
     forward run on a helper thread sees them too.
  3. `GraphExecGroup` is read when a saved tensor is *unpacked*. It is stored where
     torch stores its own group, so torch carries it onto autograd worker threads,
     and a torch checkpoint inside our group (or ours inside torch's) is grouped too.
     A non-reentrant frame unpacked under our group uses the group's session id as
     its recompute key: it joins that session (`session_bound`), recomputes once for
     every backward in the block, and the session is cleared when the block ends.
     Each saved tensor is still consumed once, so two overlapping backward calls
     raise, as in torch. Reentrant checkpoints ignore the group, as in torch.
"""
from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Hashable, Iterator
from typing import Any

import torch

from ckpt_viz.errors import CheckpointError, CheckpointUsageError
from ckpt_viz.runtime import session as _session

__all__ = ["GraphExecGroup", "debug_override", "early_stop_override", "group_key", "set_checkpoint_debug_enabled",
           "set_checkpoint_early_stop"]

_early_stop: bool | None = None
_debug: bool | None = None


def _check_switch(api: str, name: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise _session.emit_error(CheckpointUsageError(
            f"{api}: {name} must be bool or None, got {type(value).__name__} {value!r}.\n"
            "Tip: pass True or False, or None to defer to each checkpoint's own keyword."), api)


@contextlib.contextmanager
def set_checkpoint_early_stop(enable: bool | None) -> Iterator[None]:
    """Force early stop on (True) or off (False) for checkpoints whose forward runs in the block.

    Wins over the `early_stop` keyword of `checkpoint`; None defers to it. See
    NOTE [ Forward-time switches ], rule 1.
    """
    global _early_stop
    _check_switch("ckpt_viz.set_checkpoint_early_stop", "enable", enable)
    previous, _early_stop = _early_stop, enable
    try:
        yield
    finally:
        _early_stop = previous


@contextlib.contextmanager
def set_checkpoint_debug_enabled(enabled: bool | None) -> Iterator[None]:
    """Turn the debug story on (True) or off (False) for checkpoints whose forward runs in the block.

    With debug on, an error raised while such a checkpoint replays (or is refused a
    replay) carries that handle's story: its events, one short line each. Wins over
    the `debug` keyword of `checkpoint`; None defers to it.
    """
    global _debug
    _check_switch("ckpt_viz.set_checkpoint_debug_enabled", "enabled", enabled)
    previous, _debug = _debug, enabled
    try:
        yield
    finally:
        _debug = previous


def early_stop_override() -> bool | None:
    """The value of the innermost `set_checkpoint_early_stop`, or None."""
    return _early_stop


def debug_override() -> bool | None:
    """The value of the innermost `set_checkpoint_debug_enabled`, or None."""
    return _debug


class GraphExecGroup:
    """Backward calls inside the block recompute each non-reentrant checkpoint at most once.

    For a DX pass and a DW pass of the same region (`autograd.grad` for the inputs,
    then `backward(inputs=params)`): one recompute instead of two. The passes must
    not need the same saved tensor (torch's rule). See NOTE [ Forward-time
    switches ], rule 3. Not nestable.
    """

    _ids = itertools.count()

    def __init__(self) -> None:
        self.session_id = f"GraphExecGroup#{next(GraphExecGroup._ids)}"
        self._frames: weakref.WeakSet[Any] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"<ckpt_viz GraphExecGroup {self.session_id}>"

    def __enter__(self) -> GraphExecGroup:
        current = torch._C._get_graph_exec_group()
        if current is not None:
            raise _session.emit_error(CheckpointError(
                f"ckpt_viz.GraphExecGroup: GraphExecGroup contexts cannot be nested. Already inside group {current!r}."
                "\nTip: use one group around all the backward calls of one step."), "GraphExecGroup")
        torch._C._set_graph_exec_group(self)
        return self

    def __exit__(self, *exc: object) -> None:
        torch._C._set_graph_exec_group(None)
        if len(self._frames):
            _session.clear_recompute_session(self.session_id)


def group_key(frame: Any) -> Hashable | None:
    """The recompute key a frame unpacked now must use under a GraphExecGroup, or None outside one."""
    group = torch._C._get_graph_exec_group()
    if group is None:
        return None
    if not isinstance(group, GraphExecGroup):
        return group  # torch's own group object: keyed by identity, as torch does
    if frame not in group._frames:
        group._frames.add(frame)
        _session.register(frame, group.session_id)
    return group.session_id
