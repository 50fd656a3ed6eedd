"""clean_svg: every SVG the app shows or offers keeps its drawing and loses what can run, link or load (NOTE
[ Inert SVG ] in ckpt_viz/render/svg.py), on hand-written SVG and on what Graphviz 2.43 writes for hostile DOT."""
from __future__ import annotations

import re
from xml.etree import ElementTree

import pytest

from ckpt_viz.render.svg import FONT_FAMILY, clean_svg, dot_svg

NS = 'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"'
HOSTILE = f"""<svg {NS} width="10pt" height="10pt" onload="alert(1)">
<script>alert(2)</script><style>@import url(http://127.0.0.2/s.css);</style>
<defs><linearGradient id="l_0"><stop offset="0"/></linearGradient></defs>
<g id="node1" class="node"><title>n0</title>
<a xlink:href="javascript:alert(3)" href="http://127.0.0.2/a" xlink:title="tip">
<ellipse fill="url(#l_0)" stroke="url(http://127.0.0.2/x)" onclick="alert(4)" cx="1" cy="1" rx="1" ry="1"/>
<text font-family="x&quot; onmouseover=&quot;alert(5)" font-size="14.00" font-weight="bold">label &lt;b&gt;</text>
</a></g>
<image href="http://127.0.0.2/i.png" width="1" height="1"/>
<foreignObject><div xmlns="http://www.w3.org/1999/xhtml">x</div></foreignObject>
<use xlink:href="http://127.0.0.2/u.svg#a"/>
</svg>"""


def _elements(svg: str) -> list[ElementTree.Element]:
    return list(ElementTree.fromstring(svg).iter())


def test_scripts_links_handlers_and_loads_are_gone_and_the_drawing_stays() -> None:
    svg = clean_svg(HOSTILE)
    tags = [e.tag.rpartition("}")[2] for e in _elements(svg)]
    assert tags == ["svg", "defs", "linearGradient", "stop", "g", "title", "ellipse", "text"]  # <a> unwrapped
    attributes = {name.rpartition("}")[2] for e in _elements(svg) for name in e.attrib}
    assert not {a for a in attributes if a.startswith("on")} and "href" not in attributes and "style" not in attributes
    assert "127.0.0.2" not in svg and "javascript" not in svg and "alert" not in svg
    ellipse = next(e for e in _elements(svg) if e.tag.endswith("ellipse"))
    assert ellipse.get("fill") == "url(#l_0)" and ellipse.get("stroke") is None  # its own gradient stays
    text = next(e for e in _elements(svg) if e.tag.endswith("text"))
    assert text.text == "label <b>" and text.get("font-family") == FONT_FAMILY and text.get("font-size") == "14.00"
    assert text.get("font-weight") is None


def test_what_is_not_an_svg_is_refused_with_a_message() -> None:
    with pytest.raises(ValueError, match=r"^ckpt_viz\.render\.svg\.clean_svg: no <svg> element.*\nTip: "):
        clean_svg("<html><script>alert(1)</script></html>")
    with pytest.raises(ValueError, match=r"not well-formed XML"):
        clean_svg("<svg><g></svg>")
    with pytest.raises(ValueError, match="not well-formed"):  # an entity declared in a DTD is never read
        clean_svg('<!DOCTYPE svg [<!ENTITY a "b">]><svg>&a;</svg>')


def test_dot_fed_hostile_attributes_draws_an_inert_svg() -> None:
    # DOT we never write ourselves (our graphs quote every text: tests/render/test_render_graph.py), as a file
    # could hold it: a URL, a font name that breaks out of its attribute, an HTML label with a FONT FACE.
    dot = ('digraph { a [label="x" URL="javascript:alert(1)" href="http://127.0.0.2/h" tooltip="t" '
           'fontname="Helvetica"]; b [label=<<FONT FACE="Times">hi</FONT>>]; a -> b [URL="http://127.0.0.2/e"] }')
    svg = dot_svg(dot)
    assert svg.startswith("<svg ")
    assert "127.0.0.2" not in svg and "javascript" not in svg and "<a " not in svg
    assert set(re.findall(r'font-family="([^"]*)"', svg)) == {FONT_FAMILY}
    assert "hi" in svg and "x" in svg
