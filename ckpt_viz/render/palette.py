"""The one palette and vocabulary of every figure and page: colours and words for categories, states, actions.

Every renderer and page takes its colours and its user-facing words from here, so a
memory category, a handle state, a pass (forward, DX, DW) and the cursor look and read
the same everywhere. Plain data; standard library only (never torch, a chart library
or a UI).

    CATEGORY_COLOURS["activations"]   -> "#e15759"   a memory category (bands, bars, table swatches)
    STATE_COLOURS["replayed"]         -> "#31a354"   a handle state, strong (lanes, marks)
    STATE_FILLS["replayed"]           -> "#c7e9c0"   the same state, light (graph regions behind text)
    ACTION_COLOURS["DX"]              -> "#2171b5"   a pass / pipeline action: F, DX, DW, B
    CURSOR_COLOUR                     -> "#d6008f"   the shared cursor; used by nothing else
    phase_word("dx") -> "DX";  state_word("phase_dx") -> "waiting for DX";  category_word("checkpoint_inputs")

NOTE [ One palette ]
  1. Hue families carry meaning across tables: DX is blue, DW orange and a full backward
     (both at once) purple, for actions, phase bands, edge colours and the phase_dx /
     phase_dw states alike; green is a replay (the forward run again): the replaying /
     replayed / retained states and the replay_activations category; yellow is what a
     checkpoint keeps (the recorded state, the checkpoint_inputs category).
  2. Parameters are a neutral grey: they do not change during a step, so memory charts
     draw them as the base band, not as one more coloured layer on top.
  3. The cursor's magenta and the refusal's dark red appear in no other table (the tests
     check it), so the cursor never reads as a category.
  4. Spellings: "DX" and "DW" (never "dX"/"dx" in text shown to a user), "forward",
     "full backward"; state words come from `STATE_WORDS`, their meanings from
     `ckpt_viz.trace.lifecycle.STATE_MEANINGS`; the raw keys stay in data and tooltips' ids.
"""
from __future__ import annotations

__all__ = [
    "ACTIONS",
    "ACTION_COLOURS",
    "ACTION_WORDS",
    "CATEGORY_COLOURS",
    "CATEGORY_MEANINGS",
    "CATEGORY_WORDS",
    "CURSOR_COLOUR",
    "CURSOR_PICK",
    "MARK_COLOURS",
    "MODE_COLOURS",
    "PEAK_COLOUR",
    "PHASE_ACTION",
    "PHASE_WORDS",
    "REASON_WORDS",
    "STATE_COLOURS",
    "STATE_FILLS",
    "STATE_WORDS",
    "action_word",
    "category_word",
    "phase_word",
    "reason_word",
    "state_word",
]

# -- memory categories: one per `ckpt_viz.trace.MEMORY_CATEGORIES`, in its order (NOTE rules 1, 2)
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

CATEGORY_WORDS: dict[str, str] = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "optimizer_step": "optimizer step",
    "activations": "activations",
    "checkpoint_inputs": "checkpoint inputs",
    "replay_activations": "replay activations",
    "excluded_outputs": "excluded outputs",
    "inputs": "inputs",
    "outputs": "outputs",
    "other": "other",
}

