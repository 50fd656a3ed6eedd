"""At every seq of every built-in run, the lanes, the TraceIndex and the CLI summary name the same handle states.

Each is read the way a user sees it: the lane bar that covers the seq, the index's
`handle_states`, and the "handle states at event N" block of `ckpt-viz info --at N`.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import Counter

import pytest

from ckpt_viz.cli.info import handle_states_block, summarize
from ckpt_viz.render.swimlane import lifecycle_intervals
from ckpt_viz.run.scenarios import MODES, run_scenario
from ckpt_viz.run.zoo import BUILTIN_MODELS, build_builtin
from ckpt_viz.trace import Trace
from ckpt_viz.trace.index import TraceIndex
from ckpt_viz.trace.lifecycle import STATE_MEANINGS, STATES

# Every built-in model in every mode it runs in (the pipeline mode needs a model with stages).
RUNS = [(model, mode) for model in BUILTIN_MODELS for mode in MODES
        if mode != "pipeline" or build_builtin(model).stages]


def lane_states(trace: Trace):
    """seq -> {handle: state} read from the lane bars (a handle without a bar there is not_created)."""
    bars: dict[int, list[tuple[int, int, str]]] = {}
    for row in lifecycle_intervals(trace):
        if row["kind"] == "interval":
            bars.setdefault(row["handle_id"], []).append((row["start_seq"], row["end_seq"], row["state"]))

    def at(seq: int) -> dict[int, str]:
        out = {}
        for h, rows in bars.items():
            i = bisect_right([start for start, _, _ in rows], seq) - 1
            out[h] = rows[i][2] if i >= 0 and rows[i][0] <= seq < rows[i][1] else "not_created"
        return out

    return at


def cli_counts(trace: Trace, seq: int) -> dict[str, int]:
    """The counts printed under "handle states at event <seq>:", checked against the meanings shown."""
    head, *lines = handle_states_block(trace, seq)
    assert head == f"handle states at event {seq}:"
    counts = {}
    for line in lines:
        state, n, meaning = line.split(maxsplit=2)
        assert meaning == STATE_MEANINGS[state]
        counts[state] = int(n)
    return counts


@pytest.mark.slow
@pytest.mark.parametrize(("model", "mode"), RUNS, ids=[f"{m}-{mode}" for m, mode in RUNS])
def test_lanes_index_and_cli_agree_at_every_seq(model: str, mode: str) -> None:
    trace = run_scenario(build_builtin(model), mode)
    index = TraceIndex.of(trace)
    lanes = lane_states(trace)
    handles = index.handles
    for seq in index.seqs:
        states = index.handle_states(seq)
        assert set(states.values()) <= set(STATES)
        assert lanes(seq) == states, f"seq {seq}"
        counts = Counter(states.values())
        assert cli_counts(trace, seq) == {s: counts[s] for s in STATES if counts[s]}, f"seq {seq}"
    if handles:
        # Every built-in run ends with every handle released, which the whole summary says in the same words.
        assert set(index.handle_states(None).values()) == {"released"}
        text = summarize(trace)
        assert f"handle states at the end:\n  {'released':<12} {len(handles):>6}  {STATE_MEANINGS['released']}" in text
        assert f"handles: {len(handles)} " in text
    else:
        assert mode == "none" and "handles: 0" in summarize(trace)
