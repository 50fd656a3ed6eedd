"""The plan from a user's own loop to the code to paste: profile, store, predict, verify, apply, print, chart."""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import ckpt_viz
import ckpt_viz.plan as plan
from ckpt_viz.errors import CkptVizError, TraceError
from ckpt_viz.plan.measure import measure_step
from ckpt_viz.plan.schema import Policy, check_profile, profile_of
from ckpt_viz.plan.search import block_ranges, format_bytes
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import MLPBlock, build_builtin
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parents[2]


class Net(nn.Module):
    """A user's model: residual MLP blocks and a head; `ckpt` runs the blocks under torch's checkpoint."""

    def __init__(self, ckpt: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MLPBlock(32, 128) for _ in range(4))
        self.head = nn.Linear(32, 8)
        self.ckpt = ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.ckpt else layer(x)
        return self.head(x)


def _net(ckpt: bool = False) -> tuple[Net, torch.Tensor]:
    torch.manual_seed(0)
    return Net(ckpt), torch.randn(512, 32)


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).pow(2).sum().backward()


def test_profile_of_a_users_loop_inside_record_is_stored_and_predicts_its_runs(tmp_path: Path) -> None:
    model, x = _net()
    seen: list[int] = []  # saved-tensor hooks below the profile's still see every tensor
    with ckpt_viz.record(model=model, tensors=(x,)) as rec, \
            torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(1) or t, lambda t: t):
        with plan.profiling(model, tensors=(x,)) as prof:
            _step(model, x)
    profile = prof.profile
    # 1. The hooks that were on top got every tensor autograd saved (the profile hands them on).
    saved = sum(1 for r in profile.role if r in (1, 2))
    assert len(seen) >= saved > 0
    # 2. Stored in the trace, checked on load, read back equal.
    plan.attach(rec.trace, profile)
    rec.trace.save(tmp_path / "t.json")
    again = profile_of(Trace.load(tmp_path / "t.json"))
    assert again == profile
    assert [b.name for b in again.blocks] == [f"layers.{i}" for i in range(4)]
    # 3. Predictions for the user's loop, checked by running it with the plan applied.
    for blocks in ({"layers.0", "layers.1", "layers.2", "layers.3"}, {"layers.1", "layers.2"}, set()):
        for runtime in ("ckpt_viz", "torch"):
            for p in model.parameters():
                p.grad = None
            v = plan.verify(Policy(frozenset(blocks)), again, model=model, step=lambda: _step(model, x),
                            tensors=(x,), runtime=runtime)
            assert abs(v.error) <= 0.05, (blocks, runtime, v.words)


def test_profiling_inside_a_memory_recording_is_refused_with_the_way_round() -> None:
    # record(memory=True) reads the allocator through torch's profiler, and so does the plan: one at a time
    model, x = _net()
    with ckpt_viz.record(memory=True, model=model) as rec:
        with pytest.raises(CkptVizError, match=r"one profiler at a time(.|\n)*Tip: .*ckpt_viz\.plan\.attach"):
            with plan.profiling(model, tensors=(x,)):
                _step(model, x)
    with plan.profiling(model, tensors=(x,)) as prof:  # after the recording, as the tip says
        _step(model, x)
    plan.attach(rec.trace, prof.profile)
    assert profile_of(rec.trace) == prof.profile


def test_the_loops_own_checkpoints_are_suspended_for_the_profiled_step() -> None:
    plain, x = _net(ckpt=False)
    ckpt, _ = _net(ckpt=True)
    with plan.profiling(plain, tensors=(x,)) as a:
        _step(plain, x)
    with plan.profiling(ckpt, tensors=(x,)) as b:
        _step(ckpt, x)
    assert a.profile.suspended == [] and len(b.profile.suspended) == 1
    # the same allocations, in the same order: the step ran as if it did not checkpoint
    assert b.profile.sizes == a.profile.sizes
    assert b.profile.role == a.profile.role
    # and the checkpoint is back after the block: the next step checkpoints again (the layers' saved tensors
    # are dropped in the forward)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        pass
    peak_ckpt = measure_step(lambda: _step(ckpt, x), model=ckpt, tensors=(x,)).peak
    peak_plain = measure_step(lambda: _step(plain, x), model=plain, tensors=(x,)).peak
    assert peak_ckpt < peak_plain


