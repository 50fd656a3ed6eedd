"""Lessons: step through checkpointing and split backward on real runs, each claim checked.

Torch-free at import. `load_lessons()` reads lessons/ (see lessons/README.md); a step's
script records its trace on first use (`ckpt_viz.lessons.runner`).
"""
