"""Plan: what to checkpoint to fit a memory budget, from the run's plan profile (`ckpt_viz.plan`, issue 32).

The profile is the trace's (`meta["plan_profile"]`), or made on request by the run paths every page uses
(`RunConfig.plan`: a built-in here, a model file in its sandbox); the curve, the choice, its words and the code
are `ckpt_viz.plan`'s. Nothing here computes a figure.
"""
import math
from dataclasses import replace

import streamlit as st

from ckpt_viz.catalog import BUILTIN_MODEL_NAMES
from ckpt_viz.errors import CkptVizError
from ckpt_viz.plan.schema import KINDS, SCHEDULES, profile_of
from ckpt_viz.plan.search import block_ranges, format_bytes, parse_bytes, recommend
from ckpt_viz.plan.snippets import code
from ckpt_viz.render.plan import curve_chart, curve_rows
from ui.runs import RunConfig, current, obtain_run, show_error
from ui.show import show_chart
from ui.text import md

ASKED = "plan_profiled"  # session key: the configs whose profile the user asked for


def _profile_run(run):
    """The run to profile for this trace, when one can be made: the same run with a profile, or the built-in a
    saved trace names; None otherwise."""
    config, meta = run.config, run.trace.meta or {}
    if config.runs_model:
        return replace(config, plan=True)
    model = meta.get("model")
    if config.source == "trace" and meta.get("source", "builtin") == "builtin" and model in BUILTIN_MODEL_NAMES:
        mode = meta.get("mode") if meta.get("mode") in (*KINDS, "pipeline", "none") else "nonreentrant"
        return RunConfig("builtin", model, mode=mode, schedule=meta.get("schedule") or "1F1B",
                         microbatches=int(meta.get("microbatches") or 4), plan=True)
    return None


