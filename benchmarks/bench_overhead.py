"""What leaving `record()` on costs a training step: the figures of the performance issue's table.

    .venv/bin/python benchmarks/bench_overhead.py                # every row, a few minutes
    .venv/bin/python benchmarks/bench_overhead.py --rows linear8 # one group: linear8, gpt2, transformer, runtime
    .venv/bin/python benchmarks/bench_overhead.py --quick        # tiny smoke run; its ratios mean nothing
    .venv/bin/python benchmarks/bench_overhead.py --json out.json
    .venv/bin/python benchmarks/bench_overhead.py --rows linear8 --clock cpu --ablate  # what bounds linear8

Rows (a step = forward + loss + whole backward; every ratio is the median over rounds of
case_i / baseline_i measured in the same interleaved round, see `_common.interleaved`):
  linear8      8 checkpointed blocks of Linear(512) + GELU, batch 64, reentrant, at 1 and 2
               threads: `record()` with the replay checks off ("events only") and as it
               comes (replay-divergence checks on), each / the same step unrecorded. Target <= 1.02.
  gpt2         a 4-layer GPT-2 config (random init, batch 4, sequence 64), every layer
               checkpointed through HF's own mechanism with ckpt_viz's checkpoint: events only
               (target <= 1.02) and `record(memory=True)` (target <= 1.3) / unrecorded; and the
               same model with no checkpoint (the user's plain loop): `record(memory=True)` /
               unrecorded (target <= 1.3).
  transformer  the built-in transformer, one split-reentrant step (DX then DW): events only and
               `record(memory=True)` / unrecorded (memory target <= 1.5).
  runtime      our checkpoint / torch.utils.checkpoint on the linear8 model, both kinds, no
               recording (target <= 1.01).
  emit         (only with --rows emit) the cost of one `bus.emit` with a `record()` block open:
               1000 calls shaped like the runtime's, less the same loop building only the data
               dicts; "case ms" is then microseconds per emit. Shapes: a given site (most
               events), no site (capture_site=False), and a stack walk for the site.

`--clock cpu` times each case with `time.process_time` instead of `time.perf_counter`
(steadier where other jobs share the cores). `--ablate` adds linear8 rows that split the
events-only figure: the runtime's own work while recording (`bus.emit` and `bus.emit_row`
stubbed to return None, so every `if bus.enabled:` hook point still runs but no event is
built or kept) and an empty `record()` block before the step (opening and closing a recording). `--opcodes`
adds, after the timed rounds, the Python bytecode instructions per step of each linear8 and
runtime case (opcode tracing: untimed and independent of the machine's load, so it shows
the Python work a change removes).
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import ckpt_viz
from _common import CLOCKS, format_table, gen0_collections, opcodes_per_step, paired_ratio
from _common import interleaved as _interleaved
from ckpt_viz import bus
from ckpt_viz.runtime import checkpoint as our_checkpoint

try:  # the replay-divergence checks (on by default in record()); absent from older builds
    from ckpt_viz.runtime.divergence import set_checks
except ImportError:  # an older build measured for a before/after: it has no checks to turn off
    def set_checks(on: bool) -> bool:
        return False

GROUPS = ("linear8", "gpt2", "transformer", "runtime")
EXTRA_GROUPS = ("emit",)  # on request only (--rows emit)
Step = Callable[[], None]


def recorded(step: Step, *, checks: bool = False, **options: Any) -> Step:
    """`step` inside a fresh `record(**options)`; `checks` turns the replay-divergence checks on for it."""
    def run() -> None:
        previous = set_checks(checks)
        try:
            with ckpt_viz.record(**options):
                step()
        finally:
            set_checks(previous)
    return run


def unrecorded(step: Step) -> Step:
    return step


def emit_stubbed(step: Step) -> Step:
    """`step` recorded with `bus.emit` (and `emit_row`, `emit_for`) returning None: what the runtime's hook points
    cost without the bus."""
    names = [name for name in ("emit", "emit_row", "emit_for") if hasattr(bus, name)]  # older builds lack some

    def run() -> None:
        real = [getattr(bus, name) for name in names]
        for name in names:
            setattr(bus, name, _no_event)
        try:
            step()
        finally:
            for name, function in zip(names, real):
                setattr(bus, name, function)
    return run


def _no_event(kind: str, *fields: Any, **named: Any) -> None:
    return None


def empty_record_then(step: Step) -> Step:
    """An empty `record()` block, then `step` unrecorded: what opening and closing a recording costs."""
    def run() -> None:
        with ckpt_viz.record():
            pass
        step()
    return run


# ---------------------------------------------------------------- models

def linear8(width: int, batch: int, blocks: int = 8) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks))
    return model, torch.randn(batch, width)


def linear8_step(model: nn.Module, x0: torch.Tensor, checkpoint: Callable, use_reentrant: bool) -> Step:
    def step() -> None:
        x = x0.detach().requires_grad_(True)
        for block in model:
            x = checkpoint(block, x, use_reentrant=use_reentrant)
        x.sum().backward()
    return step


def gpt2_step(layers: int, batch: int, seq: int, width: int,
              checkpointed: bool = True) -> tuple[Step, nn.Module, torch.Tensor]:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    from ckpt_viz.usermodel.hf import own_checkpointing

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(bos_token_id=0, eos_token_id=0, n_layer=layers, n_embd=width, n_head=max(1, width // 64),
                        n_positions=max(seq, 64),
                        vocab_size=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    named = {f"transformer.h.{i}": h for i, h in enumerate(model.transformer.h)}

    def make(name: str, layer: Any) -> Callable:
        return functools.partial(our_checkpoint, use_reentrant=True)

    def step() -> None:
        with own_checkpointing(model, named, make):
            model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    def plain() -> None:  # the user's loop with no checkpoint
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
    return (step if checkpointed else plain), model, ids


def transformer_step() -> tuple[Step, Any]:
    """One split-reentrant step (forward, loss, DX, DW) of the built-in transformer, as `bench_record` runs it."""
    from ckpt_viz.run.scenarios import checkpointed
    from ckpt_viz.run.zoo import build_builtin
    from ckpt_viz.runtime import backward_input, backward_weight, reentrant_checkpoint_scope

    spec = build_builtin("transformer")
    params = list(spec.model.parameters())

    def step() -> None:
        x = spec.inputs[0].detach().requires_grad_(True)
        with checkpointed(spec.model, spec.checkpoint, use_reentrant=True), \
                reentrant_checkpoint_scope(lambda: params) as handles:
            loss = spec.loss(spec.model(x))
        backward_input(loss, None, [x], handles=handles)
        backward_weight(loss, None, params, handles=handles)
        spec.model.zero_grad(set_to_none=True)
    return step, spec


# ---------------------------------------------------------------- rows

EMIT_SHAPES = {
    "site given": {"site": "train.py:3", "capture_site": True},
    "no site": {"site": None, "capture_site": False},
    "site walked": {"site": None, "capture_site": True},
}


def emit_loop(shape: dict[str, Any] | None, count: int = 1000) -> Step:
    """`count` emits shaped like the runtime's inside one record() block (or, for None, only the data dicts)."""
    def run() -> None:
        with ckpt_viz.record():
            for i in range(count):
                data = {"trigger": "backward", "index": i}
                if shape is not None:
                    bus.emit("replay_started", handle_id=i, mode="reentrant", phase="ordinary", session_id=None,
                             data=data, **shape)
    return run


