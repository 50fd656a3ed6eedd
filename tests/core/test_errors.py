"""The error tree of ckpt_viz.errors: every error has a code, the docstring draws them all, no bare RuntimeError.

The codes of errors that are the symptom of a diagnosis come from the one table
(`ckpt_viz.codes.DIAGNOSIS_CODES`), with its tip as the message's last line.
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import ckpt_viz
import ckpt_viz.errors as errors
from ckpt_viz.codes import CODE_FOR_REASON, DIAGNOSIS_CODES
from ckpt_viz.errors import (
    CkptVizError,
    GraphReleasedError,
    HandleReleasedError,
    PhaseNotSetError,
    SessionMismatchError,
    error_code,
    tip_for,
)
from ckpt_viz.vocabulary import RELEASE_REASONS

PACKAGE = Path(ckpt_viz.__file__).parent
ERROR_CLASSES = [obj for name in errors.__all__ if inspect.isclass(obj := getattr(errors, name))]


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(PACKAGE.rglob("*.py"))]


def test_every_error_class_has_its_own_code_drawn_in_the_docstring() -> None:
    assert all(issubclass(cls, CkptVizError) for cls in ERROR_CLASSES)
    codes = [cls.code for cls in ERROR_CLASSES]
    assert all(isinstance(code, str) and code for code in codes)
    assert len(set(codes)) == len(codes), codes
    tree = errors.__doc__.split("\n\n")[1]
    for cls in ERROR_CLASSES:
        assert cls.__name__ in tree and cls.code in tree, cls
    # Every class of the package that derives from CkptVizError is defined in errors.py.
    for path, module in _sources():
        for node in ast.walk(module):
            if isinstance(node, ast.ClassDef) and any(getattr(base, "id", "").endswith("Error")
                                                      and getattr(base, "id", "") in errors.__all__
                                                      for base in node.bases):
                assert path.name == "errors.py", (path, node.name)


def test_every_code_passed_at_a_raise_site_is_documented() -> None:
    tree = errors.__doc__.split("\n\n")[1]
    passed = []
    for path, module in _sources():
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith("Error"):
                passed += [(path.name, k.value.value) for k in node.keywords
                           if k.arg == "code" and isinstance(k.value, ast.Constant)]
    assert passed, "the excluded regions pass precise codes"
    for where, code in passed:
        assert code in DIAGNOSIS_CODES or code in tree, (where, code)


def test_no_bare_runtime_error_is_raised_on_purpose() -> None:
    bare = []
    for path, module in _sources():
        for node in ast.walk(module):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if getattr(target, "id", None) in {"RuntimeError", "Exception"}:
                    bare.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert bare == []


def _errors_with_a_diagnosis_code() -> list[CkptVizError]:
    released = [HandleReleasedError("ckpt_viz.checkpoint (backward)", "Cannot replay a released reentrant checkpoint",
                                    3, reason, seq=7, site="t.py:1") for reason in RELEASE_REASONS]
    return [*released, GraphReleasedError("ckpt_viz.recompute_handle", 3, collected_seq=5), PhaseNotSetError(3),
            SessionMismatchError("ckpt_viz.ReentrantCheckpointHandle.bind_session", 3, "b", "a")]


def test_errors_of_a_diagnosis_carry_its_code_and_end_with_its_tip() -> None:
    found = _errors_with_a_diagnosis_code()
    for exc in found:
        assert exc.code in DIAGNOSIS_CODES
        assert str(exc).splitlines()[-1] == f"Tip: {tip_for(exc.code)}"
        assert str(exc).startswith("ckpt_viz.") and "h3" in str(exc)
    # A tip is kept exactly for the codes that an error carries (no tip nobody shows).
    assert {exc.code for exc in found} == {code for code, d in DIAGNOSIS_CODES.items() if d.tip is not None}
    assert [exc.code for exc in found[:len(RELEASE_REASONS)]] == [CODE_FOR_REASON[r] for r in RELEASE_REASONS]


def test_a_released_handle_of_unknown_reason_has_the_error_code() -> None:
    exc = HandleReleasedError("ckpt_viz.checkpoint (backward)", "Cannot replay a released reentrant checkpoint", 1,
                              None)
    assert exc.code == "handle_released" and str(exc).splitlines()[-1].startswith("Tip: ")


def test_a_raise_site_may_pass_a_precise_code() -> None:
    exc = errors.ExcludedRegionError("ckpt_viz.checkpoint_exclude_wrapper: x.\nTip: y.", code="exclude_cache_empty")
    assert (exc.code, errors.ExcludedRegionError.code, str(exc)) == (
        "exclude_cache_empty", "excluded_region_failed", "ckpt_viz.checkpoint_exclude_wrapper: x.\nTip: y.")
    assert isinstance(exc, RuntimeError)


def test_error_code_classifies_pytorch_errors_by_their_key_phrase_only_here() -> None:
    torch_error = RuntimeError("Trying to backward through the graph a second time (or directly access saved "
                               "tensors after they have already been freed).")
    assert error_code(torch_error) == "second_backward_through_graph"
    assert error_code(RuntimeError("something else")) is None
    assert error_code(PhaseNotSetError(1)) == "phase_not_set"


def test_the_sandbox_errors_are_model_load_errors() -> None:
    # Defined once, in errors.py (test_every_error_class_has_its_own_code_drawn_in_the_docstring); the modules
    # that raise them import them from there (no re-export: tests/core/test_layering.py rule 7).
    for name in ("SandboxError", "SandboxTimeoutError", "SandboxMemoryError", "SandboxRunError", "SandboxCrashError"):
        assert issubclass(getattr(errors, name), errors.ModelLoadError)


def test_the_error_event_stores_the_code() -> None:
    torch = pytest.importorskip("torch")
    with ckpt_viz.record() as rec:
        with pytest.raises(errors.RecordingError, match="already open"):
            rec.__enter__()
        a = torch.ones(2, requires_grad=True)
        loss = (a * a).sum()
        loss.backward()
        with pytest.raises(RuntimeError, match="second time"):
            loss.backward()
    assert [e.code for e in rec.trace.of_kind("error")] == ["second_backward_through_graph"]
