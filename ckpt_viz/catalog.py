"""The names of the runs ckpt_viz makes itself, without torch: run modes and built-in models.

The CLI's parser reads these before anything imports torch, so `ckpt-viz info` and
`ckpt-viz export` start without it. What each name runs is `ckpt_viz.run.scenarios`
(the modes) and `ckpt_viz.run.zoo` (the models); tests/core/test_layering.py checks
that the names here are theirs.
"""
from __future__ import annotations

__all__ = ["BUILTIN_MODEL_NAMES", "DEFAULT_MODEL", "MODES"]

MODES: tuple[str, ...] = ("none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant", "pipeline")
BUILTIN_MODEL_NAMES: tuple[str, ...] = ("mlp", "transformer", "dropout", "closure", "excluded", "pipeline")
DEFAULT_MODEL = "mlp"
