"""The merged trace's `meta`: each field combined from every rank's (NOTE [ Merging rank traces ], rule 7).

Owns `merged_meta` for `ckpt-viz merge`: `sources` joined, `replay_checks` summed, `stages` united,
`partial` per rank, `schedule` / `microbatches` from the headers, and any other field kept when the
ranks agree, else moved under `meta["by_rank"]`. Standard library only (torch-free).
"""
from __future__ import annotations

from typing import Any

from ckpt_viz.trace import Trace

__all__ = ["merged_meta"]


def _is_int(value: Any) -> bool:
    return type(value) is int


def merged_meta(traces: dict[int, Trace], headers: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each field of the merged `meta` from every rank's; see NOTE [ Merging rank traces ], rule 7."""
    ranks = sorted(traces)
    metas = {r: traces[r].meta for r in ranks}
    meta: dict[str, Any] = {}
    by_rank: dict[str, dict[str, Any]] = {}
    keys = list(dict.fromkeys(k for r in ranks for k in metas[r]))
    for key in keys:
        held = {r: metas[r][key] for r in ranks if key in metas[r]}
        if key in ("distributed", "by_rank"):
            continue
        if key == "sources":
            meta[key] = {site: line for value in held.values() if isinstance(value, dict)
                         for site, line in value.items()}
        elif key == "replay_checks":
            meta[key] = _summed_checks(held)
        elif key == "stages":
            meta[key] = sorted({s for value in held.values() if isinstance(value, list) for s in value
                                if _is_int(s)})
        elif key == "partial":
            meta[key] = {str(r): value for r, value in held.items()}
        elif len(held) == len(ranks) and all(value == held[ranks[0]] for value in held.values()):
            meta[key] = held[ranks[0]]
        else:
            by_rank[key] = {str(r): value for r, value in held.items()}
    for key, value in (("schedule", _agreed(headers, "schedule")), ("microbatches", _agreed(headers, "microbatches"))):
        if value is not None:
            meta[key] = value
            by_rank.pop(key, None)
    meta.setdefault("mode", "distributed-pipeline")
    if by_rank:
        meta["by_rank"] = by_rank
    return meta


def _agreed(headers: dict[int, dict[str, Any]], key: str) -> Any:
    """The headers' `key` when every rank gives the same one, else None."""
    values = {repr(h.get(key)) for h in headers.values()}
    return next(iter(headers.values())).get(key) if len(values) == 1 else None


def _summed_checks(held: dict[int, Any]) -> dict[str, Any]:
    """`replay_checks` of the ranks that ran checks: counts summed, each rank's under `by_rank`."""
    counts = {r: c for r, c in held.items() if isinstance(c, dict)}
    policies = {c.get("policy") for c in counts.values()}
    total: dict[str, Any] = {"policy": policies.pop() if len(policies) == 1 else "mixed", "checked": 0, "skipped": 0,
                             "skipped_regions": {}, "by_rank": {}}
    for key in ("first_checks", "budget"):  # the same constants in every rank of one ckpt_viz: the largest
        numbers = [c.get(key) for c in counts.values() if _is_int(c.get(key))]
        if numbers:
            total[key] = max(numbers)
    for rank, c in counts.items():
        checked = c.get("checked") if _is_int(c.get("checked")) else 0
        skipped = c.get("skipped") if _is_int(c.get("skipped")) else 0
        total["checked"] += checked
        total["skipped"] += skipped
        total["by_rank"][str(rank)] = {"checked": checked, "skipped": skipped}
        regions = c.get("skipped_regions")
        for name, n in (regions.items() if isinstance(regions, dict) else ()):
            if _is_int(n):
                total["skipped_regions"][name] = total["skipped_regions"].get(name, 0) + n
    return total
