"""Two runs compared (`ckpt_viz.analysis.compare`), on real runs: every sentence states the figures beside it, and
its comparative word agrees with them."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckpt_viz.analysis.actions import bubbles
from ckpt_viz.analysis.compare import compare, split_above
from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.passes import passes
from ckpt_viz.analysis.summary import summary
from ckpt_viz.analysis.words import category_word, format_bytes
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "docs" / "examples"


def _run(model: str, mode: str, **kw: object) -> Trace:
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    return obtain_trace(RunRequest("builtin", model, mode=mode, **kw))


def check_sentences(a: Trace, b: Trace, names: tuple[str, str]) -> dict[str, str]:
    """Every sentence of `compare(a, b)` against the figures derived here from each run alone; its topic -> text."""
    c = compare(a, b, names)
    sa, sb = summary(a), summary(b)
    said = {d.topic: d for d in c.differences}
    assert len(said) == len(c.differences)  # one sentence per topic
    peak = said["peak"]
    if sa.peak and sb.peak:
        assert (peak.a, peak.b) == (sa.peak.total, sb.peak.total)
        if sa.peak.total == sb.peak.total:
            assert peak.sentence == f"Both runs peak at {format_bytes(sa.peak.total)}."
        else:
            word = "lower" if sb.peak.total < sa.peak.total else "higher"
            assert f"{names[1]} peaks at {format_bytes(sb.peak.total)}, " in peak.sentence
            assert f" {word} than {names[0]} ({format_bytes(sa.peak.total)})." in peak.sentence
            assert format_bytes(abs(sb.peak.total - sa.peak.total)) in peak.sentence
        gaps = {cat: abs(sb.peak.by_category.get(cat, 0) - sa.peak.by_category.get(cat, 0))
                for cat in {*sa.peak.by_category, *sb.peak.by_category}}
        if max(gaps.values()) > 0:
            top = said["category"]
            assert abs(top.b - top.a) == max(gaps.values())
            category = next(cat for cat, gap in gaps.items() if gap == abs(top.b - top.a)
                            and category_word(cat) in top.sentence)
            assert (top.a, top.b) == (sa.peak.by_category.get(category, 0), sb.peak.by_category.get(category, 0))
            assert f"{format_bytes(top.a)} in {names[0]}, {format_bytes(top.b)} in {names[1]}" in top.sentence
    else:
        assert "no memory samples" in peak.sentence and "category" not in said
    replays = said["replays"]
    assert (replays.a, replays.b) == (sa.replays, sb.replays)
    numbers = [int(n) for n in re.findall(r"(\d+) times", replays.sentence)]
    words = {"once": 1, "twice": 2}
    numbers += [words[w] for w in re.findall(r"\b(once|twice)\b", replays.sentence)]
    assert sorted(set(numbers)) == sorted({sa.replays, sb.replays})
    assert (said["handles"].a, said["handles"].b) == (sa.handles, sb.handles)
    assert str(sa.handles) in said["handles"].sentence and str(sb.handles) in said["handles"].sentence
    parts_a = [p for p in ("F", "DX", "DW", "B") if p in passes(a).of_event]
    assert [p.part for p in c.a.passes] == parts_a
    for figures, trace in ((c.a, a), (c.b, b)):
        facts = memory(trace)
        if facts.peak is not None:  # the run's peak is the highest of its parts' peaks
            assert max(p.peak or 0 for p in figures.passes) == facts.peak.total
        assert sum(p.events for p in figures.passes) == len(trace.events)
        assert sum(p.replays for p in figures.passes) == trace.count("replay_started")
    ba, bb = bubbles(a), bubbles(b)
    if ba.steps and bb.steps and ba.unit == bb.unit:
        ra, rb = round(100 * ba.steps[0].bubble), round(100 * bb.steps[0].bubble)
        bubble = said["bubble"].sentence
        assert (f"Both runs idle {ra}%" in bubble) if ra == rb else (
            f"is {rb}% of its step, {'less' if rb < ra else 'more'} than {names[0]}'s {ra}%" in bubble)
        assert said["step"].a == ba.steps[0].length and said["step"].b == bb.steps[0].length
    return {topic: d.sentence for topic, d in said.items()}


def test_gpt2_without_and_with_checkpointing() -> None:
    a = Trace.load(EXAMPLES / "gpt2_no_checkpoint.json.gz")
    b = Trace.load(EXAMPLES / "gpt2_checkpoint.json.gz")
    said = check_sentences(a, b, ("no checkpoint", "checkpoint"))
    assert " lower than no checkpoint " in said["peak"]  # checkpointing lowers this run's peak ...
    assert said["category"].startswith("At the peaks, activations differ most")  # ... by its activations
    assert said["replays"] == "no checkpoint replays 0 times, checkpoint 4 times."
    assert said["gradients"] == "Both runs computed the same gradients, bit for bit."


@pytest.mark.parametrize(("first", "second"), [("1F1B", "ZB-H1"), ("GPipe", "1F1B")])
def test_two_schedules_of_the_pipeline_model(first: str, second: str) -> None:
    a = _run("pipeline", "pipeline", schedule=first, microbatches=4)
    b = _run("pipeline", "pipeline", schedule=second, microbatches=4)
    said = check_sentences(a, b, (first, second))
    assert "actions" in said and "bubble" in said and "step" in said
    if second == "ZB-H1":  # ZB-H1 fills the bubble with DW: 1 idle tick of 13 against 1F1B's 3 of 15
        assert said["bubble"] == "ZB-H1's bubble is 8% of its step, less than 1F1B's 20%."
        assert said["step"] == "ZB-H1's step takes 13 ticks, shorter than 1F1B's 15 ticks."
        assert said["actions"] == "1F1B runs 8 F and 8 B; ZB-H1 runs 8 F, 8 DX and 8 DW."
    else:  # GPipe and 1F1B idle as long, in another order
        assert said["bubble"] == "Both runs idle 20% of the step (their bubble)."


@pytest.mark.parametrize(("model", "modes"), [("mlp", ("none", "split-reentrant")),
                                              ("transformer", ("reentrant", "nonreentrant")),
                                              ("mlp", ("split-reentrant", "split-reentrant"))])
def test_built_in_modes(model: str, modes: tuple[str, str]) -> None:
    a, b = _run(model, modes[0]), _run(model, modes[1])
    said = check_sentences(a, b, (f"A {modes[0]}", f"B {modes[1]}"))
    if a is b or modes[0] == modes[1]:
        assert said["peak"].startswith("Both runs peak at") and said["replays"].startswith("Both runs replay")
        assert "category" not in said and "parts" not in said


def test_a_broken_run_against_a_saved_merged_run(tmp_path: Path) -> None:
    from ckpt_viz.cli.merge import merge_run
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    broken = obtain_trace(RunRequest("broken", "dx-after-dw"))
    merged, _ = merge_run(str(ROOT / "tests" / "data" / "distributed"))
    merged.save(tmp_path / "merged.json.gz")
    said = check_sentences(broken, Trace.load(tmp_path / "merged.json.gz"), ("broken", "merged"))
    assert said["findings"].startswith("Problems found: ")
    assert "bubble" not in said  # only one of them ran pipeline actions


def test_a_run_without_memory_samples_compares_no_peaks() -> None:
    from traces import split_trace

    with_samples = split_trace()
    without = Trace(events=with_samples.events, meta={})
    said = check_sentences(without, with_samples, ("bare", "sampled"))
    assert said["peak"] == ("bare has no memory samples (recorded without memory=True), so the peaks are not "
                            "compared.")


def test_the_split_note_only_where_a_split_mode_peaks_higher() -> None:
    # the run: split-reentrant (305.7 KiB) below none (382.6 KiB) and equal to reentrant: no claim
    assert split_above({"none": 391_782, "reentrant": 313_037, "split-reentrant": 313_037}) == ()
    (above,) = split_above({"none": 1_200_000, "reentrant": 900_000, "nonreentrant": 950_000,
                            "split-reentrant": 1_400_000})
    assert (above.a, above.b) == (900_000, 1_400_000)
    assert above.sentence == (f"split-reentrant peaks at {format_bytes(1_400_000)}, {format_bytes(500_000)} above "
                              f"reentrant ({format_bytes(900_000)})")
    assert split_above({"none": 1, "split-reentrant": 2}) == ()  # nothing checkpointed without split to compare
