"""DOT source drawn as SVG by the real Graphviz `dot` binary, server side, at a fixed scale.

A pure function of its text (the same DOT gives the same SVG); it never imports torch
or a UI. The app shows the SVG as a new element per drawing, so nothing animates a
transition between two graphs.

NOTE [ Graphs drawn on the server ]
  1. Streamlit's graphviz_chart lays out in the browser with d3-graphviz, which animates
     from the previous graph to the next one; between two graphs of different node sets
     it morphs ellipses into polygons (`<polygon cx= rx=>`) and drops the cluster fills.
     Drawing here with `dot -Tsvg` gives a finished SVG per cursor position.
  2. `zoom` scales the SVG's width and height (1.0 = Graphviz's points, so a 10 pt label
     reads at about 13 px whatever the graph's size); the page scrolls to pan.
"""
from __future__ import annotations

import re

import graphviz

__all__ = ["dot_svg"]

_HEADER = re.compile(r"^.*?(?=<svg\b)", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_SIZE = re.compile(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"')


def dot_svg(dot: str, zoom: float = 1.0) -> str:
    """`dot` drawn as an inline SVG element (no XML header or comments), scaled by `zoom`.

    Raises:
        graphviz.ExecutableNotFound: the `dot` binary is not installed.
    """
    svg = graphviz.Source(dot).pipe(format="svg", encoding="utf-8")
    svg = _COMMENT.sub("", _HEADER.sub("", svg, count=1))

    def scaled(match: re.Match[str]) -> str:
        w, h = float(match.group(1)) * zoom, float(match.group(2)) * zoom
        return f'<svg width="{w:.0f}pt" height="{h:.0f}pt"'

    return _SIZE.sub(scaled, svg, count=1)
