"""Memory in words and tables: byte sizes ("1.5 KiB"), the table of a sample's categories, the note on "other".

Pure functions of byte counts by category (see NOTE [ Memory categories ] in
ckpt_viz/probe/memory.py); words from `ckpt_viz.render.palette`. `ckpt_viz.render.memory`
(the chart) re-exports them. Standard library only.
"""
from __future__ import annotations

from ckpt_viz.render import palette
from ckpt_viz.trace import MEMORY_CATEGORIES

__all__ = ["OTHER_NOTABLE", "format_bytes", "memory_table", "other_note"]

OTHER_NOTABLE = 0.2  # "other" this share of the total or more gets a note (see `other_note`)


def format_bytes(nbytes: float) -> str:
    """1536 -> "1.5 KiB"."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # unreachable


def memory_table(bytes_by_category: dict[str, int]) -> list[dict[str, str]]:
    """Table rows {category, size, share, what it is} in the units of the metrics ("1.5 KiB", "12%")."""
    total = sum(bytes_by_category.values())
    order = [c for c in MEMORY_CATEGORIES if c in bytes_by_category] + [
        c for c in bytes_by_category if c not in MEMORY_CATEGORIES]
    return [{"category": palette.category_word(c), "size": format_bytes(bytes_by_category[c]),
             "share": f"{100 * bytes_by_category[c] / total:.0f}%" if total else "-",
             "what it is": palette.CATEGORY_MEANINGS.get(c, "")} for c in order]


def other_note(bytes_by_category: dict[str, int]) -> str | None:
    """A sentence when "other" is at least `OTHER_NOTABLE` of the total, saying what it holds; else None."""
    total, other = sum(bytes_by_category.values()), bytes_by_category.get("other", 0)
    if not total or other < OTHER_NOTABLE * total:
        return None
    return (f"\"other\" is {100 * other / total:.0f}% of the total here ({format_bytes(other)}): "
            f"{palette.CATEGORY_MEANINGS['other']} Pass the model and its inputs to record(model=..., "
            "tensors=...) and run the loss inside the block so they are counted as such.")