def measure(groups: list[str], quick: bool, repeats: int, thread_counts: tuple[int, ...] = (1, 2),
            clock: str = "wall", ablate: bool = False, opcodes: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    interleaved = functools.partial(_interleaved, clock=clock)
    gen0: dict[int, dict[str, float]] = {}
    census: dict[tuple[str, int], dict[str, float]] = {}  # --opcodes: (group, threads) -> case -> per step
    steps = 1 if quick else 4

    def add(group: str, name: str, times: dict[str, list[float]], case: str, base: str, target: float | None,
            threads: int) -> None:
        ratio = paired_ratio(times[case], times[base])
        rows.append({"group": group, "name": name, "threads": threads, "ratio": ratio, "target": target,
                     "passed": None if target is None else ratio <= target,
                     "case_ms": sorted(times[case])[len(times[case]) // 2],
                     "base_ms": sorted(times[base])[len(times[base]) // 2]})

    width, batch = (64, 8) if quick else (512, 64)
    for threads in thread_counts:
        torch.set_num_threads(threads)
        model, x0 = linear8(width, batch)
        ours_r = linear8_step(model, x0, our_checkpoint, True)
        if "linear8" in groups:
            cases = {"unrecorded": ours_r, "events": recorded(ours_r), "events+checks": recorded(ours_r, checks=True)}
            if ablate:
                cases.update({"stubbed": recorded(emit_stubbed(ours_r)), "empty": empty_record_then(ours_r)})
            times = interleaved(cases, repeats=repeats)
            if ablate:  # untimed: a case that keeps more tracked objects may cross gen-0's threshold in the step
                gen0[threads] = {name: gen0_collections(run) for name, run in cases.items()}
            if opcodes:
                census["linear8", threads] = {name: opcodes_per_step(run, steps=steps) for name, run in cases.items()}
            add("linear8", "events only / unrecorded", times, "events", "unrecorded", 1.02, threads)
            add("linear8", "record() as it comes (replay checks on) / unrecorded", times, "events+checks",
                "unrecorded", None, threads)
            add("linear8", "record() as it comes / events only (what the replay checks add)", times,
                "events+checks", "events", None, threads)
            if ablate:
                add("linear8", "ablation: events only, bus.emit stubbed / unrecorded", times, "stubbed",
                    "unrecorded", None, threads)
                add("linear8", "ablation: empty record(), then the step / unrecorded", times, "empty",
                    "unrecorded", None, threads)
        if "runtime" in groups and threads == thread_counts[0]:
            cases = {"ours_r": ours_r, "torch_r": linear8_step(model, x0, torch_checkpoint, True),
                     "ours_n": linear8_step(model, x0, our_checkpoint, False),
                     "torch_n": linear8_step(model, x0, torch_checkpoint, False)}
            times = interleaved(cases, repeats=repeats)
            if opcodes:
                census["runtime", threads] = {name: opcodes_per_step(run, steps=steps) for name, run in cases.items()}
            add("runtime", "our reentrant checkpoint / torch's", times, "ours_r", "torch_r", 1.01, threads)
            add("runtime", "our non-reentrant checkpoint / torch's", times, "ours_n", "torch_n", 1.01, threads)
    torch.set_num_threads(1)
    if "emit" in groups:
        cases = {"loop": emit_loop(None), **{name: emit_loop(shape) for name, shape in EMIT_SHAPES.items()}}
        times = interleaved(cases, repeats=repeats * 5)
        for name in EMIT_SHAPES:
            per_emit = [c - b for c, b in zip(times[name], times["loop"], strict=True)]  # ms per 1000 = us each
            rows.append({"group": "emit", "name": f"us per bus.emit in record(), {name}", "threads": 1,
                         "ratio": float("nan"), "target": None, "passed": None,
                         "case_ms": sorted(per_emit)[len(per_emit) // 2],
                         "base_ms": sorted(times["loop"])[len(times["loop"]) // 2]})
    if "gpt2" in groups:
        step, model, _ = gpt2_step(1 if quick else 4, 2 if quick else 4, 16 if quick else 64, 64 if quick else 768)
        times = interleaved({"unrecorded": step, "events": recorded(step),
                             "memory": recorded(step, memory=True, model=model)}, repeats=max(3, repeats // 3))
        add("gpt2", "events only / unrecorded", times, "events", "unrecorded", 1.02, 1)
        add("gpt2", "memory by category / unrecorded", times, "memory", "unrecorded", 1.3, 1)
        shape = (1 if quick else 4, 2 if quick else 4, 16 if quick else 64, 64 if quick else 768)
        plain, model, _ = gpt2_step(*shape, checkpointed=False)
        times = interleaved({"unrecorded": plain, "memory": recorded(plain, memory=True, model=model)},
                            repeats=max(3, repeats // 3))
        add("gpt2", "no checkpoint: memory by category / unrecorded", times, "memory", "unrecorded", 1.3, 1)
    if "transformer" in groups:
        step, spec = transformer_step()
        times = interleaved({"unrecorded": step, "events": recorded(step),
                             "memory": recorded(step, memory=True, model=spec.model, tensors=spec.inputs)},
                            repeats=max(3, repeats // 3))
        add("transformer", "events only / unrecorded", times, "events", "unrecorded", None, 1)
        add("transformer", "memory by category / unrecorded", times, "memory", "unrecorded", 1.5, 1)
    for threads, counts in gen0.items():
        rows.append({"group": "linear8", "name": "gen-0 collections per step (untimed pass)", "threads": threads,
                     "gen0": counts})
    for (group, threads), counts in census.items():
        rows.append({"group": group, "name": "Python opcodes per step (untimed pass)", "threads": threads,
                     "opcodes": counts})
    return rows


def report(rows: list[dict[str, Any]], repeats: int, clock: str = "wall") -> str:
    census = [r for r in rows if "gen0" in r]
    counted = [r for r in rows if "opcodes" in r]
    rows = [r for r in rows if "gen0" not in r and "opcodes" not in r]
    header = ["group", "figure", "threads", "case ms", "base ms", "ratio", "target", "result"]
    body = [[r["group"], r["name"], str(r["threads"]), f"{r['case_ms']:.2f}", f"{r['base_ms']:.2f}",
             f"{r['ratio']:.3f}", "-" if r["target"] is None else f"<= {r['target']}",
             "-" if r["passed"] is None else ("PASS" if r["passed"] else "MISS")] for r in rows]
    return (f"bench_overhead: torch {torch.__version__}, {repeats} interleaved rounds (gpt2/transformer: a third); "
            "ratio = median of per-round ratios" + ("; CPU time (process_time)" if clock == "cpu" else "") + "\n"
            + format_table(header, body)
            + "".join(f"\n{r['name']}, {r['threads']} thread(s): "
                      + ", ".join(f"{name} {n:.1f}" for name, n in r["gen0"].items()) for r in census)
            + "".join(f"\n{r['group']}: {r['name']}, {r['threads']} thread(s): "
                      + ", ".join(f"{name} {n:,.0f}" for name, n in r["opcodes"].items()) for r in counted))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", choices=GROUPS + EXTRA_GROUPS, default=list(GROUPS))
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads for linear8 (1 2)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: time.perf_counter (default); cpu: time.process_time, steadier under load")
    parser.add_argument("--ablate", action="store_true", help="add linear8 rows that split the events-only figure")
    parser.add_argument("--opcodes", action="store_true",
                        help="add Python opcodes per step of each linear8 / runtime case (untimed, load-independent)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    repeats = 3 if args.quick else args.repeats
    rows = measure(args.rows, args.quick, repeats, tuple(args.threads), args.clock, args.ablate, args.opcodes)
    print(report(rows, repeats, args.clock))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"repeats": repeats, "quick": args.quick, "clock": args.clock, "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