def _rounded_up(n: float) -> str:
    """`n` bytes as a budget to type, rounded up to a tenth of its unit (so it is never below `n`)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{math.ceil(n / size * 10) / 10:.1f} {unit}"
    return f"{math.ceil(n)} B"


run = current()
st.title("Plan")
st.caption("What would the step's peak be, and what should be checkpointed to fit a memory budget? Predicted from "
           "one profiled step without checkpointing (ckpt_viz.plan): the peak from the allocator's record of that "
           "step; the recompute from each block's replays, timed in recorded runs of the model in each kind, or, "
           "in a profile of your own loop, from its blocks' forward times and the replay costs measured on the "
           "machine that profiled it.")

if "plan_profile" in (run.trace.meta or {}):
    source, memo = run.trace, run.memo
else:
    target = _profile_run(run)
    asked = st.session_state.setdefault(ASKED, set())
    if target is None:
        st.info("This trace holds no plan profile, and it is not a run this app can profile (a built-in model or a "
                "model file). Record one with your own training step:")
        st.code("with ckpt_viz.record(model=model) as rec:\n"
                "    with ckpt_viz.plan.profiling(model, tensors=(x,)) as prof:\n"
                "        loss_fn(model(x)).backward()\n"
                "ckpt_viz.plan.attach(rec.trace, prof.profile)\n"
                "rec.trace.save('trace.json.gz')\n\n"
                "# or plan from the command line:  ckpt-viz plan trace.json.gz --budget 1.5GiB", language="python")
        st.stop()
    if target not in asked:
        what = "the model file in its sandbox" if target.source == "user" else f"the built-in model {target.target}"
        st.info(md(f"This run holds no plan profile. Profiling runs {what} for a few steps without checkpointing "
                   "(one of them under the allocator's record), then with every block checkpointed in each kind "
                   "to time its replays, and measures this machine's replay costs once."))
        if not st.button("Profile the model", key="plan_profile_button", type="primary"):
            st.stop()
        asked.add(target)
    loaded = obtain_run(target)
    if loaded.error is not None:
        show_error(loaded.error, target)
        st.stop()
    source, memo = loaded.run.trace, loaded.run.memo
try:
    if "plan_profile" not in memo:  # read and checked once per trace (its timelines are cached per profile object)
        memo["plan_profile"] = profile_of(source)
    profile = memo["plan_profile"]
except CkptVizError as err:
    st.error(md(str(err)))
    st.stop()

names = [b.name for b in profile.blocks]
pipeline = bool(profile.stage_calls)
st.markdown(md(f"Profile of {profile.label or 'the model'}: {len(names)} blocks ({block_ranges(names, names)}), "
               f"step {profile.step_time_ns / 1e6:.1f} ms"
               + (f", one of {profile.microbatches} micro-batches through {len(profile.stage_calls)} stages"
                  if pipeline else "")
               + ("; the recompute is each block's replay as timed in runs of the model."
                  if any(b.replay_ns for b in profile.blocks) else
                  "; the recompute is each block's forward time and this machine's replay costs."
                  if profile.replay_costs else "; no replay costs measured: the recompute is the forward alone.")))

left, middle, right = st.columns(3)
mode = (run.trace.meta or {}).get("mode")
if pipeline:
    kind = "split-reentrant"
    middle.selectbox("Checkpoint kind", [kind], disabled=True, key="plan_kind_pipeline",
                     help="The pipeline executor runs each stage's checkpoints as split reentrant ones.")
    shown = (run.trace.meta or {}).get("schedule")
    schedule = right.selectbox("Pipeline schedule", SCHEDULES, key="plan_schedule",
                               index=SCHEDULES.index(shown) if shown in SCHEDULES else SCHEDULES.index("1F1B"))
else:
    kind = middle.selectbox("Checkpoint kind", KINDS, index=KINDS.index(mode) if mode in KINDS else 0,
                            key="plan_kind", help="split-* run DX and DW as two calls and keep each replay "
                                                  "from DX until DW.")
    schedule = None
options = {"schedule": schedule, "microbatches": profile.microbatches or None} if pipeline else {}
try:
    whole = recommend(profile, 1 << 62, kind=kind, **options)  # any budget: the curve, the floor and the baseline
except CkptVizError as err:
    st.error(md(str(err)))
    st.stop()
top = whole.baseline.peak if whole.baseline is not None else whole.curve[-1].peak
default = _rounded_up((whole.floor + top) / 2)  # halfway from the lowest reachable peak to no checkpointing
text = left.text_input("Memory budget", default, help="The whole step's peak: parameters, gradients, activations. "
                       "Units: B, KiB, MiB, GiB (binary) or KB, MB, GB.")
try:
    budget = parse_bytes(text, "Plan")
except CkptVizError as err:
    st.error(md(str(err)))
    st.stop()

rec = recommend(profile, budget, kind=kind, **options)
chosen = rec.prediction
st.subheader("Recommendation")
(st.success if chosen is not None else st.warning)(md(rec.words))
if chosen is not None:
    a, b, c, d = st.columns(4)
    a.metric("Predicted peak", format_bytes(chosen.peak), help=f"{chosen.peak:,} bytes, {md(chosen.where)}")
    b.metric("Budget", format_bytes(budget), help=f"{budget:,} bytes")
    c.metric("Recompute per step", f"{chosen.recompute_ns / 1e6:.2f} ms")
    base = chosen.step_ns - chosen.recompute_ns
    d.metric("Step time", f"{chosen.step_ns / 1e6:.1f} ms",
             delta=f"+{100 * chosen.recompute_ns / base:.0f} %" if base > 0 else None, delta_color="inverse")

st.subheader("Peak against recompute")
show_chart(curve_chart, rec.curve, chosen=chosen, budget=budget, names=names)
st.caption(md(f"Every policy with the least recompute for its peak ({len(rec.curve)} points; {rec.method}); "
              "the large dot is the recommendation, the dashed line the budget."))
st.dataframe([{"peak": format_bytes(r["peak_mib"] * (1 << 20)), "recompute (ms)": round(r["recompute_ms"], 3),
               "checkpointed": r["blocks"], "chosen": "yes" if r["chosen"] else ""}
              for r in curve_rows(rec.curve, chosen, names)], hide_index=True, width="stretch")

if chosen is not None and chosen.policy.blocks:
    st.subheader("Code to paste")
    runtime = st.radio("Checkpoint of", ("torch", "ckpt_viz"), horizontal=True, key="plan_runtime",
                       help="torch: torch.utils.checkpoint, no ckpt_viz needed; ckpt_viz: this project's runtime.")
    try:
        st.code(code(chosen.policy, runtime=runtime if not chosen.policy.exclude else "ckpt_viz",
                     comment=rec.words), language="python")
    except CkptVizError as err:  # split kinds and pipelines are driven by the training loop itself
        st.info(md(str(err)))
        st.text("Blocks to checkpoint: " + block_ranges(chosen.policy.blocks, names))
