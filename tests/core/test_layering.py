"""The import rules of STYLE.md, checked on the source with `ast`.

1. The vocabulary, the bus, traces and recording never import torch or a UI library; the renderers
   may build charts (altair, graphviz) but never import torch or streamlit.
2. The runtime never imports the renderers or a UI library: it emits facts.
3. Nothing in the package imports the app.
4. The app (and the lessons) import only `from ckpt_viz import <name in __all__>`, and never torch;
   `import ckpt_viz` loads no torch, so the app opens a saved trace without it.
"""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import ckpt_viz

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "ckpt_viz"
CLIENTS = sorted(p for folder in ("app", "lessons") for p in (ROOT / folder).rglob("*.py"))
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


# 4. The public API is the app's only door into the package.


def _private_uses(path: Path) -> list[str]:
    """Each import in `path` that reaches past `ckpt_viz.__all__`, or imports torch."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            bad += [f"import {a.name}" for a in node.names if a.name.startswith("ckpt_viz.") or _top(a.name) == "torch"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ckpt_viz":
                bad += [f"from ckpt_viz import {a.name}" for a in node.names if a.name not in ckpt_viz.__all__]
            elif _top(node.module) in {"ckpt_viz", "torch"}:
                bad.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
    return bad


def test_app_imports_only_public_names() -> None:
    assert ROOT / "app" / "streamlit_app.py" in CLIENTS
    offenders = {str(p.relative_to(ROOT)): _private_uses(p) for p in CLIENTS if _private_uses(p)}
    assert not offenders, f"import these through `from ckpt_viz import ...` (add them to __all__): {offenders}"


def test_public_name_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "page.py"
    bad.write_text("import ckpt_viz\nfrom ckpt_viz import Trace, _LAZY\nfrom ckpt_viz.render.text import render_text\n"
                   "import ckpt_viz.run.zoo\nimport torch.nn\n\ndef f():\n    from ckpt_viz.run.scenarios import MODES\n")
    assert _private_uses(bad) == ["from ckpt_viz import _LAZY", "from ckpt_viz.render.text import render_text",
                                  "import ckpt_viz.run.zoo", "import torch.nn", "from ckpt_viz.run.scenarios import MODES"]


def test_importing_the_package_loads_neither_torch_nor_a_chart_library() -> None:
    # ckpt_viz.usermodel.sandbox too: it runs as `python -m ckpt_viz.usermodel.sandbox`, which warns when the package imported it first.
    heavy = ("torch", "numpy", "altair", "graphviz", "streamlit", "ckpt_viz.runtime", "ckpt_viz.usermodel.sandbox")
    code = f"import sys, ckpt_viz\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_every_public_name_resolves_to_its_definition() -> None:
    namespace: dict[str, object] = {}
    exec("from ckpt_viz import *", namespace)  # touches every name in __all__, the lazy ones included
    assert set(ckpt_viz.__all__) <= set(namespace)
    for name, module in ckpt_viz._LAZY.items():
        assert getattr(ckpt_viz, name) is getattr(importlib.import_module(module), name), name
    assert ckpt_viz.diagnose is importlib.import_module("ckpt_viz.diagnose").diagnose  # the function, not the module
    assert set(ckpt_viz.__all__) <= set(dir(ckpt_viz))
    with pytest.raises(AttributeError, match="has no attribute 'render_nothing'"):
        ckpt_viz.render_nothing  # noqa: B018


def test_all_is_sorted_and_lists_every_lazy_name() -> None:
    names = ckpt_viz.__all__
    kind = lambda n: 0 if n.isupper() else 1 if n[0].isupper() else 2  # noqa: E731  CONSTANTS, Classes, functions
    assert names == sorted(set(names), key=lambda n: (kind(n), n))
    assert set(ckpt_viz._LAZY) <= set(names)
    # The TYPE_CHECKING block spells out the lazy names for type checkers: it must match _LAZY.
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    spelled = {a.name: n.module for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert spelled == ckpt_viz._LAZY
