"""DOT source drawn as SVG by the real Graphviz `dot` binary, server side, at a fixed scale, and made inert.

A pure function of its text (the same DOT gives the same SVG); it never imports torch
or a UI. The app shows the SVG as an image (an `<img>` with a data: URL) per drawing, so
nothing animates a transition between two graphs and nothing in it can run.

NOTE [ Graphs drawn on the server ]
  1. Streamlit's graphviz_chart lays out in the browser with d3-graphviz, which animates
     from the previous graph to the next one; between two graphs of different node sets
     it morphs ellipses into polygons (`<polygon cx= rx=>`) and drops the cluster fills.
     Drawing here with `dot -Tsvg` gives a finished SVG per cursor position.
  2. `zoom` scales the SVG's width and height (1.0 = Graphviz's points, so a 10 pt label
     reads at about 13 px whatever the graph's size); the page scrolls to pan.

NOTE [ Inert SVG ]
  1. Text in a graph comes from a trace or a model file (labels, tags, names), so every SVG
     that is shown or offered for download goes through `clean_svg`: it keeps drawing elements
     and removes what can run, link or load: <script>, <style>, <foreignObject>, <image>, event
     handlers (on*), href / xlink:href, url(...) values other than the SVG's own #ids, and
     unwraps <a> (its drawing stays). Font attributes are replaced by our own: the font family
     is always FONT_FAMILY, a font size only a number (Graphviz 2.43 writes a DOT fontname and
     an HTML label's FONT FACE into the SVG unescaped).
  2. It parses with the standard library's ElementTree (expat), from the <svg> element on, so
     no DTD is read and no entity is declared.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import graphviz

__all__ = ["FONT_FAMILY", "clean_svg", "dot_svg"]

FONT_FAMILY = "Helvetica,sans-Serif"
_SVG_NS, _XLINK_NS = "http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"
ET.register_namespace("", _SVG_NS)
ET.register_namespace("xlink", _XLINK_NS)

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

    return clean_svg(_SIZE.sub(scaled, svg, count=1))


_DROPPED = frozenset(("script", "style", "foreignObject", "image", "iframe", "object", "embed", "use", "animate",
                      "set", "animateTransform", "animateMotion", "handler", "listener"))
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")


def _local(name: str) -> str:
    return name.rpartition("}")[2]


def _clean_attributes(element: ET.Element) -> None:
    for name in list(element.attrib):
        local, value = _local(name).lower(), element.attrib[name]
        if (local.startswith("on") or local in ("href", "src", "style")
                or ("url(" in value.lower() and not re.fullmatch(r"url\(#[\w.-]+\)", value.strip()))):
            del element.attrib[name]
        elif local == "font-family":
            element.attrib[name] = FONT_FAMILY
        elif local.startswith("font") and not _NUMBER.match(value):
            del element.attrib[name]


def _clean(parent: ET.Element) -> None:
    children = list(parent)
    parent[:] = []
    for child in children:
        tag = _local(child.tag) if isinstance(child.tag, str) else ""
        if not tag or tag in _DROPPED:  # comments and processing instructions have no str tag
            continue
        _clean(child)
        if tag == "a":  # keep what a link draws, not the link
            parent.extend(child)
            continue
        _clean_attributes(child)
        parent.append(child)


def clean_svg(svg: str) -> str:
    """The SVG with nothing that can run, link or load (NOTE [ Inert SVG ]); its drawing unchanged.

    Raises:
        ValueError: the text holds no well-formed <svg> element.
    """
    start = svg.find("<svg")
    if start < 0:
        raise ValueError("ckpt_viz.render.svg.clean_svg: no <svg> element in the text.\n"
                         "Tip: pass the output of `dot -Tsvg`.")
    try:
        root = ET.fromstring(svg[start:])
    except ET.ParseError as err:
        raise ValueError(f"ckpt_viz.render.svg.clean_svg: the SVG is not well-formed XML ({err}).\n"
                         "Tip: pass the output of `dot -Tsvg`.") from None
    if _local(root.tag) != "svg":
        raise ValueError("ckpt_viz.render.svg.clean_svg: the document is not an <svg>.\nTip: pass the output of "
                         "`dot -Tsvg`.")
    _clean(root)
    _clean_attributes(root)
    return ET.tostring(root, encoding="unicode")
