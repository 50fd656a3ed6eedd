"""The one palette of every figure and page: a colour for each memory category, handle state and part of a step.

Every renderer and page takes its colours from here, so a memory category, a handle state, a
part of the step (forward, DX, DW) and the cursor look the same everywhere. The words for the
same things are `ckpt_viz.analysis.words`. Plain data; standard library only (never torch, a
chart library or a UI).

    CATEGORY_COLOURS["activations"]   -> "#e15759"   a memory category (bands, bars, table swatches)
    STATE_COLOURS["replayed"]         -> "#31a354"   a handle state, strong (lanes, marks)
    STATE_FILLS["replayed"]           -> "#d9f0d3"   the same state, light (graph regions behind text)
    ACTION_COLOURS["DX"]              -> "#2171b5"   a part of the step / pipeline action: F, DX, DW, B
    CURSOR_COLOUR                     -> "#d6008f"   the shared cursor; used by nothing else

NOTE [ One palette ]
  1. Hue families carry meaning across tables: DX is blue, DW orange and a full backward
     (both at once) purple, for actions, part bands, edge colours and the phase_dx /
     phase_dw states alike; green is a replay (the forward run again): the replaying /
     replayed / retained states and the replay_activations category; yellow is what a
     checkpoint keeps (the recorded state, the checkpoint_inputs category).
  2. Parameters are a neutral grey: they do not change during a step, so memory charts
     draw them as the base band, not as one more coloured layer on top.
  3. The cursor's magenta and the refusal's dark red appear in no other table (the tests
     check it), so the cursor never reads as a category.
"""
from __future__ import annotations

__all__ = [
    "ACTION_COLOURS",
    "BUBBLE_COLOURS",
    "CATEGORY_COLOURS",
    "CURSOR_COLOUR",
    "CURSOR_PICK",
    "MARK_COLOURS",
    "MODE_COLOURS",
    "PEAK_COLOUR",
    "STATE_COLOURS",
    "STATE_FILLS",
]

# -- memory categories: one per `ckpt_viz.vocabulary.MEMORY_CATEGORIES`, in its order (NOTE rules 1, 2)
CATEGORY_COLOURS: dict[str, str] = {
    "parameters": "#bab0ac",          # neutral grey: the base band, constant through a step
    "gradients": "#b07aa1",           # mauve
    "optimizer_state": "#79706e",     # dark warm grey: kept from step to step, like the parameters
    "optimizer_step": "#d7b5a6",      # light tan: the step's working tensors, gone when it returns
    "activations": "#e15759",         # red: what autograd saves for backward
    "checkpoint_inputs": "#edc948",   # yellow: what a checkpoint keeps (as the "recorded" state)
    "replay_activations": "#59a14f",  # green: rebuilt by a replay (as the replay states)
    "excluded_outputs": "#9c755f",    # brown: kept outputs of excluded (not recomputed) ops
    "inputs": "#499894",              # dark teal: what goes into the model
    "outputs": "#ff9da7",             # pink: what comes out of it
    "other": "#76b7b2",               # teal: your code's own tensors between the passes, caches
}

# -- handle states: one per `ckpt_viz.vocabulary.STATES`, in its order
STATE_COLOURS: dict[str, str] = {
    "not_created": "#ffffff",
    "recorded": "#fee391",
    "phase_dx": "#9ecae1",
    "phase_dw": "#fdae6b",
    "replaying": "#006d2c",
    "replayed": "#31a354",
    "retained": "#a1d99b",
    "released": "#d9d9d9",
    "collected": "#fcbba1",
}

STATE_FILLS: dict[str, str] = {  # light versions, for areas with text on them (graph regions)
    "not_created": "#ffffff",
    "recorded": "#fff7bc",
    "phase_dx": "#deebf7",
    "phase_dw": "#fee6ce",
    "replaying": "#c7e9c0",
    "replayed": "#d9f0d3",
    "retained": "#edf8e9",
    "released": "#f0f0f0",
    "collected": "#fcbba1",
}

# -- parts of a step and pipeline actions: one per `ckpt_viz.analysis.passes.PARTS`, in its order
ACTION_COLOURS: dict[str, str] = {
    "F": "#8cd17d",   # light green: forward
    "DX": "#2171b5",  # blue: input grads
    "DW": "#e6550d",  # orange: weight grads
    "B": "#756bb1",   # purple: full backward (DX and DW together)
}

# -- a device's step (the bubble figures of the schedule timeline): inside its actions, or idle
BUBBLE_COLOURS: dict[str, str] = {
    "busy": "#6e7781",  # grey: running an action
    "idle": "#f4b6b6",  # light red: the bubble
}

# -- runs compared side by side (Compare modes): one line colour per `ckpt_viz.vocabulary.RUN_MODES`
MODE_COLOURS: dict[str, str] = {
    "none": "#57606a",                 # grey: no checkpoint
    "nonreentrant": "#1b9e77",
    "reentrant": "#7570b3",
    "split-reentrant": "#a6761d",
    "split-nonreentrant": "#66a61e",
    "pipeline": "#e6ab02",
}

# -- marks (NOTE rule 3)
CURSOR_COLOUR = "#d6008f"            # magenta: the shared cursor
CURSOR_PICK = "cursor_pick"          # the name of every chart's click selection that moves the cursor
MARK_COLOURS: dict[str, str] = {
    "refused": "#a50f15",           # dark red cross: a refused replay
    "error": "#a50f15",
}
PEAK_COLOUR = "#1f2328"              # the peak's point: the text colour
