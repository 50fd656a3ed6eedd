"""Runs that share torch's random number generator, which is one per process.

NOTE [ One generator per process ]
  1. torch's default CPU generator is process-wide, and two runs on two threads (two
     app sessions) use it at once: a model with dropout draws its masks from it, and
     every checkpoint replay sets it to the state saved at forward and back again
     (`preserve_rng_state`), whether or not the model draws anything. A run with
     dropout beside any other run would get other masks, so other gradients, than
     the same run alone.
  2. So `RNG` is a shared/exclusive lock. A run whose model draws random numbers
     (`draws_random`: an active dropout), and building a built-in model (seeded
     weights and inputs), hold it alone; every other run holds it shared, so runs of
     models that draw nothing still run side by side: setting the generator back and
     forth changes nothing for a run that never reads it.
  3. Waiting exclusive holders go first: shared holders arriving after one waits,
     wait behind it.
Imports torch; never the UI.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from torch import nn

__all__ = ["RNG", "SharedLock", "draws_random", "rng_guard"]


class SharedLock:
    """Held by many at once (`shared()`), or by one alone (`alone()`); not reentrant."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._alone = False
        self._waiting = 0  # exclusive holders waiting; see NOTE [ One generator per process ], rule 3

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._alone and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._alone and not self._shared)
            self._waiting -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()


RNG = SharedLock()


def draws_random(model: nn.Module) -> bool:
    """Whether running `model` in training mode draws from torch's generator (a dropout with p > 0)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training for m in model.modules())


def rng_guard(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Hold `RNG` for a run of `model`: alone if it draws random numbers, else shared (see the NOTE)."""
    return RNG.alone() if draws_random(model) else RNG.shared()