def test_apply_keeps_the_gradients_and_comes_off() -> None:
    model, x = _net()
    _step(model, x)
    want = [p.grad.clone() for p in model.parameters()]
    policy = Policy(frozenset({"layers.1", "layers.2"}), "reentrant")
    for runtime in ("ckpt_viz", "torch"):
        model.zero_grad(set_to_none=True)
        with plan.apply(model, policy, runtime=runtime):
            assert "forward" in vars(model.layers[1]) and "forward" not in vars(model.layers[0])
            _step(model, x)
        assert "forward" not in vars(model.layers[1])
        for got, expected in zip((p.grad for p in model.parameters()), want):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # torch's reentrant checkpoint would drop layers.0's weight gradients (its input x needs no grad): refused
    with plan.apply(model, Policy(frozenset({"layers.0"}), "reentrant"), runtime="torch"), \
            pytest.raises(CkptVizError, match=r"(?s)'layers.0' would leave its parameters without gradients.*Tip:"):
        _step(model, x)
    with plan.apply(model, Policy(frozenset({"layers.0"}), "reentrant"), runtime="ckpt_viz"):
        model.zero_grad(set_to_none=True)
        _step(model, x)  # ours routes them
        assert all(p.grad is not None for p in model.layers[0].parameters())
    with pytest.raises(CkptVizError, match=r"splits the backward into DX and DW"):
        plan.apply(model, Policy(frozenset({"layers.0"}), "split-reentrant"))
    with pytest.raises(CkptVizError, match=r"no submodule 'blocks.7'"):
        plan.apply(model, Policy(frozenset({"blocks.7"})))
    with pytest.raises(CkptVizError, match=r"excluded regions .* are ckpt_viz's"):
        plan.apply(model, Policy(frozenset({"layers.0"}), exclude=frozenset({"layers.0.fc2"})), runtime="torch")


def test_the_pasted_code_does_what_apply_does() -> None:
    model, x = _net()
    with plan.profiling(model, tensors=(x,)) as prof:
        _step(model, x)
    rec = plan.recommend(prof.profile, plan.predict(prof.profile, Policy(frozenset({"layers.1", "layers.2"}))).peak)
    assert rec.prediction is not None
    policy = rec.prediction.policy
    for runtime in ("torch", "ckpt_viz"):
        fresh, _ = _net()
        namespace = {"model": fresh}
        exec(plan.code(policy, runtime=runtime, comment=rec.words), namespace)  # what a user pastes
        assert {n for n, m in fresh.named_modules() if "forward" in vars(m)} == {b for b in policy.blocks}
        pasted = measure_step(lambda f=fresh: _step(f, x), model=fresh, tensors=(x,)).peak
        applied, _ = _net()
        with plan.apply(applied, policy, runtime=runtime):
            assert measure_step(lambda a=applied: _step(a, x), model=applied, tensors=(x,)).peak == pasted
        assert abs(pasted - rec.prediction.peak) <= 0.05 * pasted


def test_kept_ops_selective_checkpointing_within_5_percent() -> None:
    spec = build_builtin("mlp")
    profile = plan.profile_spec(spec, ops=True)
    names = frozenset(b.name for b in profile.blocks)
    assert {o.name for b in profile.blocks for o in b.ops} >= {"addmm", "tanh"}
    for ops in ({"addmm"}, {"tanh"}, {"addmm", "tanh"}):
        v = plan.verify(Policy(names, save_ops=frozenset(ops)), profile, spec=spec, runtime="torch")
        assert abs(v.error) <= 0.05, (ops, v.words)
    keep = plan.predict(profile, Policy(names, save_ops=frozenset({"addmm"})))
    plain = plan.predict(profile, Policy(names))
    assert keep.recompute_ns < plain.recompute_ns  # kept ops are not recomputed


