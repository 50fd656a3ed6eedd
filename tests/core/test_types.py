"""The type check of the torch-free core (issue 27, item 3): its configuration covers the core.

`.ci/run` runs `.venv/bin/mypy`, which reads `[tool.mypy]` in pyproject.toml. These tests keep that check from
drifting: every module tests/core/test_layering.py calls torch-free (`TORCH_FREE`) is in mypy's `files`, so a new
core module cannot escape the check; every entry there exists; the check stays strict, with no global
`ignore_missing_imports`; and CI runs it.
"""
from __future__ import annotations

from pathlib import Path

import tomllib
from test_layering import PACKAGE, ROOT, TORCH_FREE, _files

CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def _uncovered(checked: list[str], modules: list[Path], root: Path) -> list[str]:
    """The modules (paths) that no entry of `checked` (files or folders relative to `root`) covers."""
    entries = [(root / entry).resolve() for entry in checked]
    return [str(m.relative_to(root)) for m in modules
            if not any(m.resolve() == e or e in m.resolve().parents for e in entries)]


def test_mypy_checks_every_torch_free_module() -> None:
    missing = _uncovered(CONFIG["files"], _files(*TORCH_FREE), ROOT)
    assert not missing, (f"[tool.mypy] files in pyproject.toml leaves out torch-free modules {missing}; "
                         "add them (or their folder) there")


def test_every_checked_path_exists() -> None:
    gone = [entry for entry in CONFIG["files"] if not (ROOT / entry).exists()]
    assert not gone, f"[tool.mypy] files names paths that do not exist: {gone}"
    assert all((ROOT / entry).resolve().is_relative_to(PACKAGE) for entry in CONFIG["files"])


def test_the_check_is_strict_and_ignores_only_named_modules() -> None:
    assert CONFIG["strict"] is True and CONFIG["warn_unreachable"] is True
    assert "ignore_missing_imports" not in CONFIG  # no global switch: one override per library without types
    assert "disable_error_code" not in CONFIG
    for override in CONFIG.get("overrides", []):
        modules = [override["module"]] if isinstance(override["module"], str) else override["module"]
        assert not any(m.startswith("ckpt_viz") for m in modules) or set(override) <= {"module", "warn_return_any"}, (
            f"an override for our own modules may only relax warn_return_any (altair's Any): {override}")


def test_ci_runs_the_check() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".venv/bin/mypy || status=" in ci  # always runs; its failure fails CI


def test_coverage_check_sees_a_module_left_out(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    modules = [tmp_path / "pkg" / "a.py", tmp_path / "pkg" / "sub" / "b.py", tmp_path / "pkg" / "c.py"]
    for m in modules:
        m.write_text("")
    assert _uncovered(["pkg/a.py", "pkg/sub"], modules, tmp_path) == ["pkg/c.py"]
    assert _uncovered(["pkg"], modules, tmp_path) == []
    assert _uncovered([], modules, tmp_path) == ["pkg/a.py", "pkg/sub/b.py", "pkg/c.py"]
