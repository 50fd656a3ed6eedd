"""`checkpoint_sequential`: checkpoint a chain of modules in equal segments, as torch does.

Owns the segmenting rule and its argument checks; each segment goes through
`ckpt_viz.runtime.checkpoint`, so it is a handle like any other (split inside
`reentrant_checkpoint_scope`). Imports torch; never the UI.

NOTE [ Segments ]
  1. An `nn.Sequential` is split into its children; any other sequence is used as is.
  2. `size = len(functions) // segments`. The first `segments - 1` segments, of
     `size` functions each, are checkpointed; the rest (the last segment plus the
     remainder of the division) runs without checkpoint, so its activations are
     kept for the loss.
     Example: 10 functions, 3 segments -> size 3: [0:3] and [3:6] checkpointed,
     [6:10] runs normally.
  3. One input flows through the chain, as in `nn.Sequential`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ckpt_viz.errors import CheckpointUsageError
from ckpt_viz.runtime import session as _session
from ckpt_viz.runtime.checkpoint import checkpoint, default_use_reentrant

__all__ = ["checkpoint_sequential"]

_API = "ckpt_viz.checkpoint_sequential"


class _Segment:
    """Runs `functions[start:stop]` in order; named after its slice in events and traces."""

    def __init__(self, functions: Sequence[Callable], start: int, stop: int) -> None:
        self.functions = functions
        self.start = start
        self.stop = stop
        self.__qualname__ = f"checkpoint_sequential[{start}:{stop}]"

    def __call__(self, value: Any) -> Any:
        for index in range(self.start, self.stop):
            value = self.functions[index](value)
        return value


def _bad(message: str) -> CheckpointUsageError:
    return _session.emit_error(CheckpointUsageError(f"{_API}: {message}"), "checkpoint_sequential")


def checkpoint_sequential(functions: Sequence[Callable] | torch.nn.Sequential, segments: int, input: Any,
                          use_reentrant: bool | None = None, **kwargs: Any) -> Any:
    """Run `functions` one after another on `input`, checkpointing all but the last segment.

    Args:
        functions: an `nn.Sequential`, or a list of modules or functions.
        segments: how many segments to cut the chain into (1 to len(functions)).
        input: what the first function receives.
        use_reentrant: as for `checkpoint`; omitting it warns and selects True, as in torch 2.13.
        preserve_rng_state: the only keyword accepted (default True).

    Returns:
        The output of the last function. See NOTE [ Segments ].
    """
    if use_reentrant is None:
        use_reentrant = default_use_reentrant(_API)
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise _bad(f"Unexpected keyword arguments: {','.join(kwargs)}.\n"
                   "Tip: checkpoint_sequential takes only preserve_rng_state; use checkpoint() per segment for more.")
    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())
    count = len(functions)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= count:
        raise _bad(f"segments must be an int from 1 to len(functions) = {count}, got {segments!r}.\n"
                   "Tip: pass at most one segment per function; segments=1 checkpoints nothing.")
    size = count // segments
    stop = 0
    for start in range(0, size * (segments - 1), size):
        stop = start + size
        input = checkpoint(_Segment(functions, start, stop), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return _Segment(functions, stop, count)(input)
