"""The source lines a recording keeps at close (recording.py NOTE rule 7): reused across blocks while linecache
holds the file's lines, read again once linecache drops them."""
from __future__ import annotations

import importlib.util
import linecache
import os

import ckpt_viz

HEAD = "from ckpt_viz import bus\nfrom ckpt_viz.events import PhaseSet\ndef go():\n"


def _load(path: str):
    spec = importlib.util.spec_from_file_location("user_code_for_sources", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_line_read_at_one_close_is_the_same_at_the_next_and_follows_an_edit(tmp_path):
    path = tmp_path / "user_step.py"
    path.write_text(HEAD + "    bus.emit(PhaseSet, old='dx', new='dw')  # first text\n")
    module = _load(str(path))
    site_end = "user_step.py:4"
    traces = []
    for _ in range(2):
        with ckpt_viz.record() as rec:
            module.go()
        traces.append(rec.trace)
    (site,) = [s for s in traces[0].meta["sources"] if s.endswith(site_end)]
    assert traces[0].meta["sources"][site] == "bus.emit(PhaseSet, old='dx', new='dw')  # first text"
    assert traces[1].meta["sources"] == traces[0].meta["sources"]
    assert [e.site for e in traces[1].events] == [site]
    # the file changes and linecache forgets it (as traceback's checkcache does): the next close reads it again
    path.write_text(HEAD + "    bus.emit(PhaseSet, old='dx', new='dw')  # second text\n")
    os.utime(path, (1, 1))
    linecache.checkcache(site.rpartition(":")[0])
    with ckpt_viz.record() as rec:
        module.go()
    assert rec.trace.meta["sources"][site] == "bus.emit(PhaseSet, old='dx', new='dw')  # second text"
