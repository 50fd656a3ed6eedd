"""The names of the runs ckpt_viz makes itself, without torch: run modes and built-in models.

The CLI's parser reads these before anything imports torch, so `ckpt-viz info` and
`ckpt-viz export` start without it. What each name runs is `ckpt_viz.run.scenarios`
(the modes) and `ckpt_viz.run.zoo` (the models); tests/core/test_layering.py checks
that the names here are theirs.
"""
from __future__ import annotations

__all__ = ["BROKEN_SCENARIO_NAMES", "BUILTIN_MODEL_NAMES", "DEFAULT_MODEL", "MODES"]

MODES: tuple[str, ...] = ("none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant", "pipeline")
BUILTIN_MODEL_NAMES: tuple[str, ...] = ("mlp", "transformer", "dropout", "closure", "excluded", "pipeline")
DEFAULT_MODEL = "mlp"
# Broken runs to explore (`ckpt_viz.run.broken.BROKEN`, same names in the same order): each records one mistake.
BROKEN_SCENARIO_NAMES: tuple[str, ...] = (
    "dx-after-dw", "second-backward", "phase-never-set", "session-cleared-early", "prefire-after-backward",
    "outputs-dropped", "dw-without-trigger", "dx-without-retain-graph", "released-by-hand", "session-never-bound",
    "session-mismatch", "dw-skips-a-handle", "params-without-grad", "session-never-cleared", "replayed-twice",
    "unpacked-twice", "saved-count-mismatch", "metadata-mismatch",
    # replays that do not reproduce their forward (ckpt_viz.run.divergent)
    "cache-in-replay", "taps-appended-twice", "dropout-without-rng-state", "batchnorm-updated-twice",
)
