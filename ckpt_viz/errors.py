"""Every error ckpt_viz raises on purpose, each with a `code`.

    class (base)                          code                            raised when
    CkptVizError (Exception)              ckpt_viz_error                  a run, CLI or app API was misused
    ├── CheckpointError (RuntimeError)    checkpoint_failed               the runtime refused or failed a transition
    │   ├── HandleReleasedError           the release reason's code       E6/E7: set_phase on, or replay of, a
    │   │                                   (handle_released if unknown)    released handle
    │   ├── GraphReleasedError            outputs_dropped_before_replay   E8: the node died before the 1st replay
    │   ├── PhaseNotSetError              phase_not_set                   E9: split handle reached in "ordinary"
    │   └── ExcludedRegionError           excluded_region_failed          an excluded region could not replay:
    │                                       exclude_cache_empty             no stored output for this call
    │                                       exclude_input_changed           the replay passed other inputs
    │                                       exclude_input_not_ready         an input read before the replay
    │                                       exclude_graph_released          its retained graph was released
    ├── CheckpointUsageError (ValueError) checkpoint_usage                bad arguments or an unsupported nesting
    │   └── SessionMismatchError          session_mismatch                E10: bind_session under another id
    ├── RecordingError (RuntimeError)     recording_misused               a record() block entered twice, or not open
    ├── LessonError                       lesson_invalid                  a lesson's data is wrong, or its check fails
    ├── DotLimitError                     dot_limit                       Graphviz's dot ran past its time or memory
    │                                                                       limit, or its session ended
    ├── TraceError (ValueError)           trace_invalid                   a trace file wrong, truncated or too new
    │   └── TraceFileError (OSError)      trace_file_failed               the OS refused a read or write of a trace file
    └── ModelLoadError                    model_load_failed               a user model failed to load or its checks
        └── SandboxError                  sandbox_failed                  the child running a user model failed
            ├── SandboxTimeoutError       sandbox_timeout                 it ran past its time limit
            ├── SandboxMemoryError        sandbox_out_of_memory           it ran out of memory under its limit
            ├── SandboxRunError           sandbox_run_failed              the model loaded but the run raised
            └── SandboxCrashError         sandbox_crashed                 it died or left no trace or report

PyTorch's own errors have no code; the one that a diagnosis needs (E14, "Trying to
backward through the graph a second time", code `second_backward_through_graph`) is
classified once, where `record()` captures it (`error_code`).

`code` is a diagnosis code of `ckpt_viz.codes.DIAGNOSIS_CODES` where the error is
the symptom of one of its causes (then its tip is that table's tip), else the error
code above. A raise site may pass a more precise `code=`. The `error` event of an
error stores its code in `data.code`, so `ckpt_viz.diagnose` reads codes, never text.
A `HandleReleasedError` takes the plain code of its release reason
(`ckpt_viz.codes.CODE_FOR_REASON`); the diagnosis refines it from the trace.

Messages follow one shape (spec D7): they start with the API name, say what
happened with the numbers and the handle id, keep PyTorch's key phrase so that a
search still finds it, and end with one next step ("Tip: ..."). Standard library only.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from ckpt_viz.codes import CODE_FOR_REASON, DIAGNOSIS_CODES

__all__ = [
    "CheckpointError",
    "CheckpointUsageError",
    "CkptVizError",
    "DotLimitError",
    "ExcludedRegionError",
    "GraphReleasedError",
    "HandleReleasedError",
    "LessonError",
    "ModelLoadError",
    "PhaseNotSetError",
    "RecordingError",
    "SandboxCrashError",
    "SandboxError",
    "SandboxMemoryError",
    "SandboxRunError",
    "SandboxTimeoutError",
    "SessionMismatchError",
    "TraceError",
    "TraceFileError",
    "error_code",
    "internal_assert",
    "tip_for",
    ]


class CkptVizError(Exception):
    """Base of every error ckpt_viz raises on purpose.

    Attributes:
        code: a diagnosis code, or this class's error code (see the module docstring).
    """

    code: str = "ckpt_viz_error"

    def __init__(self, *args: object, code: str | None = None) -> None:
        Exception.__init__(self, *args)  # not super(): torch.compile (dynamo) cannot trace it here
        if code is not None:
            self.code = code


class CheckpointError(CkptVizError, RuntimeError):
    """The checkpoint runtime refused or failed a transition."""

    code = "checkpoint_failed"


class CheckpointUsageError(CkptVizError, ValueError):
    """A checkpoint API was called with bad arguments or in an unsupported nesting."""

    code = "checkpoint_usage"


class RecordingError(CkptVizError, RuntimeError):
    """A `record()` block was used in a way it does not support (entered twice, attached while not open)."""

    code = "recording_misused"


class LessonError(CkptVizError):
    """A lesson's data does not fit the format, or its check does not hold on its run (`ckpt_viz.lessons`)."""

    code = "lesson_invalid"


class TraceError(CkptVizError, ValueError):
    """A trace could not be read or validated."""

    code = "trace_invalid"


class TraceFileError(TraceError, OSError):
    """The operating system refused to read or write a trace file; also an OSError, with its `errno`."""

    code = "trace_file_failed"


def tip_for(code: str) -> str:
    """The "Tip: ..." text of a diagnosis code, naming the code so that the docs can be found."""
    return f"{DIAGNOSIS_CODES[code].tip} (diagnosis {code})"


def _released_by(reason: str | None, seq: int | None, site: str | None) -> str:
    if reason is None:
        return ""
    where = ""
    if seq is not None:
        where = f" at event #{seq}"
    if site:
        where += f" ({site})"
    return f" It was released{where} with reason {reason}."


