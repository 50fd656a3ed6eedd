"""Plan checkpointing: what would my peak be, and what should I checkpoint to fit a memory budget?

One profiled step (`profiling`, `profile_spec`) is enough to predict any policy's peak by
category and its recompute (`predict`), to find the least recompute under a budget with the
whole trade-off curve (`recommend`, `curve`), to check a plan by running it (`verify`), to put
it on a model (`apply`) and to write the code to paste (`code`). `import ckpt_viz.plan` imports
neither torch nor scipy: the names that run models load torch on first use (`_LAZY`).

    with ckpt_viz.plan.profiling(model, tensors=(x,)) as prof:
        loss_fn(model(x)).backward()
    rec = ckpt_viz.plan.recommend(prof.profile, budget=ckpt_viz.plan.parse_bytes("1.5GiB"))
    print(rec.words)
    print(ckpt_viz.plan.code(rec.prediction.policy))
    with ckpt_viz.plan.wrap(model, rec):
        train()
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckpt_viz.plan.check import Verification, verify
    from ckpt_viz.plan.measure import Measured, measure_spec, measure_step
    from ckpt_viz.plan.model import predict
    from ckpt_viz.plan.profile import attach, default_blocks, profile_spec, profiling
    from ckpt_viz.plan.schema import CurvePoint, PlanProfile, Policy, Prediction, Recommendation, profile_of
    from ckpt_viz.plan.search import curve, describe, parse_bytes, recommend
    from ckpt_viz.plan.snippets import code
    from ckpt_viz.plan.wrap import Applied, apply

_LAZY = {
    "Applied": "ckpt_viz.plan.wrap",
    "apply": "ckpt_viz.plan.wrap",
    "Measured": "ckpt_viz.plan.measure",
    "measure_spec": "ckpt_viz.plan.measure",
    "measure_step": "ckpt_viz.plan.measure",
    "predict": "ckpt_viz.plan.model",
    "attach": "ckpt_viz.plan.profile",
    "default_blocks": "ckpt_viz.plan.profile",
    "profile_spec": "ckpt_viz.plan.profile",
    "profiling": "ckpt_viz.plan.profile",
    "CurvePoint": "ckpt_viz.plan.schema",
    "PlanProfile": "ckpt_viz.plan.schema",
    "Policy": "ckpt_viz.plan.schema",
    "Prediction": "ckpt_viz.plan.schema",
    "Recommendation": "ckpt_viz.plan.schema",
    "profile_of": "ckpt_viz.plan.schema",
    "curve": "ckpt_viz.plan.search",
    "describe": "ckpt_viz.plan.search",
    "parse_bytes": "ckpt_viz.plan.search",
    "recommend": "ckpt_viz.plan.search",
    "code": "ckpt_viz.plan.snippets",
    "Verification": "ckpt_viz.plan.check",
    "verify": "ckpt_viz.plan.check",
}

__all__ = [
    "Applied",
    "CurvePoint",
    "Measured",
    "PlanProfile",
    "Policy",
    "Prediction",
    "Recommendation",
    "Verification",
    "apply",
    "attach",
    "code",
    "curve",
    "default_blocks",
    "describe",
    "measure_spec",
    "measure_step",
    "parse_bytes",
    "predict",
    "profile_of",
    "profile_spec",
    "profiling",
    "recommend",
    "verify",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
