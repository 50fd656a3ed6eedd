"""diagnose_handle / diagnose: every cause of spec 4.2 with a code (R1..R15 but R11), read from recorded traces.

The setups are those of tests/runtime/test_reentrant_errors.py. Each test records the
scenario, then checks the code, the release event (seq and reason) and that
`site` names this file's line of the releasing action.
"""
from __future__ import annotations

import ast
import gc
import re
import sys
from pathlib import Path

import pytest
import torch

import ckpt_viz
from ckpt_viz.analysis.diagnosis import diagnose, diagnose_handle
from ckpt_viz.analysis.findings import Finding
from ckpt_viz.codes import CODE_FOR_REASON, DIAGNOSIS_CODES
from ckpt_viz.errors import GraphReleasedError, HandleReleasedError, PhaseNotSetError
from ckpt_viz.events import Event
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
)
from ckpt_viz.runtime.reentrant import current_frame
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import RELEASE_REASONS
from setups import E6, E7
from setups import leaf as _leaf
from setups import ordinary as _ordinary
from setups import region as _region
from setups import split as _split
from traces import Builder, refused_trace, split_trace

# ------------------------------------------------------------------ helpers (shared setups live in tests/setups.py)


def _next_line() -> int:
    return sys._getframe(1).f_lineno + 1


def _here(line: int) -> str:
    return f"test_diagnose.py:{line}"


def _released(trace: Trace, h) -> Event:
    (event,) = [e for e in trace.for_handle(h.handle_id) if e.kind == "released"]
    return event


def _check(trace: Trace, h, code: str, *, reason: str | None, line: int | None, refused: str | None) -> Finding:
    """The finding of `h`: code, cause text, release event and reason, site, refusal kind; also in diagnose."""
    d = diagnose_handle(trace, h.handle_id)
    assert d.code == code, d.summary
    entry = DIAGNOSIS_CODES[code]
    assert d.cause == entry.cause and d.fix == entry.fix and d.handle_id == h.handle_id
    assert d.reason == reason
    if reason in RELEASE_REASONS:  # the table says which release reasons each code follows from
        assert reason in entry.reasons, (code, reason)
    else:
        assert code == "session_mismatch" or entry.reasons == (), code  # R14 by E10: nothing was released
    if reason is not None and reason != "node_collected":
        assert d.release_event == _released(trace, h)
        assert f"event #{d.release_event.seq}" in d.summary
    if line is None:
        assert d.site is None
    else:
        assert d.site is not None and d.site.endswith(_here(line)), (d.site, line)
    if refused is None:
        assert d.refused_event is None
    else:
        assert d.refused_event is not None and d.refused_event.kind == refused
        assert d.refused_event.seq > (d.release_event.seq if d.release_event else -1)
    assert d in diagnose(trace)
    return d


@pytest.fixture(autouse=True)
def _collect_old_graphs():
    gc.collect()


# ------------------------------------------------------------------ R1..R15

def test_r1_dx_after_dw() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        h.set_phase("dw")
        line = _next_line()
        torch.autograd.backward(loss, inputs=[w, h.backward_trigger], retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E7):
            torch.autograd.grad(loss, [x])
    d = _check(rec.trace, h, "released_by_dw", reason="dw_complete", line=line, refused="replay_refused")
    assert d.error_event.type == "HandleReleasedError"


def test_r1_set_phase_dx_after_dw_is_an_e6_refusal() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        backward_input(loss, None, [x], handles=[h])
        line = _next_line()
        backward_weight(loss, None, [w], handles=[h])
        with pytest.raises(HandleReleasedError, match=E6):
            h.set_phase("dx")
    d = _check(rec.trace, h, "released_by_dw", reason="dw_complete", line=line, refused="error")
    assert d.refused_event.where == "set_phase" and "set_phase at event" in d.summary


def test_r2_second_ordinary_backward() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        line = _next_line()
        loss.backward(retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E7):
            loss.backward()
    _check(rec.trace, h, "released_by_ordinary_backward", reason="ordinary_backward_complete", line=line,
           refused="replay_refused")


