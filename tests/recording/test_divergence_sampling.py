"""Which replays a recording checks (NOTE [ Sampled replay checks ] in ckpt_viz/runtime/divergence_sampling.py).

A region's first runs are always checked, later ones are a sample, every trace counts the
runs checked and skipped, and the debugger says so; `checks("all")` checks every run.
"""
from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ckpt_viz import diagnose, explain
from ckpt_viz.analysis.diagnosis import replay_checks_note
from ckpt_viz.recording import record
from ckpt_viz.runtime import checkpoint, divergence
from ckpt_viz.runtime import divergence_sampling as sampling
from ckpt_viz.trace import Trace

K = sampling.FIRST_CHECKS


class Flaky(nn.Module):
    """A block whose replay adds 1 to its output once `broken` is set (a divergence that starts late)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.broken = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.lin(x))
        return y + 1 if self.broken and torch.is_grad_enabled() else y  # the reentrant forward runs under no_grad


def _step(blocks: list[nn.Module], reentrant: bool = True) -> Trace:
    x = torch.randn(4, 8, requires_grad=True)
    with record() as rec:
        h = x
        for block in blocks:
            h = checkpoint(block, h, use_reentrant=reentrant)
        h.sum().backward()
    return rec.trace


@pytest.fixture
def never_sampled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After its first runs a region is never checked again (no budget, no floor): the tests are deterministic."""
    monkeypatch.setattr(sampling, "BUDGET", 0.0)
    monkeypatch.setattr(sampling, "P_MIN", 0.0)
    yield


def test_the_first_runs_of_a_region_are_checked_then_sampled(never_sampled: None) -> None:
    blocks = [Flaky(), Flaky()]
    counts = [_step(blocks).meta["replay_checks"] for _ in range(K + 2)]
    assert [c["checked"] for c in counts] == [2] * K + [0, 0]
    assert [c["skipped"] for c in counts] == [0] * K + [2, 2]
    assert counts[-1]["policy"] == "sampled" and counts[-1]["skipped_regions"] == {"Flaky": 2}
    # A new model is a new region: checked from its first run, whatever ran before it.
    assert _step([Flaky(), Flaky()]).meta["replay_checks"]["checked"] == 2


def test_a_divergence_after_the_first_clean_runs_is_found_with_all_and_reported_unchecked_otherwise(
        never_sampled: None) -> None:
    blocks = [Flaky()]
    for _ in range(K):  # K clean runs, all checked
        assert not _step(blocks).of_kind("replay_diverged")
    blocks[0].broken = True
    sampled = _step(blocks)
    assert not sampled.of_kind("replay_diverged") and diagnose(sampled) == []
    assert sampled.meta["replay_checks"]["skipped"] == 1
    note = replay_checks_note(sampled)
    assert note is not None and "0 of 1 checkpointed runs checked" in note and "checks('all')" in note
    out = io.StringIO()
    assert note in explain(sampled, file=out)  # explain() never ends on "no problem found" alone
    with divergence.checks("all"):
        every = _step(blocks)
    assert [e.divergence for e in every.of_kind("replay_diverged")] == ["outputs_differ"]
    assert every.meta["replay_checks"] == {**every.meta["replay_checks"], "policy": "all", "checked": 1,
                                           "skipped": 0}
    assert replay_checks_note(every) is None
    # A region that diverged once is checked on every run from then on, also under the sampled policy.
    again = [_step(blocks) for _ in range(3)]
    assert all(t.meta["replay_checks"]["checked"] == 1 and t.of_kind("replay_diverged") for t in again)


def test_non_reentrant_frames_follow_the_same_policy(never_sampled: None) -> None:
    blocks = [Flaky()]
    counts = [_step(blocks, reentrant=False).meta["replay_checks"] for _ in range(K + 1)]
    assert [c["checked"] for c in counts] == [1] * K + [0]


def _closure_over(m: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: torch.tanh(m(t))


def test_closures_over_different_modules_are_different_regions(never_sampled: None) -> None:
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    assert sampling.region_of(_closure_over(a)) is not sampling.region_of(_closure_over(b))
    assert sampling.region_of(_closure_over(a)) is sampling.region_of(_closure_over(a))  # the same each step
    defaults = [lambda t, m=m: torch.tanh(m(t)) for m in (a, b)]  # one code object, the module a default
    assert sampling.region_of(defaults[0]) is not sampling.region_of(defaults[1])
    plain = [lambda t, k=k: torch.tanh(t * k) for k in (1.0, 2.0)]  # no owner at all: code and qualname only
    assert sampling.region_of(plain[0]) is sampling.region_of(plain[1])


def test_the_budget_sets_how_often_a_region_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "BUDGET", 1e9)  # checks free against the recorded time: every run is checked
    blocks = [Flaky()]
    assert [_step(blocks).meta["replay_checks"]["checked"] for _ in range(K + 3)] == [1] * (K + 3)
    region = sampling.region_of(blocks[0])
    assert region.checked == K + 3 and region.spent > 0.0 and region.skip == 0


