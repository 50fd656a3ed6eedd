"""The import rules of STYLE.md, checked on the source with `ast` and in fresh interpreters.

1. The vocabulary, the bus, traces and recording never import torch or a UI library; the renderers
   may build charts (altair, graphviz) but never import torch or streamlit. Checked on the source
   and transitively: a fresh interpreter imports each torch-free module and torch and streamlit are
   not loaded afterwards; `ckpt-viz info` and `ckpt-viz export` run without importing torch.
2. The runtime never imports the renderers or a UI library: it emits facts.
3. Nothing in the package imports the app.
4. The app (and the lessons) import only `from ckpt_viz import <name in __all__>`, and never torch;
   `import ckpt_viz` loads no torch, so the app opens a saved trace without it.
5. No import cycles in the package, function-level imports included.
6. No hand-written C: the package holds no C or C++ source and builds nothing at run time (issue 26, item 4).
7. The core (vocabulary, codes, events, bus, trace, analysis, recording) names its API: each public module
   has `__all__`; a name is imported from the module that defines it (or from a package's `__all__`), never
   a `_private` name or module from outside its package.
(The 400-line cap was dropped with issue 26, item 5: sizes follow concepts, reviews warn at 600 lines.)
"""
from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import ckpt_viz

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "ckpt_viz"
CLIENTS = sorted(p for folder in ("app", "lessons") for p in (ROOT / folder).rglob("*.py"))
UI = {"streamlit", "plotly", "altair", "graphviz", "matplotlib"}
TORCH_FREE = ["vocabulary.py", "codes.py", "events.py", "bus.py", "launch.py", "sites.py", "errors.py",
              "catalog.py", "trace", "analysis", "render", "cli/explain.py", "cli/__init__.py", "cli/info.py",
              "usermodel/source.py", "run/schedules.py"]
CHART_LIBRARIES = {"altair", "graphviz"}  # what a renderer may use to build a figure
# Torch only inside functions: recording (memory and graph capture) and the commands that run models.
TORCH_AT_CALL_TIME = ["recording.py", "cli/record.py", "cli/app.py", "run/obtain.py"]
# The core whose names rule 7 checks.
CORE = ["vocabulary.py", "codes.py", "events.py", "bus.py", "launch.py", "sites.py", "errors.py", "catalog.py",
        "trace", "analysis", "recording.py"]


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
        assert target.exists(), f"{target.relative_to(ROOT)} is listed in test_layering.py but does not exist"
        paths.extend(sorted(target.rglob("*.py")) if target.is_dir() else [target])
    return paths


def _top(module: str) -> str:
    return module.split(".")[0]


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", _files(*TORCH_FREE), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_modules_import_neither_torch_nor_ui(path: Path) -> None:
    allowed = CHART_LIBRARIES if "render" in path.parts else set()
    bad = {m for m in _imports(path) if (_top(m) in UI - allowed) or _top(m) in {"torch", "numpy"}
           or m.startswith(("ckpt_viz.runtime", "ckpt_viz.probe", "ckpt_viz.run.", "ckpt_viz.usermodel.sandbox"))}
    assert not bad, f"{path.relative_to(ROOT)} must stay torch- and UI-free, imports {sorted(bad)}"


@pytest.mark.parametrize("path", _files(*TORCH_AT_CALL_TIME), ids=lambda p: str(p.relative_to(ROOT)))
def test_recording_imports_torch_only_when_capturing(path: Path) -> None:
    bad = {m for m in _imports(path, top_level_only=True) if _top(m) in UI | {"torch", "numpy"}
           or m.startswith(("ckpt_viz.runtime", "ckpt_viz.probe", "ckpt_viz.run."))}
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


