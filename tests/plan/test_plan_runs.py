"""A run asked for with `plan=True` comes with its plan profile: a built-in's profiled here, a model file's in its
sandboxed child; either is the profile `profile_spec` makes of the same model (the Plan page's button uses this)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_viz.plan.model import predict
from ckpt_viz.plan.profile import profile_spec
from ckpt_viz.plan.schema import KINDS, Policy, profile_of
from ckpt_viz.run.obtain import RunRequest, obtain_trace
from ckpt_viz.run.zoo import build_builtin
from ckpt_viz.usermodel.load import load_model
from ckpt_viz.usermodel.sandbox import SandboxError, record_in_subprocess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = f"{ROOT / 'examples' / 'user_model.py'}:make_model"


def _same_step(got: object, want: object) -> None:
    """The same allocations, roles and blocks, so the same peak for every policy (times differ run to run)."""
    assert got.sizes == want.sizes and got.role == want.role and got.owner == want.owner
    assert [(b.name, b.f0, b.f1, b.w0, b.w1) for b in got.blocks] == [(b.name, b.f0, b.f1, b.w0, b.w1)
                                                                     for b in want.blocks]
    names = frozenset(b.name for b in want.blocks)
    for kind in KINDS:
        assert predict(got, Policy(names, kind)).peak == predict(want, Policy(names, kind)).peak


def test_a_builtin_run_asked_with_plan_carries_its_profile() -> None:
    trace = obtain_trace(RunRequest("builtin", "mlp", mode="reentrant", plan=True))
    assert trace.meta["mode"] == "reentrant" and trace.count("replay_started") > 0  # the run itself, as asked
    profile = profile_of(trace)
    assert profile.replay_costs and set(profile.replay_costs) == set(KINDS)
    _same_step(profile, profile_spec(build_builtin("mlp"), costs=False))
    assert "plan_profile" not in obtain_trace(RunRequest("builtin", "mlp", mode="reentrant")).meta


@pytest.mark.slow
def test_a_model_file_is_profiled_in_its_sandbox() -> None:
    trace = record_in_subprocess(EXAMPLE, "nonreentrant", extra={"seed": 0, "plan_profile": True})
    assert trace.meta["model"] == EXAMPLE and "sandbox" in trace.meta
    _same_step(profile_of(trace), profile_spec(load_model(EXAMPLE), costs=False))
    with pytest.raises(SandboxError, match=r"(?s)unknown extra key\(s\) 'plan'.*'plan_profile'.*Tip:"):
        record_in_subprocess(EXAMPLE, "nonreentrant", extra={"plan": True})
