"""The distributed mistakes corpus (tests/data/mistakes, made by its make.py): what each saved trace holds.

The fast tests read the saved traces; the slow ones run the generator again (real 2-rank gloo runs) into a
temporary folder and check the same facts, so a change that breaks a scenario is found before the traces are
regenerated.
"""
from __future__ import annotations

import collections
import importlib.util
import os
import subprocess
import sys

import pytest

from ckpt_viz import Trace

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "mistakes")
_spec = importlib.util.spec_from_file_location("mistakes_make", os.path.join(CORPUS, "make.py"))
make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make)


def check_stock_stage(trace: Trace, name: str) -> None:
    """torch's stock stage with ckpt_viz's unscoped reentrant checkpoint: finished, gradients wrong, and every
    replay that wrote unasked .grad recorded (metadata inference's autograd.grad; zero bubble's I too)."""
    mistake = trace.meta["mistake"]
    assert mistake["stage"] == "torch.PipelineStage" and not mistake["grads_match_reference"]
    assert mistake["max_abs_grad_error_by_step"][0] > 1e-3  # step 0: metadata inference wrote .grad
    assert trace.meta["distributed"]["missing_ranks"] == [] and "partial" not in trace.meta
    unasked = trace.of_kind("unasked_grads_accumulated")
    assert unasked and all(e.mode == "reentrant" and e.phase == "ordinary" for e in unasked)
    assert all(e.count == 4 and e.function == "Sequential" for e in unasked)  # the block's 4
    assert [e.warned for e in unasked].count(True) == len({e.tags["rank"] for e in unasked})  # once a rank
    by_step = collections.Counter(e.tags.get("step") for e in unasked)
    if name == "stock-stage-1f1b":  # only metadata inference (step 0, the stage whose input needs grad)
        assert by_step == {0: 1}
    else:  # the 3 stages whose input needs grad: metadata inference once, and their I actions (x 4 micro-batches)
        assert by_step == {0: 3 + 12, 1: 12}
    assert "action" not in {k for e in trace for k in e.tags}  # torch's stage tags nothing: no pipeline actions


def check_killed(trace: Trace, name: str) -> None:
    partial = trace.meta["partial"]
    if name == "rank-killed-sigkill":
        assert trace.meta["distributed"]["missing_ranks"] == [1] and partial["missing_ranks"] == [1]
        assert set(partial["ranks"]) == {"0"}
    else:
        assert trace.meta["distributed"]["missing_ranks"] == [] and partial["missing_ranks"] == []
        assert partial["ranks"]["1"] == {"reason": "signal", "signal": "SIGTERM", "error": None,
                                         "step": make.KILL_STEP}
    survivor = partial["ranks"]["0"]
    assert survivor["reason"] in ("signal", "exception")  # terminated while waiting in gloo, or gloo raised
    assert survivor["step"] == make.KILL_STEP
    ranks = {e.tags["rank"] for e in trace}
    assert ranks == ({0} if name == "rank-killed-sigkill" else {0, 1})
    steps = collections.Counter((e.tags["rank"], e.tags.get("step")) for e in trace if e.kind == "replay_started")
    assert steps[0, 0] == make.MICROBATCHES  # step 0 ran whole on rank 0 before rank 1 died


def check_dw_builder(trace: Trace, name: str) -> None:
    mistake = trace.meta["mistake"]
    assert mistake["grads_match_reference"] and mistake["dw_builder"]
    runs = trace.of_kind("dw_runner_called")
    stages = 4 if name == "dw-builder" else 2
    deferred, full = ("W", "I") if name == "dw-builder" else ("B", "B")  # zero bubble defers dW to W; 1F1B runs B
    assert collections.Counter(e.tags["action"] for e in runs) == {deferred: make.STEPS * make.MICROBATCHES * stages}
    assert {e.runner for e in runs} == {"_model.<locals>.Chunk.compute_dw"}
    replays = collections.Counter((e.tags["action"], e.phase) for e in trace if e.kind == "replay_started"
                                  and e.tags.get("action") != "META")
    assert replays == {(full, "dw"): make.STEPS * make.MICROBATCHES * stages}  # one full backward (NOTE [ dw_builder ])
    assert trace.count("unasked_grads_accumulated") == 0


CHECKS = {"stock-stage-1f1b": check_stock_stage, "stock-stage-zero-bubble": check_stock_stage,
          "rank-killed-sigterm": check_killed, "rank-killed-sigkill": check_killed,
          "dw-builder": check_dw_builder, "dw-builder-1f1b": check_dw_builder}


@pytest.mark.parametrize("name", make.SCENARIOS)
def test_saved_trace(name: str) -> None:
    trace = Trace.load(os.path.join(CORPUS, f"{name}.json.gz"))
    assert trace.meta["mistake"]["name"] == name and trace.meta["distributed"]["merged"]
    CHECKS[name](trace, name)


