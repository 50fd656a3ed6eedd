"""Every built-in run and every broken run, read through the one analysis result: the lifecycle at every seq is the
plain reference's (tests/oracle.py), and the run's figures (`summary`), its findings (`diagnose`) and its memory
peak are that lifecycle's and those samples', the same numbers whichever page or command states them.

No clean run of any built-in model in any mode has a finding; every broken run has its expected code. (Each page
and `ckpt-viz info` read these results; their own tests check that they show them.)
"""
from __future__ import annotations

from collections import Counter

import pytest

from ckpt_viz.analysis.diagnosis import diagnose, diagnose_handle
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.summary import summary
from ckpt_viz.run.broken import broken_scenarios, record_broken
from ckpt_viz.run.scenarios import MODES, run_scenario
from ckpt_viz.run.zoo import BUILTIN_MODELS, build_builtin
from ckpt_viz.trace import Trace
from oracle import Reference, assert_lifecycle_is_the_reference

# Every built-in model in every mode it runs in (the pipeline mode needs a model with stages).
RUNS = [(model, mode) for model in BUILTIN_MODELS for mode in MODES
        if mode != "pipeline" or build_builtin(model).stages]


def _figures_agree(trace: Trace, ref: Reference) -> None:
    """summary(trace) states the lifecycle's figures and the samples' peak."""
    facts = summary(trace)
    end = ref.counts_at(None)
    assert facts.handles == len(ref.order) and facts.states == end
    assert facts.released == end.get("released", 0)
    assert facts.replays == sum(ref.replays.values()) == trace.count("replay_started")
    assert facts.refused == sum(map(len, ref.refusals.values())) == trace.count("replay_refused")
    assert facts.errors == trace.count("error") and facts.events == len(trace.events)
    assert facts.findings == tuple(d.code for d in diagnose(trace))
    if trace.memory:
        totals = [s.total_nbytes for s in trace.memory]
        first = totals.index(max(totals))
        assert facts.peak is not None and facts.peak == memory(trace).peak
        assert (facts.peak.seq, facts.peak.total) == (trace.memory[first].seq, max(totals))
        assert facts.peak.by_category == {c: b for c, b in trace.memory[first].bytes_by_category.items()
                                          if c in facts.peak.by_category}
    else:
        assert facts.peak is None


@pytest.mark.slow
@pytest.mark.parametrize(("model", "mode"), RUNS, ids=[f"{m}-{mode}" for m, mode in RUNS])
def test_lifecycle_summary_and_diagnosis_agree_at_every_seq(model: str, mode: str) -> None:
    trace = run_scenario(build_builtin(model), mode, memory=True)
    ref = assert_lifecycle_is_the_reference(trace)
    _figures_agree(trace, ref)
    assert diagnose(trace) == []  # a clean run has no finding, in any mode
    if ref.order:
        # Every built-in run ends with every handle released, and no handle has a problem.
        assert set(lifecycle(trace).states_at(None).values()) == {"released"}
        assert summary(trace).states == {"released": len(ref.order)}
        assert all(diagnose_handle(trace, h).ok for h in ref.order)
    else:
        assert mode == "none" and summary(trace).handles == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(broken_scenarios()))
def test_every_broken_run_has_its_code_and_the_same_figures(name: str) -> None:
    trace = record_broken(name, memory=True)
    ref = assert_lifecycle_is_the_reference(trace)
    _figures_agree(trace, ref)
    codes = Counter(d.code for d in diagnose(trace))
    assert broken_scenarios()[name].expected_code in codes, codes
    assert "error_raised" not in codes  # every error of a broken run is explained by its cause
