"""Replays that do not reproduce their forward: what a recording detects, and the findings it gives.

Each divergent model (ckpt_viz/run/divergent.py) is checked against what really happened
(the key/value gradients really are zero, the running statistics really are updated twice),
and clean runs of every built-in model in every mode give no `replay_diverged` event.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_viz import Trace, diagnose
from ckpt_viz.analysis._divergence import DIVERGENCE_CODES  # the twin table the analysis reads
from ckpt_viz.catalog import BUILTIN_MODEL_NAMES, MODES
from ckpt_viz.codes import DIAGNOSIS_CODES
from ckpt_viz.recording import record
from ckpt_viz.run import divergent
from ckpt_viz.run.blocks import checkpointed
from ckpt_viz.run.broken import BROKEN, record_broken
from ckpt_viz.run.harness import fresh_handle_ids
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import ModelSpec, build_builtin
from ckpt_viz.runtime import checkpoint, divergence

KV = {f"blocks.{b}.{p}.{w}" for b in (0, 1) for p in ("k", "v") for w in ("weight", "bias")}


def _diverged(trace: Trace) -> set[tuple[int | None, str]]:
    """(block index, divergence): handles numbered in the order they were created (ids may not start at 0)."""
    order = {e.handle_id: i for i, e in enumerate(trace.of_kind("handle_created"))}
    return {(order.get(e.handle_id), e.divergence) for e in trace.of_kind("replay_diverged")}


def _record(spec: ModelSpec, **checkpoint_kwargs: object) -> Trace:
    fresh_handle_ids()
    with record(model=spec.model) as rec:
        divergent.run_reentrant(spec, **checkpoint_kwargs)
    return rec.trace


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _unchecked_grads(spec: ModelSpec) -> dict[str, torch.Tensor]:
    spec.model.zero_grad(set_to_none=True)
    spec.loss_of(spec.model(spec.inputs[0].clone().requires_grad_(True))).backward()
    grads = _grads(spec.model)
    spec.model.zero_grad(set_to_none=True)
    return grads


@pytest.fixture(scope="module")
def cached() -> tuple[ModelSpec, Trace, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    spec = divergent.decoder_spec(use_cache=True)
    want = _unchecked_grads(spec)
    trace = _record(spec)
    return spec, trace, _grads(spec.model), want


def test_the_runtime_and_the_trace_reader_name_the_same_codes() -> None:
    assert divergence.DIVERGENCES == DIVERGENCE_CODES
    assert set(DIVERGENCE_CODES.values()) <= set(DIAGNOSIS_CODES)


def test_cached_decoder_loses_the_key_and_value_gradients_and_says_so(cached: tuple) -> None:
    _, trace, got, want = cached
    # What really happened: the key and value projections got exactly zero gradient, unlike the unchecked model.
    assert all(torch.count_nonzero(got[n]) == 0 for n in KV)
    assert all(torch.count_nonzero(want[n]) > 0 for n in KV)
    assert all(torch.equal(got[n], want[n]) for n in want if n not in KV and n.startswith("head"))
    # What the recording says: per block, the lost gradients and the mutated cache; the values were identical.
    assert _diverged(trace) == {(h, kind) for h in (0, 1) for kind in ("gradient_lost", "input_mutated")}
    lost = {d for e in trace.of_kind("replay_diverged") if e.divergence == "gradient_lost"
            for d in e.details}
    assert lost == {f"{n} (zero gradient)" for n in KV}
    mutated = next(e for e in trace.of_kind("replay_diverged") if e.divergence == "input_mutated")
    assert any(d.startswith("cache.keys") for d in mutated.details)


def test_cached_decoder_findings_name_the_cause_and_the_fix(cached: tuple) -> None:
    findings = diagnose(cached[1])
    created = [e.handle_id for e in cached[1].of_kind("handle_created")]
    assert sorted((f.code, f.handle_id) for f in findings) == sorted(
        (code, h) for h in created for code in ("replay_lost_gradient", "replay_input_mutated"))
    lost = next(f for f in findings if f.code == "replay_lost_gradient")
    assert "use_cache=False" in lost.fix and "gradient_checkpointing_enable()" in lost.fix
    assert "blocks.0.k.weight" in lost.explanation and len(lost.explanation.splitlines()) <= 25
    assert lost.site is not None and "x = block(x, cache)" in cached[1].meta["sources"][lost.site]


def test_a_saved_trace_explains_the_divergence_itself(cached: tuple, tmp_path: Path) -> None:
    cached[1].save(tmp_path / "t.json")
    again = Trace.load(tmp_path / "t.json")
    assert [(f.code, f.handle_id) for f in diagnose(again)] == [(f.code, f.handle_id) for f in diagnose(cached[1])]


def test_the_same_decoder_without_its_cache_has_no_finding_and_exact_gradients() -> None:
    spec = divergent.decoder_spec(use_cache=False)
    want = _unchecked_grads(spec)
    trace = _record(spec)
    assert trace.of_kind("replay_started") and not _diverged(trace) and diagnose(trace) == []
    got = _grads(spec.model)
    assert all(torch.equal(got[n], want[n]) for n in want)


def test_batchnorm_replays_update_the_running_statistics_again() -> None:
    spec = divergent.batchnorm_spec()
    trace = _record(spec)
    assert _diverged(trace) == {(0, "buffers_updated"), (1, "buffers_updated")}
    assert all(int(b.bn.num_batches_tracked) == 2 for b in spec.model.blocks)  # one step, counted twice
    details = trace.of_kind("replay_diverged")[0].details
    assert details == ("bn.running_mean, bn.running_var, bn.num_batches_tracked: updated again in the replay",)
    assert {f.code for f in diagnose(trace)} == {"replay_updated_buffers"}


def test_dropout_without_preserve_rng_state_replays_other_values() -> None:
    spec = divergent.dropout_block_spec()
    assert _diverged(_record(spec, preserve_rng_state=False)) == {(0, "outputs_differ"), (1, "outputs_differ")}
    assert not _diverged(_record(divergent.dropout_block_spec(), preserve_rng_state=True))


def test_a_captured_tensor_edited_in_place_after_the_forward_changes_the_replay() -> None:
    scale = torch.ones(8)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    fresh_handle_ids()
    with record() as rec:
        out = checkpoint(lambda t: torch.tanh(t @ w) * scale, x, use_reentrant=True)
        scale.mul_(3.0)  # after the forward, before the replay
        out.sum().backward()
    assert _diverged(rec.trace) == {(0, "outputs_differ")}


def test_a_replay_that_reuses_the_forwards_result_does_not_reach_its_parameters() -> None:
    lin, memo = torch.nn.Linear(8, 8), {}

    def block(t: torch.Tensor) -> torch.Tensor:
        if "k" not in memo:  # computed in the forward, reused (detached) by the replay
            memo["k"] = lin(t)
        return torch.tanh(t + memo["k"])

    x = torch.randn(4, 8, requires_grad=True)
    fresh_handle_ids()
    with record() as rec:
        checkpoint(block, x, use_reentrant=True).sum().backward()
    assert lin.weight.grad is None and x.grad is not None
    (event,) = rec.trace.of_kind("replay_diverged")
    assert event.divergence == "gradient_lost"
    assert event.details == tuple(f"a tensor of shape {shape} (not reached by the replay's graph)"
                                  for shape in ([8, 8], [8]))


def test_a_module_parameter_its_forward_never_uses_is_no_lost_gradient() -> None:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.spare = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)  # spare: never called

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.used(t))

    block, x = Block(), torch.randn(4, 8, requires_grad=True)
    with record() as rec:
        checkpoint(block, x, use_reentrant=True).sum().backward()
    assert block.spare.weight.grad is None and rec.trace.of_kind("replay_started")
    assert not rec.trace.of_kind("replay_diverged")


def test_non_reentrant_recomputes_see_the_mutated_cache_and_the_batchnorm_update() -> None:
    found = {}
    for spec in (divergent.decoder_spec(use_cache=True), divergent.batchnorm_spec()):
        fresh_handle_ids()
        with record(model=spec.model) as rec:
            with checkpointed(spec.model, spec.checkpoint, use_reentrant=False):
                loss = spec.loss_of(spec.model(spec.inputs[0]))
            loss.backward()
        found[spec.name] = sorted(e.divergence for e in rec.trace.of_kind("replay_diverged"))
        assert len({e.handle_id for e in rec.trace.of_kind("replay_diverged")}) == 2  # both blocks
    assert found == {"cached-decoder": ["input_mutated"] * 2, "batchnorm": ["buffers_updated"] * 2}


@pytest.mark.parametrize("preserve", [False, True])
def test_non_reentrant_dropout_without_rng_state_saves_other_activations(preserve: bool) -> None:
    spec = divergent.dropout_block_spec()
    with record(model=spec.model) as rec:
        h = spec.inputs[0].clone().requires_grad_(True)
        for block in spec.model.blocks:
            h = checkpoint(block, h, use_reentrant=False, preserve_rng_state=preserve)
        h.sum().backward()
    kinds = [e.divergence for e in rec.trace.of_kind("replay_diverged")]
    assert kinds == ([] if preserve else ["outputs_differ"] * 2)
    assert all(d.startswith("saved tensor ") for e in rec.trace.of_kind("replay_diverged") for d in e.details)


def test_checks_switched_off_record_nothing_and_never_change_gradients() -> None:
    grads = {}
    for on in (True, False):
        spec = divergent.decoder_spec(use_cache=True)
        with divergence.checks(on):
            trace = _record(spec)
        assert bool(_diverged(trace)) is on
        grads[on] = _grads(spec.model)
    assert all(torch.equal(grads[True][n], grads[False][n]) for n in grads[False])


@pytest.mark.parametrize("name", ["cache-in-replay", "taps-appended-twice", "dropout-without-rng-state",
                                  "batchnorm-updated-twice"])
def test_each_divergent_broken_run_gets_its_code(name: str) -> None:
    trace = record_broken(name)
    assert BROKEN[name].expected_code in {f.code for f in diagnose(trace)}


@pytest.mark.parametrize("name", BUILTIN_MODEL_NAMES)
def test_clean_builtin_runs_have_no_divergence(name: str) -> None:
    modes = [m for m in MODES if m != "none" and (m != "pipeline" or name == "pipeline")]
    for mode in modes:
        trace = run_scenario(build_builtin(name), mode)
        assert trace.of_kind("replay_started"), (name, mode)  # the checks had replays to look at
        assert not trace.of_kind("replay_diverged"), (name, mode, [e.details for e in trace.of_kind("replay_diverged")])
