"""The names of the runs ckpt_viz makes itself, without torch: built-in models and broken runs.

The CLI's parser reads these before anything imports torch, so `ckpt-viz info` and
`ckpt-viz export` start without it. What each name runs is `ckpt_viz.run.zoo` (the models)
and `ckpt_viz.run.broken` (the broken runs); tests/core/test_layering.py checks that the
names here are theirs. The run modes are `ckpt_viz.vocabulary.RUN_MODES` (`MODES` here is
that tuple, for the callers that read it from here).
"""
from __future__ import annotations

from ckpt_viz.vocabulary import RUN_MODES

__all__ = ["BROKEN_SCENARIO_NAMES", "BUILTIN_MODEL_NAMES", "DEFAULT_MODEL", "MODES"]

MODES: tuple[str, ...] = RUN_MODES
BUILTIN_MODEL_NAMES: tuple[str, ...] = ("mlp", "transformer", "dropout", "closure", "excluded", "pipeline")
DEFAULT_MODEL = "mlp"
# Broken runs to explore (`ckpt_viz.run.broken.BROKEN`, same names in the same order): each records one mistake.
BROKEN_SCENARIO_NAMES: tuple[str, ...] = (
    "dx-after-dw", "second-backward", "phase-never-set", "session-cleared-early", "prefire-after-backward",
    "outputs-dropped", "dw-without-trigger", "dx-without-retain-graph", "released-by-hand", "session-never-bound",
    "session-mismatch", "dw-skips-a-handle", "params-without-grad", "session-never-cleared", "replayed-twice",
    "unpacked-twice", "saved-count-mismatch", "metadata-mismatch", "unasked-accumulation",
    # replays that do not reproduce their forward (ckpt_viz.run.divergent)
    "cache-in-replay", "taps-appended-twice", "dropout-without-rng-state", "batchnorm-updated-twice",
)
