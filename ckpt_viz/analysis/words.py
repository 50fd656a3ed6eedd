"""The words of every page, the CLI and the lessons: one word for each state, phase, part of the step,
release reason and memory category, and one sentence for an event.

Said once here, so the Overview, the Handles page, `ckpt-viz info` and a lesson never name the same
thing twice in two ways ("phase_dw" beside "waiting for DW"). Raw keys stay in data and tooltips'
ids; everything a person reads goes through these. Standard library only.

    state_word("phase_dx")            -> "waiting for DX"
    reason_word("dw_complete")        -> "DW finished"
    category_word("checkpoint_inputs") -> "checkpoint inputs"
    describe_event(e, labels={3: "blocks.3"})
        -> "seq 49 · released · h3 blocks.3 · DW pass · because DW finished · train.py:77"
"""
from __future__ import annotations

from collections.abc import Mapping

from ckpt_viz.events import (
    Error,
    Event,
    ForwardFailed,
    HandleCreated,
    MemorySampled,
    PhaseSet,
    Released,
    ReplayFailed,
    ReplayFinished,
    ReplayRefused,
    ReplayStarted,
    TensorPacked,
)

__all__ = [
    "CATEGORY_MEANINGS",
    "CATEGORY_WORDS",
    "PART_WORDS",
    "PHASE_WORDS",
    "REASON_WORDS",
    "STATE_WORDS",
    "category_word",
    "describe_event",
    "format_bytes",
    "part_word",
    "phase_word",
    "reason_word",
    "state_word",
]

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

PHASE_WORDS: dict[str, str] = {"ordinary": "ordinary", "dx": "DX", "dw": "DW"}

PART_WORDS: dict[str, str] = {"F": "forward", "DX": "DX (input grads)", "DW": "DW (weight grads)",
                              "B": "full backward"}

REASON_WORDS: dict[str, str] = {
    "ordinary_backward_complete": "its backward finished",
    "dw_complete": "DW finished",
    "backward_exception": "the backward raised",
    "forward_exception": "the forward raised",
    "session_cleared": "its recompute session was cleared",
    "explicit_release": "the code released it",
    "consumed": "the backward used every recomputed tensor",
    "released": "it was already released",
    "node_collected": "its autograd node was already collected",
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

_TRIGGERS = {"backward": "a backward", "prefire": "a prefire (ahead of the backward)"}


def state_word(state: str) -> str:
    """"phase_dx" -> "waiting for DX"."""
    return STATE_WORDS.get(state, state.replace("_", " "))


def phase_word(phase: str | None) -> str:
    """"dx" -> "DX", "dw" -> "DW", "ordinary" -> "ordinary", None -> ""."""
    return "" if phase is None else PHASE_WORDS.get(phase, phase)


def part_word(part: str) -> str:
    """"DX" -> "DX (input grads)"."""
    return PART_WORDS.get(part, part)


def reason_word(reason: str | None) -> str:
    """"dw_complete" -> "DW finished" (unknown reasons with underscores as spaces; None -> "")."""
    return "" if reason is None else REASON_WORDS.get(reason, reason.replace("_", " "))


def category_word(category: str) -> str:
    """"checkpoint_inputs" -> "checkpoint inputs"."""
    return CATEGORY_WORDS.get(category, category.replace("_", " "))


def format_bytes(nbytes: float) -> str:
    """1536 -> "1.5 KiB"."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop returns at GiB


def _facts(event: Event) -> list[str]:
    """The one or two facts of an event that matter to a reader."""
    if isinstance(event, HandleCreated):
        return ["split DX/DW"] if event.split else []
    if isinstance(event, PhaseSet):
        return [f"phase set to {phase_word(event.new)}"]
    if isinstance(event, (ReplayStarted, ReplayFinished)):
        return [f"for {_TRIGGERS.get(event.trigger, event.trigger)}"]
    if isinstance(event, ReplayRefused):
        return [f"refused because {reason_word(event.reason)}"]
    if isinstance(event, Released):
        return [f"because {reason_word(event.reason)}"]
    if isinstance(event, MemorySampled):
        return [f"at {event.at}"] if event.at else []
    if isinstance(event, (Error, ForwardFailed, ReplayFailed)):
        first = event.message.splitlines()[0] if event.message.strip() else ""
        return [event.type, *([first] if first else [])]
    if isinstance(event, TensorPacked):
        return [f"{format_bytes(event.nbytes)} saved"]
    return []


def describe_event(event: Event, labels: Mapping[int, str] | None = None) -> str:
    """One event in words: seq, what happened, which handle (with its block's name), the DX/DW pass, the facts
    that matter, the stage and micro-batch, the user's file:line."""
    parts = [f"seq {event.seq}", event.kind.replace("_", " ")]
    if event.handle_id is not None:
        name = (labels or {}).get(event.handle_id)
        parts.append(f"h{event.handle_id} {name}" if name else f"h{event.handle_id}")
    if event.phase in ("dx", "dw"):
        parts.append(f"{phase_word(event.phase)} pass")
    parts.extend(_facts(event))
    tags = event.tags or {}
    if tags.get("rank") is not None:
        parts.append(f"rank {tags['rank']}")
    if tags.get("stage") is not None:
        parts.append(f"stage {tags['stage']}")
    if tags.get("microbatch") is not None:
        parts.append(f"micro-batch {tags['microbatch']}")
    if event.site:
        parts.append(event.site)
    return " · ".join(parts)