def test_r3_session_ctx_without_binding() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        with recompute_session_ctx("r3", retain_on_unpack=True):
            line = _next_line()
            loss.backward(retain_graph=True)
            with pytest.raises(HandleReleasedError, match=E7):
                loss.backward()
    d = _check(rec.trace, h, "session_never_bound", reason="ordinary_backward_complete", line=line,
               refused="replay_refused")
    assert "'r3'" in d.summary


def test_r4_backward_outside_the_prefire_session() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        recompute_handle(h, "r4")
        line = _next_line()
        loss.backward(retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E7):
            loss.backward()
    d = _check(rec.trace, h, "session_not_retaining", reason="ordinary_backward_complete", line=line,
               refused="replay_refused")
    assert "outside its session 'r4'" in d.summary
    clear_recompute_session("r4")


def test_r4_session_switched_to_non_retaining() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        recompute_handle(h, "r4b")
        with recompute_session_ctx("r4b", retain_on_unpack=False):
            line = _next_line()
            loss.backward(retain_graph=True)
            with pytest.raises(HandleReleasedError, match=E7):
                loss.backward()
    d = _check(rec.trace, h, "session_not_retaining", reason="ordinary_backward_complete", line=line,
               refused="replay_refused")
    assert "retain_on_unpack=False" in d.summary
    clear_recompute_session("r4b")


def test_r4_control_retaining_session_is_ok() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        recompute_handle(h, "r4c")
        with recompute_session_ctx("r4c", retain_on_unpack=True):
            loss.backward(retain_graph=True)
            loss.backward()
        line = _next_line()
        clear_recompute_session("r4c")
    d = diagnose_handle(rec.trace, h.handle_id)
    assert d.ok and d.code == "ok" and d.reason == "session_cleared" and d.site.endswith(_here(line))
    assert diagnose(rec.trace) == []


def test_r5_forgotten_set_phase() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        with pytest.raises(PhaseNotSetError):
            line = _next_line()
            loss.backward(retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E6):
            h.set_phase("dx")
    d = _check(rec.trace, h, "phase_not_set", reason="backward_exception", line=line, refused="error")
    assert d.error_event.type == "PhaseNotSetError"


def test_r5_without_a_later_refusal_is_still_reported() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        with pytest.raises(PhaseNotSetError):
            line = _next_line()
            loss.backward()
    _check(rec.trace, h, "phase_not_set", reason="backward_exception", line=line, refused=None)