# 1, transitively: what a fresh interpreter has loaded after importing a torch-free module.


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(sorted(m for m in ('torch', 'streamlit') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"'))


@pytest.mark.parametrize("module", [_module_name(p) for p in _files(*TORCH_FREE, *TORCH_AT_CALL_TIME)])
def test_torch_free_modules_load_no_torch_transitively(module: str) -> None:
    assert _loaded_after(f"import {module}") == [], f"importing {module} loads them"


def test_transitive_check_sees_a_violation() -> None:
    assert _loaded_after("import json; import torch") == ["torch"]


def _run_cli_watching_imports(*args: str) -> subprocess.CompletedProcess[str]:
    # `-X importtime` writes one stderr line per module the interpreter imports, in the order it does.
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "ckpt_viz", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_info_and_export_never_import_torch(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from traces import split_trace  # hand-built, torch-free
    finally:
        sys.path.remove(str(ROOT / "tests"))
    saved = tmp_path / "trace.json.gz"
    split_trace().save(saved)
    info = _run_cli_watching_imports("info", str(saved))
    assert info.returncode == 0, info.stderr
    assert "handles: 2" in info.stdout and "problems:" in info.stdout
    out = tmp_path / "perfetto.json"
    export = _run_cli_watching_imports("export", str(saved), "--perfetto", str(out))
    assert export.returncode == 0, export.stderr
    assert json.loads(out.read_text())["traceEvents"]
    for proc in (info, export):
        imported = _imported(proc.stderr)
        assert "ckpt_viz.cli.info" in imported  # the watch works: it sees the command's own module
        assert not {m for m in imported if _top(m) in {"torch", "streamlit"}}, proc.args


def test_import_watch_sees_torch() -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert "torch" in _imported(proc.stderr)


def test_cli_names_are_the_runs_names() -> None:
    # The parser reads ckpt_viz.catalog (no torch); the runs define the same names.
    from ckpt_viz import catalog
    from ckpt_viz.run import scenarios, zoo

    assert catalog.MODES == scenarios.MODES
    assert catalog.BUILTIN_MODEL_NAMES == tuple(zoo.BUILTIN_MODELS)
    assert catalog.DEFAULT_MODEL == zoo.DEFAULT_MODEL


# 5. No import cycles: the module graph, function-level imports included.


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                         or getattr(test, "attr", None) == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under `if TYPE_CHECKING:` (they never run)."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if _type_checking(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports.

    `from a import b` counts as importing the module a.b when there is one, else a. The
    implicit import of a module's parent packages is not an edge (every package would be
    in a cycle with the submodules its __init__ re-exports).
    """
    modules = {_module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    deps.add(target)
                continue
            source = node.module or ""
            if node.level:  # relative: resolve against the importing module's package
                anchor = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                source = ".".join(anchor[:len(anchor) - node.level + 1] + ([node.module] if node.module else []))
            if source in modules:
                deps.update(f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names)
        graph[name] = deps - {name, ""}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def without_delegation(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the edges from a package to its own private modules (`pkg` -> `pkg._codec`).

    A package may hand its work to its private implementation, which reads the package's types: `ckpt_viz.trace`
    defines `Trace`, whose `save` calls `ckpt_viz.trace._codec` (at call time), which builds a `Trace` (issue 26's
    shape). Every other edge stays, so a cycle through any other module is still one.
    """
    def delegates(module: str, dep: str) -> bool:
        head, _, last = dep.rpartition(".")
        return head == module and last.startswith("_")

    return {module: {d for d in deps if not delegates(module, d)} for module, deps in graph.items()}


def test_no_import_cycles() -> None:
    graph = import_graph(ROOT, "ckpt_viz")
    assert "ckpt_viz.trace._codec" in graph["ckpt_viz.trace"]  # the graph is real: Trace.save calls the codec
    assert cycles(without_delegation(graph)) == []


def test_contracting_private_modules_keeps_every_other_cycle() -> None:
    graph = {"pkg": {"pkg._codec"}, "pkg._codec": {"pkg", "pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a._x"},
             "pkg.a._x": {"pkg.a"}, "pkg.c": {"pkg._codec"}, "pkg.d": {"pkg.d._y"}, "pkg.d._y": {"pkg.e"},
             "pkg.e": {"pkg.d"}}
    assert cycles(graph) == [["pkg", "pkg._codec"], ["pkg.a", "pkg.a._x", "pkg.b"], ["pkg.d", "pkg.d._y", "pkg.e"]]
    assert cycles(without_delegation(graph)) == [["pkg.a", "pkg.a._x", "pkg.b"]]


def test_cycle_check_sees_a_planted_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.a import f\n")
    (pkg / "sub" / "a.py").write_text("from . import b\n\ndef f():\n    return b\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    from pkg.sub import c\n    return c\n")
    (pkg / "sub" / "c.py").write_text("import pkg.sub.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n")
    (pkg / "e.py").write_text("from .sub import a\nfrom . import d\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert graph["pkg.d"] == set() and graph["pkg.e"] == {"pkg.sub.a", "pkg.d"}
    assert cycles(graph) == [["pkg.sub.a", "pkg.sub.b", "pkg.sub.c"]]


# 6. No hand-written C (issue 26, item 4): no source, no compiled module, no compiler run at run time.

C_SUFFIXES = {".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".so", ".pyd"}


def _c_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in C_SUFFIXES)


def _compiler_calls(path: Path) -> list[str]:
    """Calls in `path` that would build C at run time: a compiler named in a call, or a build helper used."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in {"cc", "gcc", "clang",
                                                                                            "c++", "g++"}:
            found.append(f"the compiler {node.value!r}")
        names = _imports(path) if isinstance(node, ast.Module) else set()
        found += [f"import {m}" for m in sorted(names) if m in {"ckpt_viz.cext", "distutils.ccompiler", "setuptools",
                                                               "torch.utils.cpp_extension", "cffi"}]
    return found


def test_the_package_holds_no_c_and_builds_none() -> None:
    assert _c_files(PACKAGE) == []
    assert not (PACKAGE / "cext.py").exists()
    offenders = {str(p.relative_to(ROOT)): _compiler_calls(p) for p in PACKAGE.rglob("*.py") if _compiler_calls(p)}
    assert offenders == {}
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "ext_modules" not in pyproject and "csrc" not in pyproject


def test_c_check_sees_a_violation(tmp_path: Path) -> None:
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "fast.c").write_text("int f(void) { return 0; }\n")
    (tmp_path / "build.py").write_text("import subprocess, cffi\nsubprocess.run(['cc', 'fast.c'])\n")
    assert _c_files(tmp_path) == ["csrc/fast.c"]
    assert sorted(_compiler_calls(tmp_path / "build.py")) == ["import cffi", "the compiler 'cc'"]


# 7. The core names its API: __all__, names from where they are defined, nothing private across packages.


def _defined(path: Path) -> set[str]:
    """The names a module binds at its top level (functions, classes, assignments, also under if/try)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        for sub in ([node] if not isinstance(node, (ast.If, ast.Try)) else list(ast.walk(node))):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, ast.Assign):
                names.update(n.id for t in sub.targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                names.add(sub.target.id)
    return names


def _all_of(path: Path) -> set[str] | None:
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(getattr(t, "id", None) == "__all__" for t in targets) and node.value is not None:
            return set(ast.literal_eval(node.value))
    return None


def name_problems(root: Path, package: str, checked: list[Path]) -> list[str]:
    """Rule 7's offences in the modules `checked` of `package` under `root`."""
    modules = {_module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    problems = []
    for path in checked:
        name = _module_name(path, root)
        home = name if path.name == "__init__.py" else name.rpartition(".")[0]
        if not path.stem.startswith("_") and path.name != "__main__.py" and _all_of(path) is None:
            problems.append(f"{name}: no __all__")
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or _top(node.module or "") != package:
                continue
            source = node.module
            if source not in modules:
                problems.append(f"{name}: from {source}: no such module")
                continue
            parts = source.split(".")
            for i, part in enumerate(parts):
                owner = ".".join(parts[:i])
                if part.startswith("_") and not (home == owner or home.startswith(owner + ".")):
                    problems.append(f"{name}: the private module {source}")
            for alias in node.names:
                submodule = f"{source}.{alias.name}" in modules
                if alias.name.startswith("_") and not (submodule and (home == source or home.startswith(source + "."))):
                    problems.append(f"{name}: the private name {source}.{alias.name}")
                elif (source != package and not submodule and alias.name not in _defined(modules[source])
                      and not (modules[source].name == "__init__.py"
                               and alias.name in (_all_of(modules[source]) or ()))):
                    problems.append(f"{name}: {source}.{alias.name} is defined elsewhere (imported there)")
    return problems


@pytest.mark.parametrize("path", _files(*CORE), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_imports_names_from_where_they_are_defined(path: Path) -> None:
    assert name_problems(ROOT, "ckpt_viz", [path]) == []


def test_name_check_sees_each_offence(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__all__ = []\n")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.a import f\n__all__ = ['f']\n")
    (pkg / "sub" / "a.py").write_text("from pkg.sub import _c\n__all__ = ['f', 'g']\ndef f(): pass\n"
                                      "from pkg.b import h as g\n")
    (pkg / "sub" / "_c.py").write_text("X = 1\n_Y = 2\n")
    (pkg / "b.py").write_text("from pkg.sub.a import g\nfrom pkg.sub._c import X\nfrom pkg.sub import f\n"
                              "from pkg.sub._c import _Y\nfrom pkg.nothing import z\ndef h(): pass\n")
    checked = sorted(pkg.rglob("*.py"))
    assert sorted(name_problems(tmp_path, "pkg", checked)) == [
        "pkg.b: from pkg.nothing: no such module", "pkg.b: no __all__",
        "pkg.b: pkg.sub.a.g is defined elsewhere (imported there)",
        "pkg.b: the private module pkg.sub._c", "pkg.b: the private module pkg.sub._c",
        "pkg.b: the private name pkg.sub._c._Y"]


# 4. The public API is the app's only door into the package: `ckpt_viz.__all__`, and public submodules' `__all__`
#    (`ckpt_viz.analysis.lifecycle`, `ckpt_viz.render.memory`, ...); never a `_private` module or name, the runtime,
#    the probes or torch. A lesson's run.py is the code a student runs (issue 31: a plain training loop, runnable
#    as it is), so it imports torch; the rest of the rule holds for it too.


def _module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _private_uses(path: Path, torch_allowed: bool = False) -> list[str]:
    """Each import in `path` that reaches past the public API, or imports torch (unless `torch_allowed`)."""
    bad = []
    torch = "" if torch_allowed else "torch"

    def closed(module: str) -> bool:
        return (any(part.startswith("_") for part in module.split(".")) or _module_path(module) is None
                or module.startswith(("ckpt_viz.runtime", "ckpt_viz.probe")))

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            bad += [f"import {a.name}" for a in node.names
                    if _top(a.name) == torch or (a.name.startswith("ckpt_viz.") and closed(a.name))]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module = node.module
            if module == "ckpt_viz":
                bad += [f"from ckpt_viz import {a.name}" for a in node.names if a.name not in ckpt_viz.__all__
                        and (a.name.startswith("_") or _module_path(f"ckpt_viz.{a.name}") is None)]
            elif _top(module) == torch or (_top(module) == "ckpt_viz" and closed(module)):
                bad.append(f"from {module} import {', '.join(a.name for a in node.names)}")
            elif _top(module) == "ckpt_viz":
                public = _all_of(_module_path(module)) or set()  # type: ignore[arg-type]
                names = [a.name for a in node.names
                         if a.name not in public and _module_path(f"{module}.{a.name}") is None]
                if names:
                    bad.append(f"from {module} import {', '.join(names)} (not in its __all__)")
    return bad


def test_app_imports_only_public_names() -> None:
    assert ROOT / "app" / "streamlit_app.py" in CLIENTS
    lessons = ROOT / "lessons"
    uses = {p: _private_uses(p, torch_allowed=p.is_relative_to(lessons)) for p in CLIENTS}
    offenders = {str(p.relative_to(ROOT)): found for p, found in uses.items() if found}
    assert not offenders, f"import these from a public module that lists them in __all__: {offenders}"


def test_public_name_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "page.py"
    bad.write_text("import ckpt_viz\nfrom ckpt_viz import Trace, _LAZY, analysis\n"
                   "from ckpt_viz.analysis.lifecycle import lifecycle, _WAITING\nimport ckpt_viz.analysis.summary\n"
                   "from ckpt_viz.trace._codec import load\nimport ckpt_viz.runtime.session\nimport torch.nn\n\n"
                   "def f():\n    from ckpt_viz.probe.graph import capture_graph\n"
                   "    from ckpt_viz.analysis import lifecycle\n    from ckpt_viz.nothing import x\n")
    assert _private_uses(bad) == [
        "from ckpt_viz import _LAZY", "from ckpt_viz.analysis.lifecycle import _WAITING (not in its __all__)",
        "from ckpt_viz.trace._codec import load", "import ckpt_viz.runtime.session", "import torch.nn",
        "from ckpt_viz.probe.graph import capture_graph", "from ckpt_viz.nothing import x"]
    # a lesson's run.py may import torch; the rest still counts
    assert _private_uses(bad, torch_allowed=True) == [
        u for u in _private_uses(bad) if u != "import torch.nn"]


def test_importing_the_package_loads_neither_torch_nor_a_chart_library() -> None:
    # ckpt_viz.usermodel.sandbox too: it runs as `python -m ckpt_viz.usermodel.sandbox`, which warns when
    # the package imported it first.
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
    for name in ckpt_viz._SUBMODULES:  # `ckpt_viz.hf`, `ckpt_viz.pipelining`: the submodule itself
        assert getattr(ckpt_viz, name) is importlib.import_module(f"ckpt_viz.{name}"), name
    assert ckpt_viz.diagnose is importlib.import_module("ckpt_viz.analysis.diagnosis").diagnose
    assert set(ckpt_viz.__all__) <= set(dir(ckpt_viz))
    with pytest.raises(AttributeError, match="has no attribute 'render_nothing'"):
        ckpt_viz.render_nothing  # noqa: B018


def _public_namespace(code: str = "import ckpt_viz") -> tuple[list[str], list[str]]:
    """In a fresh interpreter after `code`: (the names a user reaches as `ckpt_viz.<name>`, `ckpt_viz.__all__`).

    The names are those `dir(ckpt_viz)` lists that do not start with `_`, less the package's own submodules that
    importing it binds as a side effect (`ckpt_viz.bus`, `ckpt_viz.trace`, ...), plus the names it loads lazily
    (`_LAZY`, and `_SUBMODULES`: `ckpt_viz.hf`, `ckpt_viz.pipelining`). Nothing lazy is touched, so torch stays out.
    """
    probe = (f"{code}\nimport json, types\nbound = vars(ckpt_viz)\n"
             "lazy = set(ckpt_viz._LAZY) | set(ckpt_viz._SUBMODULES)\n"
             "own = lambda v: isinstance(v, types.ModuleType) and v.__name__.startswith('ckpt_viz.')\n"
             "names = [n for n in dir(ckpt_viz) if not n.startswith('_')\n"
             "         and (n in lazy or (n in bound and not own(bound[n])))]\n"
             "print(json.dumps([sorted(names), sorted(ckpt_viz.__all__)]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    names, listed = json.loads(proc.stdout)
    return names, listed


def test_all_is_the_public_namespace() -> None:
    # httpx's check: what a user can reach at the top is exactly what __all__ promises. A helper imported at the top
    # of ckpt_viz/__init__.py (`TYPE_CHECKING`, `Any`, `importlib`, even `annotations` of `from __future__`) is
    # reachable as `ckpt_viz.Any`: bind it under a `_` name, or do without it.
    names, listed = _public_namespace()
    assert not set(names) - set(listed), f"public but not in __all__: {sorted(set(names) - set(listed))}"
    assert not set(listed) - set(names), f"in __all__ but not reachable: {sorted(set(listed) - set(names))}"


def test_public_namespace_check_sees_a_leak() -> None:
    names, listed = _public_namespace("import ckpt_viz, typing\nckpt_viz.Leak = typing.Any\nckpt_viz._ok = 1")
    assert "Leak" in names and "Leak" not in listed and "_ok" not in names
    assert "bus" not in names and "record" in names and "hf" in names  # a side-effect submodule; a lazy one


def test_all_is_sorted_and_lists_every_lazy_name() -> None:
    names = ckpt_viz.__all__
    kind = lambda n: 0 if n.isupper() else 1 if n[0].isupper() else 2  # noqa: E731  CONSTANTS, Classes, functions
    assert names == sorted(set(names), key=lambda n: (kind(n), n))
    assert set(ckpt_viz._LAZY) <= set(names)
    # The TYPE_CHECKING block spells out the lazy names for type checkers: it must match _LAZY.
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in (getattr(n.test, "id", ""),
                                                                         getattr(n.test, "attr", "")))
    spelled = {a.name: n.module for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert spelled == {**ckpt_viz._LAZY, **dict.fromkeys(ckpt_viz._SUBMODULES, "ckpt_viz")}
