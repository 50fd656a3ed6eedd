"""The recompute-time model: replay costs measured on a calibration model, and how a prediction uses them.

No timing is asserted here (speed is measured in benchmarks/bench_plan.py): these tests check what the
calibration counts, that its fit is the least-squares one, that it stays out of the caller's recording, and
that `predict` adds exactly the costs the profile holds (ckpt_viz/plan/calibrate.py NOTE [ Replay cost ]).
"""
from __future__ import annotations

import msgspec
import numpy as np
import pytest

import ckpt_viz
from ckpt_viz.plan.calibrate import CHAINS, calibration_spec, fit_costs, measure_costs, saved_tensors
from ckpt_viz.plan.model import forget_timelines, predict, timeline
from ckpt_viz.plan.profile import profile_spec
from ckpt_viz.plan.schema import KINDS, PlanProfile, Policy, ReplayCost
from ckpt_viz.run.zoo import build_builtin


def test_the_calibration_counts_saved_tensors_as_the_profile_does() -> None:
    profile = profile_spec(calibration_spec(), costs=False, replays=False)
    assert [b.saved_count for b in profile.blocks] == [saved_tensors(k, r)[0] for k, r in CHAINS]
    regions = {r.block: r.saved_count for r in profile.regions}
    assert regions == {i: saved_tensors(k, r)[1] for i, (k, r) in enumerate(CHAINS) if r}
    assert profile.replay_costs == {}


def test_fit_is_least_squares_with_no_negative_term() -> None:
    tensors, regions = [2, 5, 13, 33, 5, 13], [0, 0, 0, 0, 1, 1]
    exact = [1000 + 70 * t + 400 * r for t, r in zip(tensors, regions)]
    assert fit_costs(tensors, regions, exact) == ReplayCost(fixed_ns=1000, per_tensor_ns=70, per_region_ns=400)
    # a term the data makes negative is dropped and the others refitted: here the regions cost nothing
    noisy = [1000 + 70 * t - 300 * r for t, r in zip(tensors, regions)]
    fit = fit_costs(tensors, regions, noisy)
    assert fit.per_region_ns == 0
    A = np.column_stack([np.ones(6), tensors])
    fixed, per = np.linalg.lstsq(A, np.array(noisy, float), rcond=None)[0]
    assert (fit.fixed_ns, fit.per_tensor_ns) == (round(fixed), round(per))


def test_calibration_inside_a_recording_leaves_it_as_it_was() -> None:
    model = build_builtin("mlp").model
    with ckpt_viz.record(memory=True, model=model) as rec:
        costs = measure_costs(runs=1, warmup=0)
    assert set(costs) == set(KINDS)
    kinds = {e.kind for e in rec.trace.events}  # the calibration's runs were on a thread of their own
    assert not kinds & {"handle_created", "replay_started", "released"}, kinds


@pytest.mark.parametrize("kind", KINDS)
def test_predicted_recompute_is_forward_plus_the_profiles_costs(kind: str) -> None:
    # The excluded built-in: each block has an excluded LayerNorm the replay takes from its cache.
    profile = profile_spec(build_builtin("excluded"), costs=False, replays=False)  # the formula alone
    bare = timeline(profile, kind).recompute_ns
    early = kind in ("nonreentrant", "split-nonreentrant")
    for b, block in enumerate(profile.blocks):  # no costs: the forward part alone, less the excluded region
        (region,) = [r for r in profile.regions if r.block == b]
        forward = block.time_to_last_pack_ns if early else block.time_ns
        assert bare[b] == max(0, forward - region.time_ns)
    profile.replay_costs = {k: ReplayCost(fixed_ns=1000 * (i + 1), per_tensor_ns=10, per_region_ns=300)
                            for i, k in enumerate(KINDS)}
    cost = profile.replay_costs[kind]
    forget_timelines()  # timelines are cached per profile object, which changed
    costed = timeline(profile, kind).recompute_ns
    for b, block in enumerate(profile.blocks):
        (region,) = [r for r in profile.regions if r.block == b]
        tensors = block.saved_count - region.saved_count
        assert tensors > 0 and region.saved_count > 0
        assert costed[b] == bare[b] + cost.fixed_ns + cost.per_tensor_ns * tensors + cost.per_region_ns
    names = frozenset(b.name for b in profile.blocks[:2])
    assert predict(profile, Policy(names, kind)).recompute_ns == costed[0] + costed[1]


def test_a_measured_replay_is_the_prediction_and_a_policy_moves_it_by_the_formula() -> None:
    """ckpt_viz/plan/model.py NOTE [ Plan timeline ], rule 8: where the profile measured a block's replay in the
    model itself, that is the block's recompute; ops the policy keeps move it by what the formula says they save."""
    profile = profile_spec(build_builtin("transformer"), ops=True)
    assert all(set(b.replay_ns) == set(KINDS) and min(b.replay_ns.values()) > 0 for b in profile.blocks)
    formula = msgspec.convert(msgspec.to_builtins(profile), PlanProfile)  # the same profile, replays not measured
    for block in formula.blocks:
        block.replay_ns = {}
    kept = frozenset({max(profile.blocks[0].ops, key=lambda o: o.time_ns).name})  # the slowest op: kept, not rerun
    names = frozenset(b.name for b in profile.blocks)
    for kind in KINDS:
        measured = [b.replay_ns[kind] for b in profile.blocks]
        assert list(timeline(profile, kind).recompute_ns) == measured
        assert predict(profile, Policy(names, kind)).recompute_ns == sum(measured)
        before, after = timeline(formula, kind).recompute_ns, timeline(formula, kind, save_ops=kept).recompute_ns
        assert after[0] < before[0]  # the formula takes the kept op's time off the replay
        moved = timeline(profile, kind, save_ops=kept).recompute_ns
        assert list(moved) == [max(0, m + a - b) for m, a, b in zip(measured, after, before)]
