"""Predicted peaks against the allocator's, for every built-in model in every mode and for HF GPT-2 and Llama.

Each model is profiled once (one step, no checkpointing); then random block subsets are run in
each mode and the run's peak (the allocator's record: ckpt_viz/plan/measure.py NOTE [ Measured
peak ]) is compared with the prediction. Target: within 5 %.
"""
from __future__ import annotations

import itertools
import random

import pytest

from ckpt_viz.catalog import BUILTIN_MODEL_NAMES
from ckpt_viz.plan.measure import measure_spec
from ckpt_viz.plan.model import predict
from ckpt_viz.plan.profile import profile_spec
from ckpt_viz.plan.schema import KINDS, SCHEDULES, Policy
from ckpt_viz.run.zoo import build_builtin

TOLERANCE = 0.05
SUBSETS = 10


def subsets(names: list[str], count: int = SUBSETS, seed: int = 0) -> list[tuple[str, ...]]:
    """Every subset when there are at most `count`, else `count` distinct random ones (all blocks among them)."""
    if 2 ** len(names) <= count:
        return [tuple(n for n, bit in zip(names, bits) if bit) for bits in itertools.product((0, 1), repeat=len(names))]
    rnd = random.Random(seed)
    chosen = {tuple(names)}
    while len(chosen) < count:
        chosen.add(tuple(n for n in names if rnd.random() < 0.5))
    return sorted(chosen)


_PROFILES: dict[str, object] = {}


def _builtin(name: str) -> tuple[object, object]:
    spec = build_builtin(name)
    if name not in _PROFILES:
        _PROFILES[name] = profile_spec(spec, replays=False)  # peaks only: no replay timing needed
    return spec, _PROFILES[name]


def _check(spec: object, profile: object, mode: str, blocks: tuple[str, ...], **run: object) -> tuple[float, str]:
    policy = Policy(frozenset(blocks), mode if mode in KINDS else "split-reentrant",
                    schedule=run.get("schedule"), microbatches=run.get("microbatches"))
    predicted = predict(profile, policy)
    measured = measure_spec(spec, mode, blocks, **run)  # no blocks: the mode's own step (split: DX then DW)
    return (predicted.peak - measured.peak) / measured.peak, f"{blocks}: predicted {predicted.peak}, measured " \
                                                              f"{measured.peak} ({predicted.where})"


@pytest.mark.parametrize("name", BUILTIN_MODEL_NAMES)
def test_no_checkpointing_is_the_profiled_step_to_the_byte(name: str) -> None:
    # 1. The prediction for no checkpointing replays the profile: it must equal a plain run's peak exactly.
    spec, profile = _builtin(name)
    assert predict(profile, Policy()).peak == measure_spec(spec, "none").peak


@pytest.mark.parametrize("mode", KINDS)
def test_mlp_every_kind_every_subset_within_5_percent(mode: str) -> None:
    spec, profile = _builtin("mlp")
    names = [b.name for b in profile.blocks]
    errors = [_check(spec, profile, mode, blocks) for blocks in subsets(names, 16)]
    bad = [why for error, why in errors if abs(error) > TOLERANCE]
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in BUILTIN_MODEL_NAMES if n != "mlp"])
@pytest.mark.parametrize("mode", KINDS)
def test_builtin_every_mode_within_5_percent(name: str, mode: str) -> None:
    spec, profile = _builtin(name)
    names = [b.name for b in profile.blocks]
    errors = [_check(spec, profile, mode, blocks) for blocks in subsets(names)]
    bad = [why for error, why in errors if abs(error) > TOLERANCE]
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_schedules_within_5_percent(schedule: str) -> None:
    spec = build_builtin("pipeline")
    profile = profile_spec(spec, microbatch=4, replays=False)
    names = [b.name for b in profile.blocks]
    errors = [_check(spec, profile, "pipeline", blocks, schedule=schedule, microbatches=4)
              for blocks in subsets(names)]
    bad = [why for error, why in errors if abs(error) > TOLERANCE]
    assert not bad, bad
    # 2. Each stage's peak is reported, and none is above the process's.
    prediction = predict(profile, Policy(frozenset(names), "split-reentrant", schedule=schedule, microbatches=4))
    assert [s.stage for s in prediction.stages] == [0, 1]
    assert all(0 < s.peak <= prediction.peak for s in prediction.stages)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("mode", KINDS)
def test_hf_models_within_5_percent(family: str, mode: str) -> None:
    pytest.importorskip("transformers")
    from plan_models import hf_spec

    spec = hf_spec(family, layers=6)
    key = f"hf-{family}"
    if key not in _PROFILES:
        _PROFILES[key] = profile_spec(spec, replays=False)
    profile = _PROFILES[key]
    names = [b.name for b in profile.blocks]
    assert names == list(spec.checkpoint)
    errors = [_check(spec, profile, mode, blocks) for blocks in subsets(names)]
    bad = [why for error, why in errors if abs(error) > TOLERANCE]
    assert not bad, bad


def test_excluded_regions_of_the_model_are_always_in_the_policy() -> None:
    # 3. The "excluded" built-in wraps each block's LayerNorm: the profile marks them fixed, and the
    #    prediction counts them whether the policy names them or not.
    _, profile = _builtin("excluded")
    assert [r.name for r in profile.regions] == [f"blocks.{i}.norm" for i in range(3)]
    assert all(r.fixed for r in profile.regions)
    blocks = frozenset(b.name for b in profile.blocks)
    assert predict(profile, Policy(blocks)).peak == predict(
        profile, Policy(blocks, exclude=frozenset(r.name for r in profile.regions))).peak