def test_verify_reports_the_recordings_own_reading() -> None:
    spec = build_builtin("mlp")
    profile = plan.profile_spec(spec)
    v = plan.verify(Policy(frozenset({"blocks.0", "blocks.1"})), profile, spec=spec, recorded=True)
    assert abs(v.error) <= 0.05
    assert v.recorded_peak is not None and v.recorded_by_category is not None
    assert sum(v.recorded_by_category.values()) == v.recorded_peak
    assert v.recorded_peak <= v.measured_peak  # samples at events only can miss the peak, never exceed it
    assert v.measured_recompute_ns is not None and v.measured_recompute_ns > 0
    assert "predicted peak" in v.words and "record(memory=True) read" in v.words


def test_a_damaged_profile_is_refused_with_its_field(tmp_path: Path) -> None:
    spec = build_builtin("mlp")
    profile = plan.profile_spec(spec)
    trace = run_scenario(spec, "none")
    plan.attach(trace, profile)
    trace.save(tmp_path / "t.json")
    raw = json.loads((tmp_path / "t.json").read_text())
    raw["meta"]["plan_profile"]["sizes"] = "many"
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(TraceError, match=r"meta: field plan_profile.sizes"):
        Trace.load(tmp_path / "bad.json")
    broken = copy.deepcopy(profile)
    broken.free_of[0] = 10**9
    with pytest.raises(CkptVizError, match=r"free_of\[0\] is 1000000000.*\n.*Tip:"):
        check_profile(broken)
    with pytest.raises(CkptVizError, match=r"holds no plan profile"):
        profile_of(run_scenario(spec, "none"))


def _cli() -> object:
    """ckpt_viz/cli/plan.py by path: the rest of the CLI package is being ported (its __init__ may not import)."""
    try:
        from ckpt_viz.cli import plan as module
    except ImportError:
        found = importlib.util.spec_from_file_location("ckpt_viz_cli_plan", ROOT / "ckpt_viz" / "cli" / "plan.py")
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
    return module


