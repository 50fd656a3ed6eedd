"""Check a plan by running it: the prediction next to the measurement.

Owns `verify` and `Verification`. Imports torch. The measured peak is the allocator's (NOTE
[ Measured peak ] in ckpt_viz/plan/measure.py); with `recorded=True` the same run is also
recorded with `ckpt_viz.record(memory=True)` and its own reading (peak by category) is
reported beside it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_viz.errors import CkptVizError
from ckpt_viz.plan.measure import measure_spec, measure_step
from ckpt_viz.plan.model import predict
from ckpt_viz.plan.schema import PlanProfile, Policy, Prediction
from ckpt_viz.plan.search import format_bytes
from ckpt_viz.plan.wrap import apply, policy_of

__all__ = ["Verification", "replay_ns", "verify"]

_API = "ckpt_viz.plan.verify"


@dataclass(frozen=True)
class Verification:
    """A plan's prediction beside its run.

    Attributes:
        prediction: what the plan predicted.
        measured_peak: the run's peak as the allocator saw it (bytes, existing ones included).
        error: (predicted - measured) / measured.
        recorded_peak: the peak of `record(memory=True)`'s samples of the same run (when asked).
        recorded_by_category: those bytes by category.
        measured_recompute_ns: time spent in replays (ckpt_viz's runtime: from the trace's
            replay_started / replay_finished events), or None.
        trace: the run's trace (ckpt_viz's runtime and scenario runs).
    """

    prediction: Prediction
    measured_peak: int
    error: float
    recorded_peak: int | None = None
    recorded_by_category: dict[str, int] | None = None
    measured_recompute_ns: int | None = None
    trace: Any = None

    @property
    def words(self) -> str:
        """The comparison in one line for people."""
        p = self.prediction
        text = (f"predicted peak {format_bytes(p.peak)}, measured {format_bytes(self.measured_peak)} "
                f"({100 * self.error:+.1f} %)")
        if self.recorded_peak is not None:
            text += f"; record(memory=True) read {format_bytes(self.recorded_peak)}"
        if self.measured_recompute_ns is not None and p.recompute_ns:
            text += (f"; recompute predicted {p.recompute_ns / 1e6:.2f} ms, measured "
                     f"{self.measured_recompute_ns / 1e6:.2f} ms")
        return text


def replay_ns(trace: Any) -> int:
    """Time spent replaying checkpoints in `trace`: each replay_started to its handle's next replay_finished."""
    started: dict[int, int] = {}
    total = 0
    for event in trace.events:
        if event.kind == "replay_started":
            started[event.handle_id] = event.t_ns
        elif event.kind == "replay_finished" and event.handle_id in started:
            total += event.t_ns - started.pop(event.handle_id)
    return total


def verify(plan: Any, profile: PlanProfile | None = None, *, spec: Any = None, model: Any = None,
           step: Callable[[], Any] | None = None, tensors: Any = (), runtime: str = "ckpt_viz",
           recorded: bool = False, seed: int = 0) -> Verification:
    """Run `plan` and report its prediction next to the measurement.

    Args:
        plan: a Policy, or a Prediction / Recommendation (its policy).
        profile: the profile to predict from (needed unless `plan` is a Prediction or Recommendation).
        spec: a `ModelSpec` to run (built-ins, model files, HF models): its blocks are checkpointed
            as the plan says and one step runs through `run_scenario`.
        model, step: or your own loop: the plan is applied to `model` (`ckpt_viz.plan.apply`)
            while `step()` runs one training step, then taken off.
        tensors: your step's inputs (counted as existing before the step).
        runtime: "ckpt_viz" or "torch" (whose checkpoint the blocks use).
        recorded: also record the run with `ckpt_viz.record(memory=True)` and report its reading.
        seed: the scenario's seed.
    """
    policy = policy_of(plan, _API)
    if profile is None:
        prediction = plan if hasattr(plan, "peak") else getattr(plan, "prediction", None)
        if prediction is None:
            raise CkptVizError(f"{_API}: a Policy needs the profile to predict from.\nTip: verify(policy, "
                               "profile, spec=...), or pass the Recommendation / Prediction itself.")
    else:
        prediction = predict(profile, policy)
    if (spec is None) == (step is None):
        raise CkptVizError(f"{_API}: pass either spec= (a ModelSpec to run) or model= and step= (your loop).\n"
                           "Tip: verify(plan, profile, spec=ckpt_viz.run.zoo.build_builtin('mlp')).")
    if spec is not None:
        return _verify_spec(prediction, policy, spec, runtime, recorded, seed)
    if model is None:
        raise CkptVizError(f"{_API}: step= needs model= (the module the plan checkpoints).\nTip: verify(plan, "
                           "profile, model=model, step=train_step).")
    with apply(model, policy, runtime=runtime):
        measured = measure_step(step, model=model, tensors=tensors, api=_API)
    return Verification(prediction=prediction, measured_peak=measured.peak,
                        error=(prediction.peak - measured.peak) / measured.peak)


def _verify_spec(prediction: Prediction, policy: Policy, spec: Any, runtime: str, recorded: bool,
                 seed: int) -> Verification:
    from ckpt_viz.run.scenarios import run_scenario

    own = runtime == "ckpt_viz" and not policy.save_ops  # ckpt_viz's scenarios checkpoint the blocks themselves
    if not own and policy.kind.startswith("split"):
        raise CkptVizError(f"{_API}: kind {policy.kind!r} runs on ckpt_viz's runtime only, without kept ops.\n"
                           "Tip: verify split kinds with runtime='ckpt_viz' and no save_ops.")
    mode = policy.kind if own and policy.blocks else "none"
    blocks = tuple(sorted({b.split("#", 1)[0] for b in policy.blocks})) if own else ()
    run_spec = dataclasses.replace(spec, checkpoint=blocks)
    wrap = (apply(spec.model, Policy(frozenset(), exclude=policy.exclude)) if own and policy.exclude
            else apply(spec.model, policy, runtime=runtime) if not own else None)
    try:
        measured = measure_spec(run_spec, mode, seed=seed)
        recorded_peak = by_category = None
        if recorded:
            from ckpt_viz.analysis.memory import memory

            for p in spec.model.parameters():
                p.grad = None
            trace = run_scenario(run_spec, mode, seed=seed, memory=True)
            facts = memory(trace)
            recorded_peak = facts.peak.total if facts.peak is not None else None
            by_category = dict(facts.peak.by_category) if facts.peak is not None else None
            for p in spec.model.parameters():
                p.grad = None
    finally:
        if wrap is not None:
            wrap.remove()
    trace = measured.trace
    return Verification(prediction=prediction, measured_peak=measured.peak,
                        error=(prediction.peak - measured.peak) / measured.peak, recorded_peak=recorded_peak,
                        recorded_by_category=by_category,
                        measured_recompute_ns=replay_ns(trace) if own and trace is not None else None, trace=trace)