CATEGORY_MEANINGS: dict[str, str] = {
    "parameters": "The model's weights (nn.Parameter storages). They stay the same size for the whole step.",
    "gradients": "The parameters' .grad tensors, filled by the backward (by DW in split modes), and during a "
                 "backward the gradients flowing between the ops before they land in a .grad.",
    "optimizer_state": "The optimizer's state, kept from step to step (AdamW: two running averages per "
                       "parameter and a step count).",
    "optimizer_step": "Working tensors the optimizer's step() makes and frees while it runs (not its state): "
                      "one parameter's worth at a time in torch's per-parameter loop, all parameters' at once "
                      "in a foreach step.",
    "activations": "Tensors autograd saved for backward outside any checkpoint: what checkpointing avoids keeping.",
    "checkpoint_inputs": "The inputs a checkpoint keeps instead of its activations, to re-run its forward later.",
    "replay_activations": "Activations rebuilt by a replay (the recompute), kept until the backward that needs "
                          "them is done; in split modes until DW.",
    "excluded_outputs": "Outputs of excluded ops inside a checkpoint, kept so the replay does not recompute them.",
    "inputs": "The tensors passed to the model (a top-level module's arguments) and those given to "
              "record(tensors=...), while nothing above holds them.",
    "outputs": "What the model returns (the logits, an HF model's loss), while your code keeps it.",
    "other": "Everything else that is live: the forward's working tensors that no backward keeps, tensors your "
             "own code makes between the forward, the backward and the optimizer's step (a loss computed "
             "outside the model, a batch made in the block), caches, and tensors from before the block that "
             "nothing here holds.",
}

# -- handle states: one per `ckpt_viz.trace.lifecycle.STATES`, in its order
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

STATE_WORDS: dict[str, str] = {
    "not_created": "not created yet",
    "recorded": "recorded",
    "phase_dx": "waiting for DX",
    "phase_dw": "waiting for DW",
    "replaying": "replaying",
    "replayed": "replayed",
    "retained": "retained",
    "released": "released",
    "collected": "collected",
}

# -- passes and pipeline actions (ckpt_viz.run.schedules: "F", "DX", "DW", "B")
ACTIONS: tuple[str, ...] = ("F", "DX", "DW", "B")

ACTION_COLOURS: dict[str, str] = {
    "F": "#8cd17d",   # light green: forward
    "DX": "#2171b5",  # blue: input grads
    "DW": "#e6550d",  # orange: weight grads
    "B": "#756bb1",   # purple: full backward (DX and DW together)
}

ACTION_WORDS: dict[str, str] = {
    "F": "forward",
    "DX": "DX (input grads)",
    "DW": "DW (weight grads)",
    "B": "full backward",
}

PHASE_WORDS: dict[str, str] = {"ordinary": "ordinary", "dx": "DX", "dw": "DW"}
PHASE_ACTION: dict[str, str] = {"ordinary": "B", "dx": "DX", "dw": "DW"}  # a backward in that phase

# -- release reasons (`ckpt_viz.events.RELEASE_REASONS` and the lifecycle's derived ones) in words
REASON_WORDS: dict[str, str] = {
    "ordinary_backward_complete": "its backward finished",
    "dw_complete": "DW finished",
    "backward_exception": "the backward raised",
    "forward_exception": "the forward raised",
    "session_cleared": "its recompute session was cleared",
    "explicit_release": "the code released it",
    "consumed": "the backward used every recomputed tensor",
    "released": "it was already released",
    "collected": "its autograd node was already collected",
}

# -- runs compared side by side (Compare modes): one line colour per mode
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


def category_word(category: str) -> str:
    """"checkpoint_inputs" -> "checkpoint inputs" (unknown names come back with underscores as spaces)."""
    return CATEGORY_WORDS.get(category, category.replace("_", " "))


def state_word(state: str) -> str:
    """"phase_dx" -> "waiting for DX"."""
    return STATE_WORDS.get(state, state.replace("_", " "))


def phase_word(phase: str | None) -> str:
    """"dx" -> "DX", "dw" -> "DW", "ordinary" -> "ordinary", None -> ""."""
    return "" if phase is None else PHASE_WORDS.get(phase, phase)


def action_word(action: str) -> str:
    """"DX" -> "DX (input grads)"."""
    return ACTION_WORDS.get(action, action)


def reason_word(reason: str | None) -> str:
    """"dw_complete" -> "DW finished" (unknown reasons with underscores as spaces; None -> "")."""
    return "" if reason is None else REASON_WORDS.get(reason, reason.replace("_", " "))
