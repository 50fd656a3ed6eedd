"""The import rules of STYLE.md, checked on the source with `ast`.

1. The vocabulary, the bus, traces and recording never import torch or a UI library; the renderers
   may build charts (altair, graphviz) but never import torch or streamlit.
2. The runtime never imports the renderers or a UI library: it emits facts.
3. Nothing in the package imports the app.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ckpt_viz"
UI = {"streamlit", "plotly", "altair", "graphviz", "matplotlib"}
TORCH_FREE = ["events.py", "bus.py", "errors.py", "trace.py", "trace_io.py", "trace_schema.py", "trace_document.py",
              "model_source.py", "diagnose.py", "render"]
CHART_LIBRARIES = {"altair", "graphviz"}  # what a renderer may use to build a figure
# Imported by the app to open saved traces: torch only inside functions (memory and graph capture).
TORCH_AT_CALL_TIME = ["recording.py"]


def _imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in (tree.body if top_level_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _files(*names: str) -> list[Path]:
    paths: list[Path] = []
    for name in names:
        target = PACKAGE / name
        paths.extend(sorted(target.rglob("*.py")) if target.is_dir() else [target])
    return [p for p in paths if p.exists()]


def _top(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("path", _files(*TORCH_FREE), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_modules_import_neither_torch_nor_ui(path: Path) -> None:
    allowed = CHART_LIBRARIES if "render" in path.parts else set()
    bad = {m for m in _imports(path) if (_top(m) in UI - allowed) or _top(m) in {"torch", "numpy"}
           or m.startswith("ckpt_viz.runtime") or m.startswith("ckpt_viz.probe")}
    assert not bad, f"{path.relative_to(ROOT)} must stay torch- and UI-free, imports {sorted(bad)}"


@pytest.mark.parametrize("path", _files(*TORCH_AT_CALL_TIME), ids=lambda p: str(p.relative_to(ROOT)))
def test_recording_imports_torch_only_when_capturing(path: Path) -> None:
    bad = {m for m in _imports(path, top_level_only=True) if _top(m) in UI | {"torch", "numpy"}
           or m.startswith("ckpt_viz.runtime") or m.startswith("ckpt_viz.probe")}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)} at module level"


@pytest.mark.parametrize("path", _files("runtime"), ids=lambda p: str(p.relative_to(ROOT)))
def test_runtime_never_imports_renderers_or_ui(path: Path) -> None:
    bad = {m for m in _imports(path) if _top(m) in UI or m.startswith("ckpt_viz.render") or _top(m) == "app"}
    assert not bad, f"{path.relative_to(ROOT)} is runtime code and imports {sorted(bad)}"


def test_package_never_imports_the_app() -> None:
    offenders = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if any(_top(m) == "app" for m in _imports(p))}
    assert not offenders


def test_layering_check_sees_a_violation(tmp_path: Path) -> None:
    """The checker itself must catch an offending import."""
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom streamlit import title\n")
    assert _imports(bad) == {"torch", "streamlit"}
