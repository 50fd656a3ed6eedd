"""The least recompute under a memory budget, and the whole trade-off curve.

Owns `recommend`, `curve` and `describe`. Torch-free: it solves over the timeline model of
ckpt_viz/plan/model.py (NOTE [ Plan timeline ]), with numpy, and with scipy's MILP where
the blocks are too many to enumerate.

NOTE [ Plan search ]
  1. The model is linear in the 0/1 choices x (one per block): the peak is
         max over windows w of  d[w] + G[w] . x
     where d[w] is window w's peak with nothing checkpointed and G[w, b] how checkpointing
     block b moves it (through the net bytes of b's earlier windows, and b's own window's rise).
     The recompute is t . x (each block's forward time, or up to its last saved tensor for a
     non-reentrant replay, less excluded regions and kept ops).
  2. Exact search: with n <= EXHAUSTIVE_MAX blocks every one of the 2^n subsets is evaluated
     (a matrix product); the curve is the Pareto front of (peak, recompute) over all of them.
  3. Otherwise `scipy.optimize.milp` (HiGHS, branch and bound: exact for this model): minimise
     t . x subject to d[w] + G[w] . x <= budget for every window. The curve is found by the
     epsilon-constraint method: start from nothing checkpointed, then repeatedly ask for the
     least recompute with a peak strictly below the last point's, until no policy is lower.
     Every point is optimal for its peak; dominated points (same recompute, higher peak) are
     dropped.
  5. Single-pass plans have an ordered form: every window after block j's forward sees j's choice
     through one coefficient a[j] (the bytes j's checkpoint drops between its forward and its
     backward), its own block through its own term, and a later block j either not at all (forward
     windows) or through one coefficient s[j] (backward windows: what j's checkpoint still holds after
     its backward, e.g. a reentrant handle's RNG state). Then a dynamic programme over the blocks in
     order is exact: a partial choice is summed up by (S = a . x so far, Mf and Mb the highest closed
     windows of each sort, Mb growing by s[j] with every later checkpointed block, its recompute); every
     later window grows with S and the peak is max(Mf, Mb), so a partial choice no worse in all four can
     replace another in every completion; keeping the non-dominated ones gives the exact Pareto front.
     `_ordered_form` checks the form on the model itself; where it does not hold (split kinds: DX sees
     the replays of later blocks) the MILP of rule 3 runs.
  4. Per-op choices (`save_ops` options: sets of op names whose outputs a checkpointed block
     keeps) are searched by solving once per option and keeping the best; the options are few
     (op kinds such as "mm" or attention), not one per op call.
  6. Pipelines (a profile with stages, planned under a schedule): the peak comes from simulating
     the schedule's actions (NOTE [ Plan pipelines ] in ckpt_viz/plan/model.py), not from the
     linear windows, so every subset of at most PIPELINE_EXHAUSTIVE_MAX candidate blocks is
     predicted and the curve is the Pareto front of them all.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ckpt_viz.errors import CkptVizError
from ckpt_viz.plan.model import Timeline, predict, timeline
from ckpt_viz.plan.schema import CurvePoint, PlanProfile, Policy, Prediction, Recommendation

__all__ = ["EXHAUSTIVE_MAX", "PIPELINE_EXHAUSTIVE_MAX", "Model", "block_ranges", "curve", "describe", "format_bytes",
           "linear_model", "parse_bytes", "recommend"]

_API = "ckpt_viz.plan.recommend"
EXHAUSTIVE_MAX = 14
PIPELINE_EXHAUSTIVE_MAX = 12  # NOTE [ Plan search ], rule 6: each subset is a simulated pipeline step


@dataclass(frozen=True)
class Model:
    """NOTE [ Plan search ], rule 1: peak(x) = max(d + G @ x), recompute(x) = t @ x."""

    d: np.ndarray
    G: np.ndarray
    t: np.ndarray
    blocks: tuple[str, ...]
    own: np.ndarray  # per window, the block whose choice picks its events, or -1

    def peaks(self, X: np.ndarray) -> np.ndarray:
        """The peak of each row of the 0/1 matrix X."""
        return (X @ self.G.T + self.d).max(axis=1)


def linear_model(line: Timeline) -> Model:
    """The (d, G, t) of a timeline (NOTE [ Plan search ], rule 1)."""
    n = len(line.blocks)
    W = len(line.windows)
    d = np.empty(W, dtype=np.float64)
    G = np.zeros((W, n), dtype=np.float64)
    level0 = float(line.base)
    shift = np.zeros(n, dtype=np.float64)
    for k, w in enumerate(line.windows):
        d[k] = level0 + w.rise[0]
        G[k] = shift
        if w.own >= 0:
            G[k, w.own] += w.rise[1] - w.rise[0]
            shift[w.own] += w.net[1] - w.net[0]
        level0 += w.net[0]
    d = np.append(d, float(line.base))  # the step starts at its base
    G = np.vstack([G, np.zeros(n)])
    own = np.array([w.own for w in line.windows] + [-1], dtype=np.int64)
    return Model(d=d, G=G, t=np.array(line.recompute_ns, dtype=np.float64), blocks=line.blocks, own=own)


def _subsets(n: int) -> np.ndarray:
    count = 1 << n
    return ((np.arange(count)[:, None] >> np.arange(n)[None, :]) & 1).astype(np.float64)


def _front(peaks: np.ndarray, costs: np.ndarray, X: np.ndarray) -> list[int]:
    """Indices of the Pareto front (least recompute for each peak), by peak ascending."""
    order = np.lexsort((peaks, costs))  # cost ascending, then peak
    front: list[int] = []
    best = np.inf
    for i in order:
        if peaks[i] < best:
            front.append(int(i))
            best = peaks[i]
    return sorted(front, key=lambda i: peaks[i])


def _exhaustive(model: Model, free: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every subset of the free blocks: (X, peaks, costs)."""
    k = int(free.sum())
    sub = _subsets(k)
    X = np.zeros((len(sub), len(model.blocks)))
    X[:, np.flatnonzero(free)] = sub
    return X, model.peaks(X), X @ model.t


