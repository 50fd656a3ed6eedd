"""Graphviz's `dot` runs within a time and a memory limit and ends when its owner goes (NOTE [ dot's limits ]
in ckpt_viz.render.svg; issue 25, finding 5). Real `dot`, on graphs that take it seconds and hundreds of MB."""
from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from ckpt_viz.errors import DotLimitError
from ckpt_viz.render.svg import dot_svg, end_dot, run_dot
from procs import live_processes

pytestmark = [pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot (apt-get install graphviz)"),
              # serial: dot stopped between 1.5 and 5 s, and within 1 s of its owner's end (wall-clock bounds)
              pytest.mark.serial]


def _tangle(nodes: int, edges: int, seed: int) -> str:
    """A random graph that keeps dot busy (2,000 nodes, 6,000 edges: over 90 s and 1.4 GB here, unlimited)."""
    rng = random.Random(seed)
    lines = [f'n{i} [label="node {i}"];' for i in range(nodes)]
    lines += [f"n{rng.randrange(nodes)} -> n{rng.randrange(nodes)};" for _ in range(edges)]
    return "digraph tangle {\n" + "\n".join(lines) + "\n}\n"


def _dots() -> list[int]:
    """This test process's own live `dot` children (other sessions on the machine may run dot too)."""
    mine = []
    for pid in live_processes("dot\0-Tsvg"):
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                mine.append(pid)
        except (OSError, ValueError, IndexError):
            pass
    return mine


def test_a_small_graph_draws_as_before() -> None:
    svg = dot_svg('digraph { a -> b [label="x"] }', 2.0)
    assert svg.startswith("<svg ") and 'width="124pt" height="262pt"' in svg  # zoom 2 of dot's 62 x 131 pt
    assert "<title>a-&gt;b</title>" in svg
    assert run_dot("digraph { a }").lstrip().startswith(b"<?xml")
    assert dot_svg("digraph { a }", inline=False).lstrip().startswith("<?xml")


def test_dot_is_stopped_at_its_time_limit() -> None:
    start = time.monotonic()
    with pytest.raises(DotLimitError) as info:
        run_dot(_tangle(2000, 6000, 0), timeout_s=1.5)
    assert 1.5 <= time.monotonic() - start < 5
    message = str(info.value)
    assert message.startswith("ckpt_viz.dot_svg: Graphviz's dot did not finish within 1.5 s drawing a graph of "
                              "about 2,000 nodes (")
    assert message.splitlines()[-1].startswith("Tip: collapse the graph")
    assert info.value.code == "dot_limit" and _dots() == []


def test_dot_is_stopped_at_its_memory_limit() -> None:
    with pytest.raises(DotLimitError, match="ran out of its memory limit of 24 MB"):
        run_dot(_tangle(2000, 6000, 1), timeout_s=60, memory_mb=24)
    assert _dots() == []


def test_ending_its_owner_kills_a_running_dot_at_once() -> None:
    caught: list[BaseException] = []

    def draw() -> None:
        try:
            run_dot(_tangle(2000, 6000, 2), timeout_s=60, owner="session-a")
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=draw)
    thread.start()
    deadline = time.monotonic() + 10
    while not _dots() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _dots(), "dot did not start"
    assert end_dot("session-b") == 0  # another owner's: untouched
    assert _dots()
    start = time.monotonic()
    assert end_dot("session-a") == 1
    thread.join(5)
    assert time.monotonic() - start < 1.0 and not thread.is_alive()
    (err,) = caught
    assert isinstance(err, DotLimitError) and "the session that asked for it ended" in str(err)
    assert _dots() == []
