"""Broken runs to explore: built-in scenarios that each record one real mistake with the real runtime.

Owns `BROKEN` (name -> `BrokenScenario`) and `record_broken(name)`. Each scenario runs a
few lines of schedule (below, in this file) inside `record()`: the error it provokes is
caught and stays in the trace as an `error` event, so the Debugger page and
`ckpt-viz explain` have something to explain. Events point at the scenario's own lines
here (the user-level step), never at the runtime. Imports torch; never the UI. The
names are listed torch-free in `ckpt_viz.catalog.BROKEN_SCENARIO_NAMES`
(tests/core/test_layering.py checks they agree).

NOTE [ Adding a broken scenario ]
  1. Write `def _my_case(run: BrokenRun) -> None:` doing the broken steps. Use
     `run.session("name")` for session ids (run-local: two app sessions never share
     one) and `run.cleanup(fn)` for what must happen after the recording closes
     (release a leaked handle, clear a session) so the process is left clean.
  2. Register it with `BROKEN["my-case"] = BrokenScenario(title, expected_code,
     _my_case)` (expected_code: the code `ckpt_viz.diagnose` must report, a key of
     `ckpt_viz.codes.DIAGNOSIS_CODES`) and add "my-case" to
     `catalog.BROKEN_SCENARIO_NAMES`. Another module can do the same at import
     (`from ckpt_viz.run.broken import BROKEN, BrokenScenario`), if this module
     imports it at its end (see `_EXTRA_MODULES`).
  3. tests/run/test_broken.py records every scenario and checks its code.
"""
from __future__ import annotations

import gc
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ckpt_viz.errors import CkptVizError
from ckpt_viz.recording import record
from ckpt_viz.run.harness import RunSession, fresh_handle_ids
from ckpt_viz.runtime import (
    backward_input,
    backward_weight,
    checkpoint,
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
    reentrant_checkpoint_scope,
)
from ckpt_viz.trace import Trace, run_meta

__all__ = ["BROKEN", "BrokenRun", "BrokenScenario", "broken_scenarios", "record_broken"]

_API = "ckpt_viz.record_broken"


@dataclass(frozen=True)
class BrokenScenario:
    """One broken run: what it shows, the finding it must give, and its steps.

    Attributes:
        title: one line for people ("DX after DW").
        expected_code: the code `ckpt_viz.diagnose` reports for it (a key of DIAGNOSIS_CODES).
        run: the broken steps, called with a `BrokenRun` inside `record()`; may raise.
        mode: the checkpoint mode it uses, stored in the trace's meta.
    """

    title: str
    expected_code: str
    run: Callable[[BrokenRun], Any]
    mode: str = "split-reentrant"


@dataclass
class BrokenRun:
    """What a scenario's steps get: run-local session ids and cleanups run after the recording."""

    cleanups: list[Callable[[], Any]] = field(default_factory=list)
    sessions: dict[str, RunSession] = field(default_factory=dict)

    def session(self, name: str) -> RunSession:
        """A session id unique to this run, shown as `name` (see NOTE [ Run-local session ids ] in harness.py).

        It is cleared when the steps end, inside the recording (a scenario about a session never
        cleared makes its own `RunSession` and clears it in a `cleanup`).
        """
        if name not in self.sessions:
            self.sessions[name] = RunSession(name)
        return self.sessions[name]

    def end(self) -> None:
        for sid in self.sessions.values():
            try:
                clear_recompute_session(sid)
            except Exception:  # a broken run may have left it half-done; the trace is what matters
                pass

    def cleanup(self, fn: Callable[[], Any]) -> None:
        self.cleanups.append(fn)


# ---------------------------------------------------------------- the small models the scenarios use

def _leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


def _block(w: torch.Tensor, name: str = "block") -> Callable[[torch.Tensor], torch.Tensor]:
    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ w)
    block.__qualname__ = block.__name__ = name  # what the trace calls the handle's block
    return block