class HandleReleasedError(CheckpointError):
    """E6/E7: a released reentrant handle was asked to replay or change phase."""

    code = "handle_released"

    def __init__(self, api: str, phrase: str, handle_id: int, reason: str | None,
                 seq: int | None = None, site: str | None = None) -> None:
        self.handle_id = handle_id
        self.reason = reason
        code = CODE_FOR_REASON.get(reason or "")
        tip = tip_for(code) if code is not None else "do not use a handle after it was released."
        super().__init__(f"{api}: {phrase} (handle h{handle_id}).{_released_by(reason, seq, site)}\nTip: {tip}",
                         code=code)


class GraphReleasedError(CheckpointError):
    """E8: the checkpoint's autograd node was collected before its first replay."""

    code = "outputs_dropped_before_replay"

    def __init__(self, api: str, handle_id: int, collected_seq: int | None = None) -> None:
        self.handle_id = handle_id
        seen = f" The node was collected at event #{collected_seq}." if collected_seq is not None else ""
        super().__init__(
            f"{api}: Reentrant checkpoint output graph was released before replay (handle h{handle_id}).{seen}\n"
            f"Tip: {tip_for(self.code)}"
        )


class PhaseNotSetError(CheckpointError):
    """E9: the engine reached a split handle whose phase is still "ordinary"."""

    code = "phase_not_set"

    def __init__(self, handle_id: int, helper: str | None = None) -> None:
        self.handle_id = handle_id
        self.helper = helper
        if helper is None:
            tip = tip_for(self.code)
        else:  # the caller already uses the helper, which sets the phase of the handles it is given: h was not one
            tip = (f"pass every handle of the micro-batch's scope in `handles=` of {helper} (h{handle_id} was not "
                   f"among them, so nothing set its phase), or call set_phase on it yourself (diagnosis {self.code})")
        super().__init__(
            f"ckpt_viz.checkpoint (backward): Set dx or dw phase on reentrant handles before split backward "
            f"(handle h{handle_id} is split because it was created in reentrant_checkpoint_scope, and its phase is "
            f"'ordinary'{f'; reached by {helper}' if helper else ''}).\nTip: {tip}"
        )


class ExcludedRegionError(CheckpointError):
    """A checkpoint-excluded region could not serve its replay (raise sites pass a precise `code`)."""

    code = "excluded_region_failed"


class SessionMismatchError(CheckpointUsageError):
    """E10: `bind_session(sid)` while a session with another id is active."""

    code = "session_mismatch"

    def __init__(self, api: str, handle_id: int, active: Hashable, wanted: Hashable) -> None:
        self.handle_id = handle_id
        super().__init__(
            f"{api}: Active session does not match the reentrant handle session (active {active!r}, binding "
            f"h{handle_id} to {wanted!r}).\nTip: {tip_for(self.code)}"
        )


class ModelLoadError(CkptVizError):
    """A user model could not be loaded, or failed its checks.

    Attributes:
        file: the file at fault, when known.
        line: the line at fault in `file`, when known.
        traceback: the text of the underlying traceback ("" when there is none), for the app to show.
    """

    code = "model_load_failed"

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 traceback: str = "") -> None:
        super().__init__(message)
        self.file = file
        self.line = line
        self.traceback = traceback


class SandboxError(ModelLoadError):
    """The child running a user model failed (a `ModelLoadError`, so one except clause catches all).

    Attributes (besides file, line and traceback):
        pid: the child's process id.
        returncode: its exit status (negative: killed by that signal), or None if it was killed on timeout.
        output: the tail of its stdout and stderr.
    """

    code = "sandbox_failed"

    def __init__(self, message: str, *, pid: int | None = None, returncode: int | None = None,
                 output: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.pid = pid
        self.returncode = returncode
        self.output = output


class SandboxTimeoutError(SandboxError):
    """The child did not finish within the time limit; its process group was killed.

    Attributes (besides SandboxError's):
        partial_trace: the trace the child had recorded when time ran out (its meta "partial" True and
            "partial_reason" saying why), or None when the run had not started recording.
    """

    code = "sandbox_timeout"
    partial_trace: Any = None


class SandboxMemoryError(SandboxError):
    """The child ran out of memory under its limit."""

    code = "sandbox_out_of_memory"


class SandboxRunError(SandboxError):
    """The model loaded but raised while the scenario ran."""

    code = "sandbox_run_failed"


class SandboxCrashError(SandboxError):
    """The child died (signal, os._exit, abort) or left no usable trace or report."""

    code = "sandbox_crashed"


class DotLimitError(CkptVizError):
    """Graphviz's `dot` went over its time or memory limit drawing a graph, or its session ended
    (NOTE [ dot's limits ] in ckpt_viz.render.svg)."""

    code = "dot_limit"


_TORCH_PHRASES = {"backward through the graph a second time": "second_backward_through_graph",
                  "passing an `inputs` parameter to .backward()": "torch_reentrant_with_grad"}


def error_code(exc: BaseException) -> str | None:
    """The code of `exc`: a ckpt_viz error's `code`, else that of PyTorch's key phrase in it (torch has no codes)."""
    if isinstance(exc, CkptVizError):
        return exc.code
    text = str(exc)
    return next((code for phrase, code in _TORCH_PHRASES.items() if phrase in text), None)


def internal_assert(condition: bool, what: str) -> None:
    """Guard an invariant of ckpt_viz itself (never a user mistake)."""
    if not condition:
        raise AssertionError(
            f"This is a bug in ckpt_viz: {what}. Please report it with the render_text output of the trace."
        )
