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

NOTE [ dot's limits ]
  1. `dot` runs as a subprocess with a wall-clock limit (`DOT_TIMEOUT_S`), an address-space
     limit (`DOT_MEMORY_MB`, RLIMIT_AS) and a CPU-time limit (RLIMIT_CPU, the wall limit plus
     slack), all set by `prlimit` on its pid before it is given the graph: it reads its whole
     input before it lays out, so nothing of the layout runs unlimited. A 20,000-node
     snapshot kept it at 100 % of a core for over 5 minutes, and a 100 KB torchviz graph took
     777 MB, before these limits (issue 25, finding 5).
  2. Over a limit, `dot` is killed and `DotLimitError` says which limit, with the graph's
     size in nodes and bytes.
  3. `owner` (the app passes its session id) names who is waiting for the drawing:
     `end_dot(owner)` kills every `dot` still running for it (the app calls it when
     Streamlit ends or drops that session).
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

import contextlib
import re
import resource
import subprocess
import threading
import xml.etree.ElementTree as ET
from collections.abc import Hashable

import graphviz

from ckpt_viz.errors import DotLimitError

__all__ = ["DOT_MEMORY_MB", "DOT_TIMEOUT_S", "FONT_FAMILY", "clean_svg", "dot_svg", "end_dot", "run_dot"]

FONT_FAMILY = "Helvetica,sans-Serif"
_SVG_NS, _XLINK_NS = "http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"
ET.register_namespace("", _SVG_NS)
ET.register_namespace("xlink", _XLINK_NS)

DOT_TIMEOUT_S = 20.0
DOT_MEMORY_MB = 1024
_HEADER = re.compile(r"^.*?(?=<svg\b)", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_SIZE = re.compile(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"')
_RUNNING: dict[Hashable, dict[subprocess.Popen[bytes], threading.Event]] = {}  # owner -> dot -> "ended by owner"
_LOCK = threading.Lock()


def run_dot(dot: str, fmt: str = "svg", *, timeout_s: float = DOT_TIMEOUT_S, memory_mb: int = DOT_MEMORY_MB,
            owner: Hashable | None = None) -> bytes:
    """`dot -T<fmt>` of the DOT source `dot`, within NOTE [ dot's limits ]; its output bytes.

    Raises:
        DotLimitError: it ran past `timeout_s`, out of `memory_mb`, or was ended by `end_dot`.
        graphviz.ExecutableNotFound: the `dot` binary is not installed.
        graphviz.CalledProcessError: `dot` refused the source (a syntax error).
    """
    data = dot.encode("utf-8")
    argv = ["dot", f"-T{fmt}"]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except FileNotFoundError as exc:
        raise graphviz.ExecutableNotFound(argv) from exc
    killed = threading.Event()
    try:
        cpu_s = int(timeout_s) + 5
        resource.prlimit(proc.pid, resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.prlimit(proc.pid, resource.RLIMIT_CPU, (cpu_s, cpu_s))
        with _LOCK:
            _RUNNING.setdefault(owner, {})[proc] = killed
        try:
            out, err = proc.communicate(data, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise DotLimitError(_message(dot, f"did not finish within {timeout_s:g} s")) from None
    finally:
        with _LOCK:
            running = _RUNNING.get(owner)
            if running is not None:
                running.pop(proc, None)
                if not running:
                    del _RUNNING[owner]
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if killed.is_set():
        raise DotLimitError(_message(dot, "was stopped: the session that asked for it ended"))
    if proc.returncode != 0:
        said = err.decode("utf-8", "replace")
        if proc.returncode < 0 or "out of memory" in said.lower() or "cannot allocate" in said.lower():
            raise DotLimitError(_message(dot, f"ran out of its memory limit of {memory_mb} MB or CPU time "
                                              f"(exit status {proc.returncode})"))
        raise graphviz.CalledProcessError(proc.returncode, argv, output=out, stderr=err)
    return out


def _message(dot: str, what: str) -> str:
    nodes = len(re.findall(r"^\s*\S+\s*\[", dot, re.M))
    return (f"ckpt_viz.dot_svg: Graphviz's dot {what} drawing a graph of about {nodes:,} nodes "
            f"({len(dot.encode()):,} bytes of DOT); it was stopped.\nTip: collapse the graph (fewer, bigger "
            "nodes) or pick an earlier snapshot; the text views show every node without drawing.")


def end_dot(owner: Hashable) -> int:
    """Kill every `dot` still running for `owner`; how many there were."""
    with _LOCK:
        running = list(_RUNNING.pop(owner, {}).items())
    for proc, killed in running:
        killed.set()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    return len(running)


def dot_svg(dot: str, zoom: float = 1.0, *, owner: Hashable | None = None, inline: bool = True) -> str:
    """`dot` drawn as an inert inline SVG element (no XML header or comments; NOTE [ Inert SVG ]), scaled by `zoom`;
    with `inline` False, a whole SVG document (for a file), unscaled. `owner`: see NOTE [ dot's limits ], rule 3.

    Raises:
        DotLimitError: over NOTE [ dot's limits ].
        graphviz.ExecutableNotFound: the `dot` binary is not installed.
    """
    svg = run_dot(dot, "svg", owner=owner).decode("utf-8")
    if not inline:  # a standalone file: the XML header, then the inert SVG (NOTE [ Inert SVG ])
        return '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + clean_svg(svg)
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