def test_explain_reads_a_single_rank_file_of_a_killed_run() -> None:
    path = os.path.join(CORPUS, "rank-killed-sigkill.rank-0.json.gz")
    trace = Trace.load(path)
    assert trace.meta["partial"]["step"] == make.KILL_STEP and trace.meta["distributed"]["rank"] == 0
    done = subprocess.run([sys.executable, "-m", "ckpt_viz", "explain", path], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode in (0, 1) and not done.stderr, done.stderr  # a report, never a traceback
    assert done.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("name", make.SCENARIOS)
def test_generator_reproduces(name: str, tmp_path) -> None:
    path = make.record(name, str(tmp_path))
    trace = Trace.load(path)
    CHECKS[name](trace, name)
    if name == "rank-killed-sigkill":
        assert Trace.load(tmp_path / f"{name}.rank-0.json.gz").meta["partial"]["step"] == make.KILL_STEP


# ---------------------------------------------------------------- what the debugger says of each mistake

_local_spec = importlib.util.spec_from_file_location("mistakes_make_local", os.path.join(CORPUS, "make_local.py"))
make_local = importlib.util.module_from_spec(_local_spec)
_local_spec.loader.exec_module(make_local)

# the mistake -> the findings `diagnose` must give, in order (a clean run: none)
EXPECTED = {
    "stock-stage-1f1b": ["unasked_grads_accumulated"],
    "stock-stage-zero-bubble": ["unasked_grads_accumulated"],
    "rank-killed-sigterm": ["error_raised", "run_partial"],
    "rank-killed-sigkill": ["error_raised", "run_partial"],
    "dw-builder": [],
    "dw-builder-1f1b": [],
    "second-backward": ["released_by_ordinary_backward"],
    "forgotten-handles": ["dw_skipped_handles"],
    "missing-trigger": ["trigger_missing_in_dw"] * 3,
    "torch-checkpoint-grad": ["torch_reentrant_with_grad"],
}


@pytest.mark.parametrize("name", [*make.SCENARIOS, *make_local.SCENARIOS])
def test_explain_strict_names_the_cause_and_the_fix(name: str) -> None:
    """`ckpt-viz explain --strict` on each saved mistake: exit 1 with each finding's cause and fix (0 and "no
    problem found" for the runs that are right), never a traceback."""
    from ckpt_viz.analysis.diagnosis import diagnose
    from ckpt_viz.codes import DIAGNOSIS_CODES

    path = os.path.join(CORPUS, f"{name}.json.gz")
    assert [d.code for d in diagnose(Trace.load(path))] == EXPECTED[name]
    done = subprocess.run([sys.executable, "-m", "ckpt_viz", "explain", "--strict", path], capture_output=True,
                          text=True, timeout=120)
    assert not done.stderr, done.stderr
    if not EXPECTED[name]:
        assert done.returncode == 0 and "no problem found" in done.stdout
        return
    assert done.returncode == 1 and "no problem found" not in done.stdout
    for code in EXPECTED[name]:
        assert code in done.stdout and DIAGNOSIS_CODES[code].fix in " ".join(done.stdout.split())


def test_findings_point_at_the_faulty_call() -> None:
    """The line a finding blames is the faulty call: the DW call that skipped a handle, the backward that found it
    released, torch's refused autograd.grad (issue 28, item 6)."""
    from ckpt_viz.analysis.diagnosis import diagnose

    lines = {name: diagnose(Trace.load(os.path.join(CORPUS, f"{name}.json.gz")))[0] for name in make_local.SCENARIOS}
    sources = {name: Trace.load(os.path.join(CORPUS, f"{name}.json.gz")).meta["sources"] for name in lines}
    blamed = {name: sources[name][f.site] for name, f in lines.items()}
    assert blamed["missing-trigger"].startswith("torch.autograd.backward(loss, inputs=params)")
    assert blamed["forgotten-handles"].startswith("backward_weight(loss, None, params)")
    assert blamed["torch-checkpoint-grad"].startswith("torch.autograd.grad(h, [x]")
    assert blamed["second-backward"].startswith("loss.backward(retain_graph=True)")  # the backward that released


@pytest.mark.slow
@pytest.mark.parametrize("name", make_local.SCENARIOS)
def test_local_generator_reproduces(name: str, tmp_path) -> None:
    from ckpt_viz.analysis.diagnosis import diagnose

    make_local.main([name, "--out", str(tmp_path)])
    assert [d.code for d in diagnose(Trace.load(tmp_path / f"{name}.json.gz"))] == EXPECTED[name]
