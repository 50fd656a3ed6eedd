"""The short glossary of the app's Glossary page and the lessons: words a student meets on every page.

Plain data and the standard library (never torch or a UI): memory categories and handle
states come from their one table each (`ckpt_viz.analysis.words.CATEGORY_MEANINGS`,
`ckpt_viz.vocabulary.STATE_MEANINGS`); the terms and `SPLIT_COST` are said here once,
for the glossary, the memory page and the lessons alike.
"""
from __future__ import annotations

__all__ = ["SPLIT_COST", "TERMS", "glossary"]

SPLIT_COST = ("Why the split modes peak higher: DX replays each checkpointed block to reach its inputs, and the "
              "weights' gradients (DW) need that replay's saved activations too, so every replay is kept until "
              "DW runs. Between DX and DW all blocks' activations are live at once, about what the run without "
              "checkpointing keeps. That is the price of deferring DW to fill the pipeline bubble.")

TERMS: dict[str, str] = {
    "checkpoint": "Run a block's forward without keeping its activations, keeping only its inputs; in the "
                  "backward, run the forward again (the replay, or recompute) to rebuild them. Memory for time.",
    "non-reentrant": "torch's default checkpoint (use_reentrant=False): saved-tensor hooks put a holder in "
                     "place of each saved tensor; the first backward that unpacks one replays the block, "
                     "stopping early once every needed tensor is rebuilt.",
    "reentrant": "The older checkpoint (use_reentrant=True): a custom autograd function whose backward runs the "
                 "block's forward again and then a nested backward through it: the replay inside backward.",
    "DX": "The backward for the inputs' gradients (activations), which the previous pipeline stage waits for.",
    "DW": "The backward for the weights' gradients, which nobody waits for: it can run later, in the bubble.",
    "split backward": "Running DX and DW as two backward passes instead of one, so DW can wait (zero-bubble "
                      "pipeline schedules).",
    "handle": "ckpt_viz's record of one checkpoint's forward: what it kept, and its state (below).",
    "phase": "Which backward a handle serves next: DX, DW, or both (full).",
    "backward trigger": "An extra autograd input that makes DW reach a checkpoint whose weights are captured "
                        "(a closure) rather than passed in, so DW replays it.",
    "release": "Freeing a handle's rebuilt activations once no later backward needs them; a backward that asks "
               "after the release is refused.",
    "recompute session": "One replay shared by several backward passes (DX then DW): opened once, kept "
                         "(retained) between them, cleared at the end.",
    "prefire": "Replaying a checkpoint ahead of the backward that needs it, so the replay is ready when asked.",
    "excluded region": "An op inside a checkpoint whose output is kept from the forward and not recomputed.",
}


def glossary() -> dict[str, dict[str, str]]:
    """Sections of the glossary: {"Memory categories": {...}, "Handle states": {...}, "Terms": {...}}."""
    from ckpt_viz.analysis.words import CATEGORY_MEANINGS, CATEGORY_WORDS, STATE_WORDS
    from ckpt_viz.vocabulary import STATE_MEANINGS

    return {"Terms": dict(TERMS),
            "Memory categories": {CATEGORY_WORDS[c]: meaning for c, meaning in CATEGORY_MEANINGS.items()},
            "Handle states": {STATE_WORDS[s]: meaning for s, meaning in STATE_MEANINGS.items()},
            "Why split modes peak higher": {"split modes": SPLIT_COST}}
