"""The renderers open saved traces without torch or a UI: nothing they import loads either; the analysis they
draw loads no chart or graph library either."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
RENDERERS = ["ckpt_viz.render.graph", "ckpt_viz.render.memory", "ckpt_viz.render.swimlane", "ckpt_viz.render.routing",
             "ckpt_viz.render.timeline", "ckpt_viz.render.eventlog", "ckpt_viz.render.text",
             "ckpt_viz.render.perfetto", "ckpt_viz.render.svg", "ckpt_viz.render.chartdata"]
ANALYSIS = ["ckpt_viz.analysis.summary", "ckpt_viz.analysis.routing", "ckpt_viz.analysis.actions",
            "ckpt_viz.analysis.words", "ckpt_viz.analysis.handles"]


def _loaded(modules: list[str], watched: tuple[str, ...]) -> str:
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(sorted(m for m in {watched!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return result.stdout.strip()


def test_importing_every_renderer_loads_neither_torch_nor_a_ui() -> None:
    assert _loaded(RENDERERS, ("torch", "streamlit", "numpy", "ckpt_viz.runtime")) == "[]"


def test_the_analysis_the_renderers_draw_loads_no_chart_or_graph_library() -> None:
    assert _loaded(ANALYSIS, ("torch", "streamlit", "altair", "graphviz", "ckpt_viz.render")) == "[]"
