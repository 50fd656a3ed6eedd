"""The suite's own bookkeeping: the `slow` list in tests/conftest.py names tests that exist; markers are registered."""
from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import SLOW, TESTS


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def test_every_slow_entry_names_a_test_that_exists() -> None:
    missing = {where: sorted(names - _test_functions(TESTS / where)) for where, names in SLOW.items()
               if not (TESTS / where).exists() or names - _test_functions(TESTS / where)}
    assert not missing, f"tests/conftest.py SLOW names tests that no longer exist (rename or remove them): {missing}"


def test_the_inner_loop_markers_are_registered(pytestconfig: pytest.Config) -> None:
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert {"slow", "browser", "gpu", "serial"} <= registered  # serial: scripts/test.sh runs those alone, last
    assert "--strict-markers" in pytestconfig.getini("addopts")  # a misspelt marker fails, not selects nothing


def test_each_test_has_a_private_temp_folder(private_tempdir: Path) -> None:
    # What makes the sandbox tests immune to other processes' `ckpt_viz_sandbox_*` folders in /tmp.
    assert tempfile.gettempdir() == str(private_tempdir) and private_tempdir.is_dir()
    assert Path(tempfile.mkdtemp(prefix="ckpt_viz_sandbox_")).parent == private_tempdir
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == str(private_tempdir)
