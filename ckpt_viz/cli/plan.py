"""`ckpt-viz plan TRACE --budget 1.5GiB`: the trade-off curve, the recommendation and the code to paste.

Reads the plan profile in a trace (`ckpt_viz.plan.attach`). A trace of a built-in model without
one is profiled here (one step of the built-in, which loads torch); any other trace without a
profile gets a message that says how to record one. Planning itself imports no torch.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_plan_command", "plan_command", "plan_text"]

_API = "ckpt-viz plan"


def add_plan_command(sub: Any) -> None:
    """Register `plan` with the `ckpt-viz` subparsers."""
    from ckpt_viz.plan.schema import KINDS, SCHEDULES

    plan = sub.add_parser("plan", help="what to checkpoint to fit a memory budget (curve, choice, code)",
                          description="Predict the peak and recompute of checkpointing policies from a trace's plan "
                                      "profile (one step profiled without checkpointing), and pick the policy with "
                                      "the least recompute under --budget.")
    plan.add_argument("trace")
    plan.add_argument("--budget", help="memory budget for the whole step, e.g. 1.5GiB, 96MiB, 2e9 (default: none; "
                                       "print the curve only)")
    plan.add_argument("--kind", choices=KINDS, default=None,
                      help="checkpoint kind (default: the trace's mode when it is one, else nonreentrant)")
    plan.add_argument("--schedule", choices=SCHEDULES, default=None,
                      help="a pipeline profile's schedule to plan under (default: the trace's, else 1F1B); its "
                           "checkpoints are split reentrant, as the pipeline executor runs them")
    plan.add_argument("--microbatches", type=int, default=None,
                      help="a pipeline's micro-batch count (default: the profile's)")
    plan.add_argument("--blocks", help="comma-separated blocks the plan may checkpoint (default: all profiled)")
    plan.add_argument("--exclude", default="", help="comma-separated excluded regions (ckpt_viz runtime)")
    plan.add_argument("--keep-ops", default="", help="comma-separated ATen ops whose outputs checkpointed blocks "
                                                     "keep (torch's selective checkpointing), e.g. mm,addmm")
    plan.add_argument("--runtime", choices=("torch", "ckpt_viz"), default="torch",
                      help="whose checkpoint the printed code uses (default: torch)")
    plan.add_argument("--json", metavar="OUT", help="also write the curve and the choice as JSON (for a chart)")
    plan.set_defaults(run=plan_command)


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _profile(trace: Any, path: str) -> Any:
    from ckpt_viz.catalog import BUILTIN_MODEL_NAMES
    from ckpt_viz.errors import CkptVizError
    from ckpt_viz.plan.schema import profile_of

    meta = trace.meta or {}
    if "plan_profile" in meta:
        return profile_of(trace)
    model = meta.get("model")
    if meta.get("source", "builtin") == "builtin" and model in BUILTIN_MODEL_NAMES:
        print(f"{path} holds no plan profile; profiling the built-in model {model!r} (seed "
              f"{meta.get('seed', 0)}) once, without checkpointing.", file=sys.stderr)
        from ckpt_viz.plan.profile import profile_spec
        from ckpt_viz.run.zoo import build_builtin

        spec = build_builtin(model, seed=int(meta.get("seed", 0) or 0))
        microbatch = int(meta.get("microbatches") or 4) if meta.get("mode") == "pipeline" else None
        return profile_spec(spec, seed=int(meta.get("seed", 0) or 0), microbatch=microbatch)
    raise CkptVizError(f"{_API}: {path} holds no plan profile (meta['plan_profile']) and is not a built-in model's "
                       "trace.\nTip: record one step inside `with ckpt_viz.plan.profiling(model) as prof:` and "
                       "call ckpt_viz.plan.attach(rec.trace, prof.profile) before saving the trace.")


def plan_text(profile: Any, *, budget: int | None, kind: str, candidates: list[str] | None,
              exclude: list[str], keep_ops: list[str], runtime: str, schedule: str | None = None,
              microbatches: int | None = None) -> tuple[str, Any]:
    """The text `ckpt-viz plan` prints, and the Recommendation (None without a budget).

    `schedule` (a pipeline profile's) plans the pipeline step under it (`kind` is then split-reentrant).
    """
    from ckpt_viz.plan.model import predict
    from ckpt_viz.plan.schema import Policy
    from ckpt_viz.plan.search import block_ranges, curve, format_bytes, recommend
    from ckpt_viz.plan.snippets import code

    names = [b.name for b in profile.blocks]
    pipe = {"schedule": schedule, "microbatches": microbatches} if schedule is not None else {}
    base = predict(profile, Policy(frozenset(), kind, frozenset(exclude), **pipe))
    lines = [f"model {profile.label or '?'}: {len(names)} blocks ({block_ranges(names, names)}), profiled step "
             f"peak {format_bytes(base.peak)} ({base.where}), step {profile.step_time_ns / 1e6:.1f} ms"]
    if schedule is not None:
        lines[0] += (f"; a pipeline of {len(profile.stage_calls)} stages under {schedule} with "
                     f"{microbatches or profile.microbatches} micro-batches")
    if profile.suspended:
        lines.append(f"  (the profile suspended {len(profile.suspended)} checkpoint(s) of the loop for its step)")
    options = [(), tuple(keep_ops)] if keep_ops else [()]
    rec = None
    if budget is not None:
        rec = recommend(profile, budget, kind=kind, exclude=exclude, save_ops_options=options, candidates=candidates,
                        **pipe)
        points = rec.curve
        method = rec.method
    else:
        points = curve(profile, kind=kind, exclude=exclude, candidates=candidates, **pipe)
        method = ""
    step = profile.step_time_ns or 1
    chosen = rec.prediction.policy if rec is not None and rec.prediction is not None else None
    lines.append("")
    under = f" under {schedule}" if schedule is not None else ""
    lines.append(f"trade-off curve ({kind}{under}; least recompute for each peak{'; ' + method if method else ''}):")
    lines.append(f"  {'peak':>12}  {'recompute':>11}  {'step':>6}  blocks")
    for p in points:
        mark = "  <- chosen" if chosen is not None and p.blocks == chosen.blocks and p.save_ops == chosen.save_ops \
            else ""
        what = block_ranges(p.blocks, names) or "(none)"
        if p.save_ops:
            what += f"; keep {', '.join(sorted(p.save_ops))}"
        lines.append(f"  {format_bytes(p.peak):>12}  {p.recompute_ns / 1e6:>8.2f} ms  "
                     f"{100 * p.recompute_ns / step:>+5.0f}%  {what}{mark}")
    if rec is not None:
        lines.append("")
        lines.append(f"budget {format_bytes(budget)}: {rec.words}")
        if chosen is not None and chosen.blocks and chosen.kind in ("nonreentrant", "reentrant"):
            lines.append("")
            lines.append(f"code to paste ({runtime}'s checkpoint):")
            lines.append(code(chosen, runtime=runtime if not chosen.exclude else "ckpt_viz", comment=rec.words))
        elif chosen is not None and chosen.blocks:  # DX and DW are two calls of the training loop: no code to paste
            lines.append("")
            lines.append(f"blocks to checkpoint ({chosen.kind}; the training loop calls backward_input and "
                         f"backward_weight itself): {block_ranges(chosen.blocks, names)}")
    return "\n".join(lines), rec


def plan_command(args: argparse.Namespace) -> int:
    from ckpt_viz.plan.search import parse_bytes
    from ckpt_viz.trace import Trace

    trace = Trace.load(args.trace)
    profile = _profile(trace, args.trace)
    budget = parse_bytes(args.budget, _API) if args.budget is not None else None
    meta = trace.meta or {}
    mode = meta.get("mode")
    kind = args.kind or (mode if mode in ("nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant")
                         else "nonreentrant")
    schedule = _schedule(profile, args, meta)
    microbatches = None
    if schedule is not None:
        kind = "split-reentrant"  # the pipeline executor's checkpoints (NOTE [ Plan pipelines ] in plan/model.py)
        microbatches = args.microbatches or profile.microbatches or 1
    text, rec = plan_text(profile, budget=budget, kind=kind, candidates=_split(args.blocks) or None,
                          exclude=_split(args.exclude), keep_ops=_split(args.keep_ops), runtime=args.runtime,
                          schedule=schedule, microbatches=microbatches)
    print(text)
    if args.json:
        from ckpt_viz.plan.search import curve

        pipe = {"schedule": schedule, "microbatches": microbatches} if schedule is not None else {}
        points = rec.curve if rec is not None else curve(profile, kind=kind, exclude=_split(args.exclude),
                                                         candidates=_split(args.blocks) or None, **pipe)
        payload = {"budget": budget, "kind": kind, "schedule": schedule,
                   "curve": [{"peak": p.peak, "recompute_ns": p.recompute_ns, "blocks": sorted(p.blocks),
                              "save_ops": sorted(p.save_ops)} for p in points],
                   "chosen": None if rec is None or rec.prediction is None else
                   {"peak": rec.prediction.peak, "recompute_ns": rec.prediction.recompute_ns,
                    "blocks": sorted(rec.prediction.policy.blocks), "by_category": rec.prediction.by_category,
                    "words": rec.words}}
        _write(args.json, json.dumps(payload, indent=1))
    if rec is not None and rec.prediction is None:
        return 1
    return 0


def _schedule(profile: Any, args: argparse.Namespace, meta: dict) -> str | None:
    """The schedule to plan a pipeline profile under (--schedule, else the trace's, else 1F1B); None for a
    profile without stages (refusing --schedule and --microbatches there)."""
    from ckpt_viz.errors import CkptVizError
    from ckpt_viz.plan.schema import SCHEDULES

    if not profile.stage_calls:
        if args.schedule is not None or args.microbatches is not None:
            raise CkptVizError(f"{_API}: --schedule and --microbatches plan a pipeline, and {args.trace}'s plan "
                               "profile has no pipeline stages.\nTip: leave them out, or profile the pipeline "
                               "with ckpt_viz.plan.profile_spec(spec, microbatch=M).")
        return None
    if args.microbatches is not None and args.microbatches < 1:
        raise CkptVizError(f"{_API}: --microbatches must be at least 1, got {args.microbatches}.\nTip: e.g. "
                           "--microbatches 4.")
    if args.schedule is not None:
        return args.schedule
    return meta.get("schedule") if meta.get("schedule") in SCHEDULES else "1F1B"


def _write(path: str, text: str) -> None:
    """Write `text` to `path` atomically (a temporary file beside it, then a rename)."""
    import os
    import tempfile

    from ckpt_viz.errors import CkptVizError

    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".plan-", suffix=".json", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as err:
        raise CkptVizError(f"{_API}: cannot write {path} ({err.strerror}).\nTip: pick a writable folder for "
                           "--json.") from None