def test_sampled_and_all_runs_give_pytorchs_gradients() -> None:
    grads = {}
    for policy in ("sampled", "all", False):
        torch.manual_seed(0)
        blocks = [Flaky(), Flaky()]
        x = torch.randn(4, 8)
        for _ in range(K + 2):
            for block in blocks:
                block.zero_grad(set_to_none=True)
            with divergence.checks(policy), record():
                h = x.requires_grad_(True)
                for block in blocks:
                    h = checkpoint(block, h, use_reentrant=True)
                h.sum().backward()
        grads[policy] = [p.grad.clone() for block in blocks for p in block.parameters()]
    torch.manual_seed(0)
    plain = [Flaky(), Flaky()]
    x = torch.randn(4, 8)
    h = x.requires_grad_(True)
    for block in plain:
        h = block(h)
    h.sum().backward()
    want = [p.grad for block in plain for p in block.parameters()]
    for got in grads.values():
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_the_switch_keeps_its_on_off_meaning_and_names_the_policies() -> None:
    previous = divergence.set_checks(True)
    try:
        assert divergence.set_checks("all") == "sampled"  # True means the default policy
        assert divergence.set_checks(False) == "all"
        assert divergence.set_checks("sampled") is False  # off reads as False, as before
        with pytest.raises(ValueError, match=r"^ckpt_viz.runtime.divergence.set_checks: .*\nTip: "):
            divergence.set_checks("sometimes")
    finally:
        divergence.set_checks(previous)


def test_nested_recordings_each_count_the_runs_they_saw(never_sampled: None) -> None:
    blocks, x = [Flaky()], torch.randn(4, 8, requires_grad=True)
    with record() as outer:
        for _ in range(K):
            _step(blocks)
        with record() as inner:
            checkpoint(blocks[0], x, use_reentrant=True).sum().backward()
    assert inner.trace.meta["replay_checks"]["checked"] == 0 and inner.trace.meta["replay_checks"]["skipped"] == 1
    assert outer.trace.meta["replay_checks"]["checked"] == K and outer.trace.meta["replay_checks"]["skipped"] == 1


def test_a_checked_replay_leaves_no_hook_on_the_parameters() -> None:
    blocks = [Flaky()]
    _step(blocks)  # the first step: no .grad yet, so the gradient check reads .grad and hooks nothing
    user_hook = blocks[0].lin.bias.register_hook(lambda g: None)  # the user's own hook stays as it was
    with divergence.checks("all"):
        _step(blocks)  # .grad now set: the check hooks each parameter while the region's backward runs
    assert blocks[0].lin.weight._backward_hooks is None
    assert len(blocks[0].lin.bias._backward_hooks) == 1
    user_hook.remove()


def test_checks_off_keep_no_counts() -> None:
    with divergence.checks(False):
        trace = _step([Flaky()])
    assert "replay_checks" not in trace.meta and replay_checks_note(trace) is None


def test_unchecked_leaves_out_this_contexts_checks_only() -> None:
    """`divergence.unchecked()` (the planner times replays with it): a region's first run, always checked otherwise,
    is not checked inside it, while a recording on another thread at the same time keeps its checks."""
    import threading

    here, there = [Flaky()], [Flaky()]
    other: list[Trace] = []
    with divergence.unchecked():
        inside = _step(here)
        worker = threading.Thread(target=lambda: other.append(_step(there)))
        worker.start()
        worker.join()
    assert not (inside.meta.get("replay_checks") or {}).get("checked")
    assert other[0].meta["replay_checks"]["checked"] == 1
    assert _step(here).meta["replay_checks"]["checked"] == 1  # after the block: its first checked run comes now


def test_a_saved_trace_keeps_its_counts_and_explain_says_what_was_not_checked(
        never_sampled: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = [Flaky()]
    for _ in range(K):
        _step(blocks)
    trace = _step(blocks)
    trace.save(tmp_path / "t.json")
    again = Trace.load(tmp_path / "t.json")
    assert again.meta["replay_checks"] == trace.meta["replay_checks"]
    assert replay_checks_note(again) == replay_checks_note(trace)
    assert replay_checks_note(again) in explain(again, file=io.StringIO())


def test_ckpt_viz_explain_says_what_was_not_checked(never_sampled: None, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_viz.cli import main as cli_main

    blocks = [Flaky()]
    for _ in range(K):
        _step(blocks)
    _step(blocks).save(tmp_path / "t.json")
    capsys.readouterr()
    assert cli_main(["explain", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "no problem found." in out and "1 not checked (Flaky 1)" in out


def test_info_never_says_no_problem_alone_when_runs_were_not_checked(never_sampled: None, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # `ckpt-viz info` says what explain() says (the CLI reads replay_checks_note).
    from ckpt_viz.cli import main as cli_main

    blocks = [Flaky()]
    for _ in range(K):
        _step(blocks)
    blocks[0].broken = True
    _step(blocks).save(tmp_path / "t.json")
    capsys.readouterr()
    assert cli_main(["info", str(tmp_path / "t.json")]) == 0
    assert "not checked" in capsys.readouterr().out