def _ordinary(x: torch.Tensor, w: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """An unscoped reentrant checkpoint: (handle, loss)."""
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(_block(w), x, use_reentrant=True)
    return handles[0], (out * out).sum()


def _split(x: torch.Tensor, w: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """A split (DX/DW) reentrant checkpoint: (handle, loss)."""
    with reentrant_checkpoint_scope([w]) as handles:
        out = checkpoint(_block(w), x, use_reentrant=True)
    return handles[0], (out * out).sum()


# ---------------------------------------------------------------- the scenarios (the lines a trace points at)

def _dx_after_dw(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    h, loss = _split(x, w)
    backward_weight(loss, None, [w], handles=[h])  # DW first: it releases h
    backward_input(loss, None, [x], handles=[h])   # DX now finds h released


def _second_backward(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    _h, loss = _ordinary(x, w)
    loss.backward(retain_graph=True)  # the first backward releases the handle
    loss.backward()                   # retain_graph did not keep it


def _phase_never_set(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    _h, loss = _split(x, w)
    loss.backward()  # a split handle reached with its phase still "ordinary"


def _session_cleared_early(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    h, loss = _split(x, w)
    sid = run.session("step")
    backward_input(loss, None, [x], handles=[h], session_id=sid)
    clear_recompute_session(sid)  # cleared before DW ran
    backward_weight(loss, None, [w], handles=[h], session_id=sid)


def _prefire_after_backward(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    h, loss = _ordinary(x, w)
    loss.backward()
    recompute_handle(h, run.session("prefire"))  # too late: the backward released it


def _outputs_dropped(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(_block(w), x, use_reentrant=True)
    del out  # every output dropped: the checkpoint's node dies
    gc.collect()
    recompute_handle(handles[0], run.session("prefire"))


def _dw_without_trigger(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    h, loss = _split(x, w)
    run.cleanup(h.release)
    backward_input(loss, None, [x], handles=[h])
    h.set_phase("dw")
    torch.autograd.backward(loss, inputs=[w], retain_graph=True)  # DW without h.backward_trigger


def _dx_without_retain_graph(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    h, loss = _split(x, w)
    run.cleanup(h.release)
    h.set_phase("dx")
    torch.autograd.grad(loss, [x])  # DX without retain_graph=True frees the outer graph
    h.set_phase("dw")
    torch.autograd.backward(loss, inputs=[w, h.backward_trigger])


def _released_by_hand(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    h, loss = _ordinary(x, w)
    h.release()  # a cancellation
    loss.backward()


def _session_never_bound(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    _h, loss = _ordinary(x, w)
    with recompute_session_ctx(run.session("step"), retain_on_unpack=True):
        loss.backward(retain_graph=True)  # the handle was never bound to the session
        loss.backward()


def _session_mismatch(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    h, loss = _ordinary(x, w)
    h.bind_session(run.session("a"))
    with recompute_session_ctx(run.session("b"), retain_on_unpack=True):
        loss.backward(retain_graph=True)  # bound to "a", run under "b"
        loss.backward()


def _dw_skips_a_handle(run: BrokenRun) -> None:
    x, w1, w2 = _leaf(4, 8), _leaf(8, 8), _leaf(8, 8)
    with reentrant_checkpoint_scope([w1, w2]) as handles:
        mid = checkpoint(_block(w1, "block1"), x, use_reentrant=True)
        out = checkpoint(_block(w2, "block2"), mid, use_reentrant=True)
    loss = (out * out).sum()
    run.cleanup(handles[0].release)
    backward_input(loss, None, [x], handles=handles)
    backward_weight(loss, None, [w2], handles=handles[1:])  # h0 left out: DW never reaches it


class _Gated(torch.nn.Module):
    """A block with a gate layer its forward no longer uses (a feature turned off)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.gate = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x))  # self.gate is never used


def _params_without_grad(run: BrokenRun) -> None:
    block, x = _Gated(), _leaf(4, 8)
    with reentrant_checkpoint_scope(block.parameters) as handles:
        out = checkpoint(block, x, use_reentrant=True)
    loss = (out * out).sum()
    backward_input(loss, None, [x], handles=handles)
    backward_weight(loss, None, list(block.parameters()), handles=handles)


def _session_never_cleared(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    h, loss = _ordinary(x, w)
    sid = RunSession("step")
    run.cleanup(lambda: clear_recompute_session(sid))
    recompute_handle(h, sid)  # prefire into the session
    with recompute_session_ctx(sid, retain_on_unpack=True):
        loss.backward()
    # ... and no clear_recompute_session(sid): the session keeps h and its replay alive


def _replayed_twice(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(_block(w), x, use_reentrant=False)
    loss = (out * out).sum()
    backward_input(loss, None, [x], handles=handles)   # no session_id: DX replays ...
    backward_weight(loss, None, [w], handles=handles)  # ... and DW replays again


def _unpacked_twice(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    with recompute_handle_collector_ctx() as frames:
        out = checkpoint(_block(w), x, use_reentrant=False)
    loss = (out * out).sum()
    sid = run.session("step")
    recompute_handle(frames[0], sid)  # prefire: the replay's tensors wait in the session
    with recompute_session_ctx(sid, retain_on_unpack=False):  # each saved tensor serves one unpack
        torch.autograd.grad(loss, [x], retain_graph=True)
        torch.autograd.grad(loss, [w])


def _saved_count_mismatch(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    calls: list[int] = []

    def block(t: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        y = torch.tanh(t @ w)
        return torch.sin(y) if len(calls) == 1 else y  # the replay skips a step the forward took

    out = checkpoint(block, x, use_reentrant=False)
    (out * out).sum().backward()


def _metadata_mismatch(run: BrokenRun) -> None:
    x = _leaf(4, 8)
    calls: list[int] = []

    def block(t: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        scale = torch.full((8,), 2.0) if len(calls) > 1 else torch.full((4, 8), 2.0)  # another shape in the replay
        return t * scale

    out = checkpoint(block, x, use_reentrant=False)
    out.sum().backward()


def _unasked_accumulation(run: BrokenRun) -> None:
    x, w = _leaf(4, 8), _leaf(8, 8)
    w_other = _leaf(8, 8)  # captured by the block, never asked for

    def block(t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(t @ w) @ w_other
    block.__qualname__ = block.__name__ = "block"
    out = checkpoint(block, x, use_reentrant=True)  # outside a split scope
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the UnaskedAccumulationWarning: the finding says it
        torch.autograd.grad(out.sum(), [x])  # input grads only, as a pipeline stage's I action asks


BROKEN: dict[str, BrokenScenario] = {
    "dx-after-dw": BrokenScenario("DX after DW", "released_by_dw", _dx_after_dw),
    "second-backward": BrokenScenario("A second ordinary backward", "released_by_ordinary_backward",
                                      _second_backward, mode="reentrant"),
    "phase-never-set": BrokenScenario("Phase never set", "phase_not_set", _phase_never_set),
    "session-cleared-early": BrokenScenario("Session cleared before DW", "session_cleared_early",
                                            _session_cleared_early),
    "prefire-after-backward": BrokenScenario("Prefire after the backward", "prefire_after_release",
                                             _prefire_after_backward, mode="reentrant"),
    "outputs-dropped": BrokenScenario("Outputs dropped before the replay", "outputs_dropped_before_replay",
                                      _outputs_dropped, mode="reentrant"),
    "dw-without-trigger": BrokenScenario("DW without the handle's trigger", "trigger_missing_in_dw",
                                         _dw_without_trigger),
    "dx-without-retain-graph": BrokenScenario("DX without retain_graph", "dx_without_retain_graph",
                                              _dx_without_retain_graph),
    "released-by-hand": BrokenScenario("Released by hand, then used", "released_explicitly", _released_by_hand,
                                       mode="reentrant"),
    "session-never-bound": BrokenScenario("Retaining session, handle never bound", "session_never_bound",
                                          _session_never_bound, mode="reentrant"),
    "session-mismatch": BrokenScenario("Bound to one session, run under another", "session_mismatch",
                                       _session_mismatch, mode="reentrant"),
    "dw-skips-a-handle": BrokenScenario("DW skips a handle", "dw_skipped_handles", _dw_skips_a_handle),
    "params-without-grad": BrokenScenario("A parameter the block never uses", "params_without_grad",
                                          _params_without_grad),
    "session-never-cleared": BrokenScenario("Session never cleared", "session_never_cleared",
                                            _session_never_cleared, mode="reentrant"),
    "replayed-twice": BrokenScenario("DX and DW replay twice (no session)", "replayed_more_than_once",
                                     _replayed_twice, mode="split-nonreentrant"),
    "unpacked-twice": BrokenScenario("Two backwards in one non-retaining session", "unpacked_twice_in_session",
                                     _unpacked_twice, mode="nonreentrant"),
    "saved-count-mismatch": BrokenScenario("The replay takes another path", "saved_count_mismatch",
                                           _saved_count_mismatch, mode="nonreentrant"),
    "metadata-mismatch": BrokenScenario("The replay sees another shape", "metadata_mismatch", _metadata_mismatch,
                                        mode="nonreentrant"),
    "unasked-accumulation": BrokenScenario("autograd.grad through an unscoped checkpoint",
                                           "unasked_grads_accumulated", _unasked_accumulation, mode="reentrant"),
}

# Modules that add their scenarios to BROKEN at import (NOTE rule 2); imported on first use.
_EXTRA_MODULES: tuple[str, ...] = ("ckpt_viz.run.divergent",)


def _load_extras() -> None:
    for module in _EXTRA_MODULES:
        importlib.import_module(module)


def broken_scenarios() -> dict[str, BrokenScenario]:
    """Every broken scenario, those that other modules add included (NOTE rule 2): `BROKEN`, complete."""
    _load_extras()
    return BROKEN


def record_broken(name: str, *, seed: int = 0, memory: bool = False, graphs: bool = False) -> Trace:
    """Record the broken scenario `name` (a key of `BROKEN`) and return its trace, the error included.

    Raises:
        CkptVizError: an unknown name.
    """
    _load_extras()
    scenario = BROKEN.get(name)
    if scenario is None:
        raise CkptVizError(f"{_API}: no broken scenario {name!r}; expected one of {', '.join(sorted(BROKEN))}.\n"
                           "Tip: `ckpt-viz record --help` lists them.")
    run = BrokenRun()
    torch.manual_seed(seed)
    fresh_handle_ids()
    rec = record(memory=memory, graphs=graphs)
    try:
        with rec:
            try:
                scenario.run(run)
            finally:
                run.end()
    except Exception:  # the error is the point: record() stored it as an `error` event
        pass
    finally:
        for fn in reversed(run.cleanups):
            try:
                fn()
            except Exception:  # a cleanup of an already broken run; the trace is what matters
                pass
    rec.trace.meta.update(run_meta(model=name, mode=scenario.mode, source="broken", description=scenario.title,
                                   seed=seed, expected_code=scenario.expected_code))
    return rec.trace