def _run_cli(*argv: str) -> int:
    module = _cli()
    parser = argparse.ArgumentParser()
    module.add_plan_command(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    return args.run(args)


def test_cli_prints_the_curve_the_choice_and_the_code(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = build_builtin("mlp")
    trace = run_scenario(spec, "nonreentrant")
    plan.attach(trace, plan.profile_spec(spec))
    trace.save(tmp_path / "t.json")
    assert _run_cli(str(tmp_path / "t.json"), "--budget", "1.2MiB", "--json", str(tmp_path / "c.json")) == 0
    out = capsys.readouterr().out
    assert "trade-off curve (nonreentrant" in out and "<- chosen" in out
    assert "from torch.utils.checkpoint import checkpoint" in out and "CHECKPOINT = [" in out
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["chosen"]["peak"] <= 1.2 * 2**20 and data["curve"][0]["peak"] < data["curve"][-1]["peak"]
    assert len([line for line in out.splitlines() if " ms " in line]) == len(data["curve"])
    # 2. A budget nothing meets: exit status 1 and the lowest reachable peak.
    assert _run_cli(str(tmp_path / "t.json"), "--budget", "10KiB") == 1
    assert "lowest any policy reaches" in capsys.readouterr().out


def test_cli_profiles_a_builtin_trace_and_refuses_others(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_scenario(build_builtin("dropout"), "reentrant").save(tmp_path / "b.json")
    assert _run_cli(str(tmp_path / "b.json")) == 0
    captured = capsys.readouterr()
    assert "profiling the built-in model 'dropout'" in captured.err and "trade-off curve (reentrant" in captured.out
    user = Trace()
    user.meta["model"] = "mine"
    user.meta["source"] = "user"
    user.save(tmp_path / "u.json")
    with pytest.raises(CkptVizError, match=r"(?s)holds no plan profile.*Tip: record one step inside"):
        _run_cli(str(tmp_path / "u.json"))


def test_cli_plans_a_pipeline_under_its_schedule(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = build_builtin("pipeline")
    trace = run_scenario(spec, "pipeline", microbatches=4, schedule="GPipe")
    profile = plan.profile_spec(build_builtin("pipeline"), microbatch=4, costs=False)
    plan.attach(trace, profile)
    trace.save(tmp_path / "p.json")
    budget = "1MiB"
    for argv, schedule in (((), "GPipe"), (("--schedule", "ZB-H1"), "ZB-H1")):  # the trace's schedule, or the asked
        assert _run_cli(str(tmp_path / "p.json"), "--budget", budget, "--json", str(tmp_path / "c.json"), *argv) == 0
        out = capsys.readouterr().out
        rec = plan.recommend(profile, plan.parse_bytes(budget), schedule=schedule, microbatches=4)
        assert f"a pipeline of 2 stages under {schedule} with 4 micro-batches" in out
        assert f"trade-off curve (split-reentrant under {schedule};" in out
        assert f"budget 1.0 MiB: {rec.words}" in out
        data = json.loads((tmp_path / "c.json").read_text())
        assert data["schedule"] == schedule and data["kind"] == "split-reentrant"
        assert [(p["peak"], p["recompute_ns"]) for p in data["curve"]] == [(p.peak, p.recompute_ns) for p in rec.curve]
    # a profile without stages has no schedule to plan under
    mlp = build_builtin("mlp")
    other = run_scenario(mlp, "nonreentrant")
    plan.attach(other, plan.profile_spec(mlp, costs=False))
    other.save(tmp_path / "m.json")
    with pytest.raises(CkptVizError, match=r"(?s)ckpt-viz plan: --schedule and --microbatches plan a pipeline.*Tip:"):
        _run_cli(str(tmp_path / "m.json"), "--schedule", "1F1B")


class _Transient(nn.Module):
    """Ends the forward with a large buffer that nothing saves: the step's peak is there, not in its backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.zeros(1 << 20)  # 4 MiB, freed when the forward returns
        return x + scratch[0]


def test_cli_names_the_blocks_of_a_split_plan_without_code(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # DX and DW are two calls the training loop makes itself: the plan names the blocks; no code to paste
    from ckpt_viz.run.zoo import ModelSpec

    torch.manual_seed(0)
    model = nn.Sequential(*(MLPBlock(32, 128) for _ in range(4)), _Transient())
    spec = ModelSpec("transient", model, (torch.randn(512, 32),), checkpoint=tuple(str(i) for i in range(4)))
    profile = plan.profile_spec(spec, costs=False)
    trace = Trace()
    plan.attach(trace, profile)
    trace.save(tmp_path / "s.json")
    whole = plan.recommend(profile, 1 << 62, kind="split-reentrant")
    budget = (whole.floor + whole.baseline.peak) // 2  # below no checkpointing, above the lowest reachable peak
    assert _run_cli(str(tmp_path / "s.json"), "--kind", "split-reentrant", "--budget", str(budget)) == 0
    out = capsys.readouterr().out
    rec = plan.recommend(profile, budget, kind="split-reentrant")
    assert rec.prediction is not None and rec.prediction.policy.blocks
    assert "trade-off curve (split-reentrant;" in out and f"budget {format_bytes(budget)}: {rec.words}" in out
    assert "blocks to checkpoint (split-reentrant; the training loop calls backward_input and backward_weight " \
           f"itself): {block_ranges(rec.prediction.policy.blocks, [b.name for b in profile.blocks])}" in out
    assert "import functools" not in out


def test_curve_chart_marks_the_choice() -> None:
    from ckpt_viz.render.plan import curve_chart

    spec = build_builtin("mlp")
    profile = plan.profile_spec(spec)
    rec = plan.recommend(profile, plan.parse_bytes("1.2MiB"))
    chart = curve_chart(rec.curve, chosen=rec.prediction, budget=rec.budget, names=[b.name for b in profile.blocks])
    spec_dict = chart.to_dict()
    assert len(spec_dict["layer"]) == 4  # line, points, the chosen point, the budget rule
    rows = spec_dict["layer"][0]["data"]["values"]
    assert len(rows) == len(rec.curve) and sum(r["chosen"] for r in rows) == 1
    assert any(r["blocks"] == "(none)" for r in rows)


def test_planning_imports_neither_torch_nor_scipy() -> None:
    code = ("import sys, ckpt_viz.plan, ckpt_viz.plan.schema, ckpt_viz.plan.model, ckpt_viz.plan.search, "
            "ckpt_viz.plan.snippets, ckpt_viz.trace; "
            "assert 'torch' not in sys.modules and 'scipy' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