def _useful_windows(model: Model, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d, G) without the windows another window is at least as high as for every choice of the free blocks."""
    G = model.G * free[None, :]
    d = model.d
    order = np.argsort(-d)
    kept: list[int] = []
    for w in order:
        # w is dominated by v if d[w] - d[v] + sum(max(0, G[w] - G[v])) <= 0
        if kept:
            v = np.array(kept)
            slack = d[w] - d[v] + np.maximum(G[w][None, :] - G[v], 0).sum(axis=1)
            if np.any(slack <= 0):
                continue
        kept.append(int(w))
    keep = np.array(sorted(kept))
    return d[keep], G[keep]


def _milp(model: Model, free: np.ndarray, budget: float, windows: tuple[np.ndarray, np.ndarray] | None = None
          ) -> np.ndarray | None:
    """The least-recompute x with peak <= budget (NOTE [ Plan search ], rule 3), or None if none exists."""
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise CkptVizError(f"{_API}: this plan ({len(model.blocks)} blocks, a model without the ordered form of NOTE "
                           f"[ Plan search ]) needs scipy's MILP solver, and scipy is not installed.\nTip: pip "
                           "install -c constraints.txt -e '.[plan]', or plan over at most "
                           f"{EXHAUSTIVE_MAX} candidate blocks (searched exhaustively).") from None

    n = len(model.blocks)
    d, G = windows if windows is not None else _useful_windows(model, free)
    if np.any(d[~np.any(G != 0, axis=1)] > budget):
        return None  # a window no free block moves is over the budget
    upper = free.astype(np.float64)
    cost = model.t + 1e-9 * model.t.max(initial=1.0)  # ties: fewer blocks
    constraint = LinearConstraint(G, -np.inf, budget - d)
    result = milp(cost, constraints=[constraint], integrality=np.ones(n), bounds=Bounds(np.zeros(n), upper),
                  options={"mip_rel_gap": 0.0})
    if result.status != 0 or result.x is None:
        return None
    return np.round(result.x)


def _candidates(line: Timeline, blocks: Iterable[str] | None) -> np.ndarray:
    if blocks is None:
        return np.ones(len(line.blocks))
    names = set(blocks)
    unknown = names - set(line.blocks)
    if unknown:
        raise CkptVizError(f"{_API}: the profile has no block {sorted(unknown)[0]!r}; its blocks are "
                           f"{', '.join(line.blocks[:8])}{' ...' if len(line.blocks) > 8 else ''}.\nTip: name blocks "
                           "the profile lists, or leave candidates out to choose among all of them.")
    return np.array([1.0 if b in names else 0.0 for b in line.blocks])


def _ordered_form(model: Model, free: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                                  np.ndarray] | None:
    """NOTE [ Plan search ], rule 5: (a, s, last, own, suffix) when every window w reads
        d[w] + a[:m] . x[:m] + own[w] x[m] + (s[m+1:] . x[m+1:] if suffix[w] else 0),  m = last[w],
    with a and s common to all windows; None when the model is not of this form."""
    G = model.G * free[None, :]
    W, n = G.shape
    nonzero = G != 0
    tail = np.where(nonzero.any(axis=1), n - 1 - np.argmax(nonzero[:, ::-1], axis=1), -1)
    last = np.where(model.own >= 0, model.own, tail)
    a = np.full(n, np.nan)
    s = np.full(n, np.nan)
    own = np.zeros(W)
    suffix = np.zeros(W, dtype=bool)

    def learn(values: np.ndarray, into: np.ndarray, lo: int) -> bool:
        for j, value in enumerate(values, start=lo):
            if np.isnan(into[j]):
                into[j] = value
            elif into[j] != value:
                return False
        return True

    for w in np.flatnonzero(model.own >= 0):  # the blocks' own windows fix a and s
        m = int(last[w])
        own[w] = G[w, m]
        suffix[w] = bool(np.any(G[w, m + 1:] != 0))
        if not learn(G[w, :m], a, 0) or (suffix[w] and not learn(G[w, m + 1:], s, m + 1)):
            return None
    a = np.nan_to_num(a)
    for w in np.flatnonzero(model.own < 0):  # the others: a prefix of a (and the last block's term), or all of s
        m = int(last[w])
        if m < 0:
            continue
        if np.array_equal(G[w, :m], a[:m]):
            own[w] = G[w, m]
        elif learn(G[w], s, 0):
            last[w], suffix[w] = -1, True
        else:
            return None
    s = np.nan_to_num(s)
    for w in range(W):  # a suffix window sees every later block's s; a plain one none
        m = int(last[w])
        if suffix[w] and not np.array_equal(G[w, m + 1:], s[m + 1:]):
            return None
        if not suffix[w] and np.any(G[w, m + 1:] != 0):
            return None
    return a, s, last, own, suffix


def _ordered_dp(model: Model, free: np.ndarray, form: tuple[np.ndarray, ...]) -> list[tuple[float, float, np.ndarray]]:
    """NOTE [ Plan search ], rule 5: the exact Pareto front by a dynamic programme over the blocks in order.

    A state after blocks 0..k is (S, Mf, Mb, cost, x): S = a[:k+1] . x, Mf the highest closed window
    without later terms, Mb the highest closed window with them (each later block adds its s to it), cost
    the recompute. Every later window's value grows with S, and the final peak is max(Mf, Mb), so a state
    no larger in all four than another is at least as good in every completion: only the states no other
    state beats in all four at once are kept, and the front of the final states is exact.
    """
    a, s, last, own, suffix = form
    n = len(model.blocks)
    d = model.d
    S = np.zeros(1)
    closed = last < 0
    Mf = np.array([d[closed & ~suffix].max(initial=-np.inf)])
    Mb = np.array([d[closed & suffix].max(initial=-np.inf)])
    C = np.zeros(1)
    X = np.zeros((1, n), dtype=np.int8)
    for k in range(n):
        plain = np.flatnonzero((last == k) & ~suffix)
        later = np.flatnonzero((last == k) & suffix)
        options = (0, 1) if free[k] > 0 else (0,)
        parts = []
        for c in options:
            top_f = (d[plain][None, :] + S[:, None] + own[plain][None, :] * c).max(axis=1, initial=-np.inf)
            top_b = (d[later][None, :] + S[:, None] + own[later][None, :] * c).max(axis=1, initial=-np.inf)
            x = X.copy()
            x[:, k] = c
            parts.append((S + a[k] * c, np.maximum(Mf, top_f), np.maximum(Mb + s[k] * c, top_b), C + model.t[k] * c, x))
        S, Mf, Mb, C, X = (np.concatenate([p[i] for p in parts]) for i in range(5))
        S, Mf, Mb, C, X = _undominated(S, Mf, Mb, C, X)
    final = np.maximum(Mf, Mb)
    keep = _front(final, C, X)
    return [(float(final[i]), float(C[i]), X[i].astype(np.float64)) for i in keep]


def _undominated(S: np.ndarray, Mf: np.ndarray, Mb: np.ndarray, C: np.ndarray, X: np.ndarray
                 ) -> tuple[np.ndarray, ...]:
    """The states no other state beats in S, Mf, Mb and cost at once (of equal ones, the first)."""
    order = np.lexsort((Mb, Mf, S, C))
    S, Mf, Mb, C, X = S[order], Mf[order], Mb[order], C[order], X[order]
    keep = np.ones(len(S), dtype=bool)
    for i in range(1, len(S)):
        if np.any(keep[:i] & (S[:i] <= S[i]) & (Mf[:i] <= Mf[i]) & (Mb[:i] <= Mb[i])):
            keep[i] = False
    return S[keep], Mf[keep], Mb[keep], C[keep], X[keep]


def _curve_of(model: Model, free: np.ndarray) -> tuple[list[tuple[float, float, np.ndarray]], str]:
    n = int(free.sum())
    if n <= EXHAUSTIVE_MAX:
        X, peaks, costs = _exhaustive(model, free)
        return [(peaks[i], costs[i], X[i]) for i in _front(peaks, costs, X)], f"exhaustive over 2^{n} subsets"
    form = _ordered_form(model, free)
    if form is not None:
        return _ordered_dp(model, free, form), "dynamic programme over the blocks in order (exact for this model)"
    points = []
    x = np.zeros(len(model.blocks))
    budget = np.inf
    windows = _useful_windows(model, free)
    while True:
        x = _milp(model, free, budget, windows) if np.isfinite(budget) else np.zeros(len(model.blocks))
        if x is None:
            break
        peak = float(model.peaks(x[None, :])[0])
        points.append((peak, float(model.t @ x), x))
        budget = peak - 1.0
        if len(points) > 4 * len(model.blocks) + 64:
            break
    points.sort(key=lambda p: (p[1], p[0]))
    kept: list[tuple[float, float, np.ndarray]] = []
    for p in points:
        if not kept or p[0] < kept[-1][0]:
            kept.append(p)
    return sorted(kept, key=lambda p: p[0]), "scipy.optimize.milp (HiGHS, exact)"


def _pipeline_points(profile: PlanProfile, schedule: str, microbatches: int | None, exclude: Iterable[str],
                     candidates: Iterable[str] | None) -> tuple[list[tuple[float, float, frozenset[str]]], int]:
    """NOTE [ Plan search ], rule 6: the Pareto front of a pipeline profile under `schedule`, every subset of the
    candidate blocks predicted (`predict_pipeline`), and the number of candidates."""
    line = timeline(profile, "split-reentrant")
    free = _candidates(line, candidates)
    names = [b for b, v in zip(line.blocks, free) if v]
    if len(names) > PIPELINE_EXHAUSTIVE_MAX:
        raise CkptVizError(f"{_API}: a pipeline plan predicts every subset of its blocks under the schedule; "
                           f"{len(names)} candidate blocks are 2^{len(names)} subsets.\nTip: name at most "
                           f"{PIPELINE_EXHAUSTIVE_MAX} candidate blocks (candidates=[...], `ckpt-viz plan --blocks`).")
    found = []
    for bits in range(1 << len(names)):
        blocks = frozenset(n for i, n in enumerate(names) if bits >> i & 1)
        p = predict(profile, Policy(blocks, "split-reentrant", frozenset(exclude), schedule=schedule,
                                    microbatches=microbatches))
        found.append((float(p.peak), float(p.recompute_ns), blocks))
    found.sort(key=lambda f: (f[1], f[0], len(f[2])))
    front: list[tuple[float, float, frozenset[str]]] = []
    for f in found:
        if not front or f[0] < front[-1][0]:
            front.append(f)
    return sorted(front, key=lambda f: f[0]), len(names)


def curve(profile: PlanProfile, *, kind: str = "nonreentrant", exclude: Iterable[str] = (),
          save_ops: Iterable[str] = (), candidates: Iterable[str] | None = None, schedule: str | None = None,
          microbatches: int | None = None) -> tuple[CurvePoint, ...]:
    """Every Pareto-optimal (peak, recompute) point over the candidate blocks, peak ascending.

    `schedule` (a pipeline profile's: "GPipe", "1F1B", "ZB-H1") plans the pipeline step under that schedule
    with `microbatches` (default: the profile's); its blocks are split reentrant checkpoints, whatever `kind`.
    """
    if schedule is not None:
        points, _ = _pipeline_points(profile, schedule, microbatches, exclude, candidates)
        return tuple(CurvePoint(peak=round(p), recompute_ns=round(c), blocks=b) for p, c, b in points)
    line = timeline(profile, kind, exclude, save_ops)
    model = linear_model(line)
    points, _ = _curve_of(model, _candidates(line, candidates))
    ops = frozenset(save_ops)
    return tuple(CurvePoint(peak=round(p), recompute_ns=round(c),
                            blocks=frozenset(b for b, v in zip(model.blocks, x) if v > 0.5), save_ops=ops)
                 for p, c, x in points)


def recommend(profile: PlanProfile, budget: int, *, kind: str = "nonreentrant", exclude: Iterable[str] = (),
              save_ops_options: Sequence[Iterable[str]] = ((),), candidates: Iterable[str] | None = None,
              schedule: str | None = None, microbatches: int | None = None) -> Recommendation:
    """The policy with the least recompute whose predicted peak is at most `budget` bytes.

    Args:
        profile: the step's profile.
        budget: the memory budget in bytes (the whole step: parameters, gradients, activations...).
        kind: the checkpoint kind to plan for.
        exclude: excluded regions (kept, never recomputed) in every checkpointed block.
        save_ops_options: sets of op names a checkpointed block keeps (torch's selective
            checkpointing) to choose among; the default considers none.
        candidates: the blocks the plan may checkpoint (default: all the profile's blocks).
        schedule, microbatches: for a pipeline profile, the schedule ("GPipe", "1F1B", "ZB-H1") and the
            micro-batch count (default: the profile's) to plan under; the pipeline's checkpoints are
            split reentrant (NOTE [ Plan pipelines ] in ckpt_viz/plan/model.py), so `kind` is that.

    Returns:
        The `Recommendation`: the chosen policy's prediction (None when nothing meets the budget),
        the curve, the method (NOTE [ Plan search ]) and a sentence for people.
    """
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or budget <= 0:
        raise CkptVizError(f"{_API}: budget must be a positive number of bytes, got {budget!r}.\n"
                           "Tip: pass e.g. budget=1.5 * 2**30, or '1.5GiB' to ckpt_viz.plan.parse_bytes.")
    if schedule is not None:
        return _recommend_pipeline(profile, budget, schedule, microbatches, frozenset(exclude), candidates)
    best: tuple[float, float, np.ndarray, frozenset[str]] | None = None
    all_points: list[CurvePoint] = []
    method = ""
    floor = np.inf
    for option in save_ops_options:
        ops = frozenset(option)
        line = timeline(profile, kind, exclude, ops)
        model = linear_model(line)
        free = _candidates(line, candidates)
        points, method = _curve_of(model, free)
        floor = min(floor, points[0][0])
        for peak, cost, x in points:
            all_points.append(CurvePoint(peak=round(peak), recompute_ns=round(cost),
                                         blocks=frozenset(b for b, v in zip(model.blocks, x) if v > 0.5),
                                         save_ops=ops))
            if peak <= budget and (best is None or (cost, peak) < (best[1], best[0])):
                best = (peak, cost, x, ops)
    merged = sorted(all_points, key=lambda p: (p.recompute_ns, p.peak))
    front: list[CurvePoint] = []
    for p in merged:
        if not front or p.peak < front[-1].peak:
            front.append(p)
    front.sort(key=lambda p: p.peak)
    none = predict(profile, Policy(frozenset(), kind, frozenset(exclude)))
    chosen = None
    if best is not None:
        policy = Policy(blocks=frozenset(b for b, v in zip(linear_model(timeline(profile, kind, exclude, best[3])
                                                                         ).blocks, best[2]) if v > 0.5),
                        kind=kind, exclude=frozenset(exclude), save_ops=best[3])
        chosen = predict(profile, policy)
    words = describe(chosen, budget=budget, baseline=none, floor=int(floor))
    return Recommendation(budget=int(budget), prediction=chosen, curve=tuple(front), method=method, words=words,
                          floor=int(floor), baseline=none)


def _recommend_pipeline(profile: PlanProfile, budget: int, schedule: str, microbatches: int | None,
                        exclude: frozenset[str], candidates: Iterable[str] | None) -> Recommendation:
    points, n = _pipeline_points(profile, schedule, microbatches, exclude, candidates)
    front = tuple(CurvePoint(peak=round(p), recompute_ns=round(c), blocks=b) for p, c, b in points)

    def policy(blocks: frozenset[str]) -> Policy:
        return Policy(blocks, "split-reentrant", exclude, schedule=schedule, microbatches=microbatches)

    meets = [p for p in front if p.peak <= budget]
    chosen = predict(profile, policy(min(meets, key=lambda p: (p.recompute_ns, p.peak)).blocks)) if meets else None
    none = predict(profile, policy(frozenset()))
    floor = front[0].peak if front else none.peak
    words = describe(chosen, budget=budget, baseline=none, floor=int(floor))
    return Recommendation(budget=int(budget), prediction=chosen, curve=front,
                          method=f"exhaustive over 2^{n} subsets under {schedule}", words=words, floor=int(floor),
                          baseline=none)


# ---------------------------------------------------------------- words

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "tb": 1000**4}


def parse_bytes(text: str | int | float, api: str = "ckpt_viz.plan.parse_bytes") -> int:
    """'1.5GiB', '96 MiB', '2e9', 123456 -> bytes (binary units KiB/MiB/GiB; KB/MB/GB are powers of 1000)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise CkptVizError(f"{api}: cannot read {str(text)[:60]!r} as a size; expected a number with an "
                               "optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB).\nTip: e.g. '1.5GiB' or '96MiB'.")
        value = float(m.group(1)) * _UNITS[unit]
    if not value > 0 or value != value or value == float("inf"):
        raise CkptVizError(f"{api}: a size must be a positive number of bytes, got {text!r}.\nTip: e.g. '1.5GiB'.")
    return int(value)


def format_bytes(n: float) -> str:
    """Bytes for people, binary units: '96.0 MiB'."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def block_ranges(names: Iterable[str], order: Sequence[str]) -> str:
    """Block names compressed into ranges in forward order: 'model.layers.2-7, lm_head'."""
    chosen = [n for n in order if n in set(names)]
    groups: list[tuple[str, list[int]]] = []
    for name in chosen:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m is None:
            groups.append((name, []))
            continue
        prefix, number = m.group(1), int(m.group(2))
        if groups and groups[-1][0] == prefix and groups[-1][1] and groups[-1][1][-1] == number - 1:
            groups[-1][1].append(number)
        else:
            groups.append((prefix, [number]))
    parts = []
    for prefix, numbers in groups:
        if not numbers:
            parts.append(prefix)
        elif len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]}")
        else:
            parts.append(f"{prefix}{numbers[0]}-{numbers[-1]}")
    return ", ".join(parts)


def describe(prediction: Prediction | None, *, budget: int | None = None, baseline: Prediction | None = None,
             floor: int | None = None) -> str:
    """One sentence for people: what to checkpoint, the peak and the step-time cost."""
    if prediction is None:
        low = f"; the lowest any policy reaches is {format_bytes(floor)}" if floor is not None else ""
        over = f" of {format_bytes(budget)}" if budget is not None else ""
        return (f"No policy over these blocks meets the budget{over}{low}. Raise the budget, allow more blocks, or "
                "plan with excluded regions / kept ops off.")
    p = prediction.policy
    order = tuple(sorted(p.blocks))
    what = "checkpoint nothing" if not p.blocks else f"checkpoint {block_ranges(p.blocks, _natural(order))}"
    if p.save_ops:
        what += f", keep the outputs of {', '.join(sorted(p.save_ops))}"
    if p.exclude:
        what += f", exclude {block_ranges(p.exclude, _natural(tuple(p.exclude)))}"
    if p.blocks:
        what += f" ({p.kind})"
    if p.schedule is not None:
        what += f" under {p.schedule}" + (f" with {p.microbatches} micro-batches" if p.microbatches else "")
    step = prediction.step_ns - prediction.recompute_ns
    extra = f", +{100 * prediction.recompute_ns / step:.0f} % step time" if step > 0 else ""
    base = f" (without checkpointing {format_bytes(baseline.peak)})" if baseline is not None else ""
    within = f", budget {format_bytes(budget)}" if budget is not None else ""
    return f"{what}: peak {format_bytes(prediction.peak)}{within}{base}{extra}."


def _natural(names: tuple[str, ...]) -> tuple[str, ...]:
    def key(name: str) -> tuple:
        return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))

    return tuple(sorted(names, key=key))