def test_r6_failing_replay() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    calls: list[int] = []

    def region(t: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("replay failed on purpose")
        return torch.tanh(t @ w)

    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(region, x, use_reentrant=True)
    h, loss = handles[0], (out * out).sum()
    with ckpt_viz.record() as rec:
        with pytest.raises(ValueError, match="replay failed on purpose"):
            line = _next_line()
            loss.backward(retain_graph=True)
        with pytest.raises(HandleReleasedError, match=E7):
            loss.backward()
    d = _check(rec.trace, h, "released_after_backward_error", reason="backward_exception", line=line,
               refused="replay_refused")
    assert d.error_event.type == "ValueError" and "ValueError in the backward" in d.summary


def test_r7_failing_forward() -> None:
    x = _leaf(2, 3)
    kept = []

    def region(t: torch.Tensor) -> torch.Tensor:
        kept.append(current_frame())
        raise KeyError("forward failed on purpose")

    with ckpt_viz.record() as rec:
        with recompute_handle_collector_ctx():
            with pytest.raises(KeyError, match="forward failed on purpose"):
                line = _next_line()
                checkpoint(region, x, use_reentrant=True)
        h = kept[0]
        with pytest.raises(HandleReleasedError, match=E7):
            recompute_handle(h, "r7")
    d = _check(rec.trace, h, "released_after_forward_error", reason="forward_exception", line=line,
               refused="replay_refused")
    assert d.error_event.type == "KeyError" and "the forward raised KeyError" in d.summary
    clear_recompute_session("r7")


def test_r8_session_cleared_between_prefire_and_backward() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        recompute_handle(h, "r8")
        line = _next_line()
        clear_recompute_session("r8")
        with pytest.raises(HandleReleasedError, match=E7):
            loss.backward()
    _check(rec.trace, h, "session_cleared_early", reason="session_cleared", line=line, refused="replay_refused")


def test_r8_session_cleared_after_dx_refuses_dw() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        backward_input(loss, None, [x], handles=[h], session_id="r8dx")
        line = _next_line()
        clear_recompute_session("r8dx")
        with pytest.raises(HandleReleasedError, match=E6):
            backward_weight(loss, None, [w], handles=[h], session_id="r8dx")
    _check(rec.trace, h, "session_cleared_early", reason="session_cleared", line=line, refused="error")


def test_r9_explicit_release() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        line = _next_line()
        h.release()
        with pytest.raises(HandleReleasedError, match=E7):
            loss.backward()
    _check(rec.trace, h, "released_explicitly", reason="explicit_release", line=line, refused="replay_refused")


def test_r10_outputs_dropped_before_replay() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    with ckpt_viz.record() as rec:
        with recompute_handle_collector_ctx() as handles:
            out = checkpoint(_region(w), x, use_reentrant=True)
        h = handles[0]
        del out
        gc.collect()
        with pytest.raises(GraphReleasedError):
            line = _next_line()
            recompute_handle(h, "r10")
    d = _check(rec.trace, h, "outputs_dropped_before_replay", reason="node_collected", line=None,
               refused="replay_refused")
    (collected,) = [e for e in rec.trace.for_handle(h.handle_id) if e.kind == "node_collected"]
    assert d.release_event == collected and f"event #{collected.seq}" in d.summary
    assert d.refused_event.reason == "node_collected" and d.refused_event.site.endswith(_here(line))
    clear_recompute_session("r10")


def test_r12_dw_without_the_trigger_leaks_the_handle() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        backward_input(loss, None, [x], handles=[h])
        h.set_phase("dw")
        line = _next_line()  # the faulty call: the DW whose inputs lack the trigger
        torch.autograd.backward(loss, inputs=[w], retain_graph=True)
    d = _check(rec.trace, h, "trigger_missing_in_dw", reason=None, line=line, refused=None)
    assert d.release_event is None and h.released is False
    h.release()


def test_r13_dx_without_retain_graph_leaks_the_handle() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    # The torch error leaves the record() block, so the trace holds it as an `error` event.
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        with ckpt_viz.record() as rec:
            h.set_phase("dx")
            line = _next_line()
            torch.autograd.grad(loss, [x])
            h.set_phase("dw")
            torch.autograd.backward(loss, inputs=[w, h.backward_trigger])
    d = _check(rec.trace, h, "dx_without_retain_graph", reason=None, line=line, refused=None)
    assert d.error_event.kind == "error" and d.error_event.where == "autograd.backward"
    assert h.released is False
    h.release()


def test_r14_bound_to_a_used_under_b() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        h.bind_session("a")  # inside the recording, so the trace knows the binding
        with recompute_session_ctx("b", retain_on_unpack=True):
            line = _next_line()
            loss.backward(retain_graph=True)
            with pytest.raises(HandleReleasedError, match=E7):
                loss.backward()
    d = _check(rec.trace, h, "session_mismatch", reason="ordinary_backward_complete", line=line,
               refused="replay_refused")
    assert "inside session 'b' while the handle is bound to 'a'" in d.summary
    clear_recompute_session("a")


def test_r14_bind_inside_another_session_is_e10() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, _ = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        with recompute_session_ctx("b"):
            with pytest.raises(ValueError, match="Active session does not match"):
                line = _next_line()
                h.bind_session("a")
    d = _check(rec.trace, h, "session_mismatch", reason=None, line=line, refused=None)
    assert d.release_event is None and d.error_event.where == "bind_session"


def test_r15_prefire_after_ordinary_backward() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _ordinary(x, w)
    with ckpt_viz.record() as rec:
        line = _next_line()
        loss.backward()
        with pytest.raises(HandleReleasedError, match=E7):
            refusal_line = _next_line()
            recompute_handle(h, "r15")
    d = _check(rec.trace, h, "prefire_after_release", reason="ordinary_backward_complete", line=line,
               refused="replay_refused")
    assert d.refused_event.site.endswith(_here(refusal_line))
    clear_recompute_session("r15")


def test_r15_prefire_after_dw() -> None:
    x, w = _leaf(2, 3), _leaf(3, 3)
    h, loss = _split(x, w)
    with ckpt_viz.record() as rec:
        backward_input(loss, None, [x], handles=[h])
        line = _next_line()
        backward_weight(loss, None, [w], handles=[h])
        with pytest.raises(HandleReleasedError, match=E7):
            recompute_handle(h, "r15b")
    _check(rec.trace, h, "prefire_after_release", reason="dw_complete", line=line, refused="replay_refused")
    clear_recompute_session("r15b")


# ------------------------------------------------------------------ clean runs and hand-built traces

@pytest.mark.parametrize("mode", ["reentrant", "nonreentrant", "split-reentrant", "split-nonreentrant", "pipeline"])
def test_clean_runs_have_no_problem(mode: str) -> None:
    trace = run_scenario(build_builtin("pipeline" if mode == "pipeline" else "closure"), mode)
    assert diagnose(trace) == []
    for h in trace.handle_ids():
        assert diagnose_handle(trace, h).ok


def test_hand_built_traces() -> None:
    d = diagnose_handle(refused_trace(), 0)
    assert (d.code, d.reason, d.site, d.release_event.seq, d.refused_event.seq) == (
        "released_by_ordinary_backward", "ordinary_backward_complete", "train.py:8", 7, 9)
    assert d.error_event.seq == 10
    assert d.summary == ("h0 was released at event #7 (train.py:8) with reason ordinary_backward_complete, by an "
                         "ordinary backward outside any retaining session; the replay at event #9 (train.py:9) "
                         "was refused.")
    assert diagnose_handle(split_trace(), 1).ok
    # the hand-built split trace gives one captured bias no gradient (accumulated False): a silent problem
    assert {(d.code, d.handle_id) for d in diagnose(split_trace())} == {("params_without_grad", 0),
                                                                          ("params_without_grad", 1)}
    assert diagnose_handle(split_trace(), 99).code == "ok"  # unknown handle: nothing to report


def test_release_before_the_recording_uses_the_reason_the_refusal_carries() -> None:
    b = Builder()
    b.ev("backward_entered", 4, phase="dx", site="t.py:3")
    b.ev("replay_refused", 4, phase="dx", site="t.py:3", reason="released", last_release_reason="dw_complete",
         last_release_seq=None)
    d = diagnose_handle(b.trace(), 4)
    assert d.code == "released_by_dw" and d.release_event is None and d.refused_event.seq == 1
    assert "before the recording" in d.summary


def test_loaded_trace_gives_the_same_diagnosis(tmp_path) -> None:
    trace = refused_trace()
    trace.save(tmp_path / "t.json")
    assert diagnose_handle(Trace.load(tmp_path / "t.json"), 0) == diagnose_handle(trace, 0)


# ------------------------------------------------------------------ the one table, and codes instead of text

def _codes_checked_here() -> set[str]:
    """The codes this file's recorded scenarios assert through `_check` (read from its source)."""
    tree = ast.parse(Path(__file__).read_text())
    return {node.args[2].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_check"
            and len(node.args) >= 3 and isinstance(node.args[2], ast.Constant)}


def test_every_refusal_code_of_the_table_is_diagnosed_from_a_recorded_run() -> None:
    # The codes of spec 4.2; the debugger's silent problems are recorded by tests/run/test_broken.py.
    assert _codes_checked_here() == {c for c, d in DIAGNOSIS_CODES.items() if d.spec_id.startswith("R")}


def test_the_table_has_one_entry_per_cause() -> None:
    # R11 (outer saved inputs freed before the first replay) has no reproduction
    # (tests/runtime/test_reentrant_errors.py shows why), so it has no code.
    spec_ids = [d.spec_id for d in DIAGNOSIS_CODES.values()]
    assert [i for i in spec_ids if i.startswith("R")] == [f"R{i}" for i in range(1, 16) if i != 11]
    assert len(set(spec_ids)) == len(spec_ids)
    for code, d in DIAGNOSIS_CODES.items():
        assert d.code == code and d.cause and d.fix
        shown = d.cause + d.fix + (d.tip or "")
        assert re.search(r"\bR\d+\b", shown) is None, code  # spec ids are never shown to users
        assert set(d.reasons) <= set(RELEASE_REASONS), code
    # Each release reason has exactly one plain reading, and diagnose falls back to it.
    plain = [d for d in DIAGNOSIS_CODES.values() if d.plain]
    assert sorted(r for d in plain for r in d.reasons) == sorted(RELEASE_REASONS)
    assert {CODE_FOR_REASON[r] for r in RELEASE_REASONS} == {d.code for d in plain}


def _leak_trace(code: str | None, message: str) -> Trace:
    """h0 set to dw, never entered by DW, then an autograd error with `code` and `message`."""
    b = Builder()
    b.ev("handle_created", 0, mode="reentrant", phase="ordinary", split=True)
    b.ev("backward_entered", 0, mode="reentrant", phase="dx", site="t.py:4")
    b.ev("phase_set", 0, mode="reentrant", phase="dw", site="t.py:5", old="dx", new="dw")
    b.ev("error", None, site="t.py:6", where="autograd.backward", type="RuntimeError", message=message, code=code)
    return b.trace()


def test_diagnose_reads_codes_never_message_text() -> None:
    torch_text = "Trying to backward through the graph a second time (or directly access saved tensors ...)"
    assert diagnose_handle(_leak_trace("second_backward_through_graph", "reworded by a later torch"), 0).code == (
        "dx_without_retain_graph")
    assert diagnose_handle(_leak_trace(None, torch_text), 0).code == "trigger_missing_in_dw"  # text alone: not R13
    b = Builder()
    b.ev("handle_created", 0, mode="reentrant", phase="ordinary", split=False)
    b.ev("error", 0, site="t.py:3", where="bind_session", type="SessionMismatchError", message="",
         code="session_mismatch")
    assert diagnose_handle(b.trace(), 0).code == "session_mismatch"
    b = Builder()
    b.ev("handle_created", 0, mode="reentrant", phase="ordinary", split=False)
    b.ev("error", 0, where="bind_session", type="CheckpointUsageError", code="checkpoint_usage",
         message="ckpt_viz.ReentrantCheckpointHandle.bind_session: Active session does not match ...")
    assert diagnose_handle(b.trace(), 0).ok


def test_a_refusal_error_without_a_recorded_release_names_the_code_it_carries() -> None:
    b = Builder()
    b.ev("handle_created", 0, mode="reentrant", phase="ordinary", split=True)
    b.ev("error", 0, site="t.py:7", where="set_phase", type="HandleReleasedError", message="",
         code="session_cleared_early")
    d = diagnose_handle(b.trace(), 0)
    assert d.code == "session_cleared_early" and d.refused_event.seq == 1 and d.release_event is None


def test_the_debugger_doc_lists_the_codes_of_the_table() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "debugger.md").read_text()
    table = doc.split("<!-- table:codes -->\n", 1)[1].split("<!-- /table:codes -->", 1)[0]
    rows = re.findall(r"^\| (\w+) \| `([a-z_]+)` \| (.+?) \| .+ \|$", table, flags=re.MULTILINE)
    assert rows == [(d.spec_id, code, " ".join(d.cause.split()).replace("|", "\\|"))
                    for code, d in DIAGNOSIS_CODES.items()]
