"""The renderers and `diagnose` open saved traces without torch: nothing they import loads it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
MODULES = ["ckpt_viz.trace.index", "ckpt_viz.render.graph", "ckpt_viz.render.memory", "ckpt_viz.render.swimlane",
           "ckpt_viz.render.routing", "ckpt_viz.render.eventlog", "ckpt_viz.render.text", "ckpt_viz.diagnose",
           "ckpt_viz.cli.explain"]


def test_diagnose_imports_only_the_standard_library_and_the_vocabulary() -> None:
    allowed_first_party = {"ckpt_viz.events", "ckpt_viz.errors", "ckpt_viz.trace", "ckpt_viz.trace.lifecycle",
                           "ckpt_viz.debug"}
    for path in [ROOT / "ckpt_viz" / "diagnose.py", *sorted((ROOT / "ckpt_viz" / "debug").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        found |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        first_party = {m for m in found if m.startswith("ckpt_viz") and not m.startswith("ckpt_viz.debug.")}
        # explain() reads the last recording lazily (recording.py imports no torch at import)
        assert first_party <= allowed_first_party | {"ckpt_viz.recording"}, (path, first_party)
        others = {m.split(".")[0] for m in found if not m.startswith("ckpt_viz")}
        assert others <= set(sys.stdlib_module_names) | {"__future__"}, path


def test_importing_every_renderer_loads_neither_torch_nor_a_ui() -> None:
    code = (f"import sys\nfor m in {MODULES!r}: __import__(m)\n"
            "print(sorted(m for m in ('torch', 'streamlit', 'graphviz', 'numpy', 'ckpt_viz.runtime') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]", result.stderr
