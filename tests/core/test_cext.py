"""ckpt_viz.cext: a C file of ours built with the real compiler, imported, cached; None where it cannot be."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_viz import cext

_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *arg) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(2 * v);
}
static PyMethodDef methods[] = {{"twice", twice, METH_O, "2 * n"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "%s", NULL, -1, methods};
PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&module); }
"""


def _source(folder: Path, name: str) -> Path:
    path = folder / f"{name}.c"
    path.write_text(_SOURCE % (name, name))
    return path


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_VIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cext, "account_cache", lambda: tmp_path / "account")
    monkeypatch.setattr(cext, "_TRIED", {})
    return tmp_path


def test_builds_imports_and_caches_a_module(fresh, capfd):
    module = cext.extension(_source(fresh, "_cext_probe_a"))
    assert module is not None and module.twice(21) == 42
    built = list((fresh / "cache" / "native").glob("_cext_probe_a-*.so"))
    assert len(built) == 1
    assert "building the C speed-up _cext_probe_a.c" in capfd.readouterr().err
    assert cext.extension(fresh / "_cext_probe_a.c") is module  # once per process


def test_a_built_module_is_used_without_a_compiler(fresh, monkeypatch):
    source = _source(fresh, "_cext_probe_b")
    code = ("import sys; from pathlib import Path; from ckpt_viz import cext; "
            "m = cext.extension(Path(sys.argv[1])); print(m.twice(5) if m else None)")
    env = {**os.environ, "CKPT_VIZ_CACHE": str(fresh / "cache")}
    first = subprocess.run([sys.executable, "-c", code, str(source)], env=env, capture_output=True, text=True)
    assert first.stdout.strip() == "10", first.stderr
    again = subprocess.run([sys.executable, "-c", code, str(source)], env={**env, "CC": "/bin/false"},
                           capture_output=True, text=True)
    assert again.stdout.strip() == "10" and "building" not in again.stderr


def test_none_when_the_build_fails_or_is_turned_off(fresh, monkeypatch, capfd):
    source = _source(fresh, "_cext_probe_c")
    monkeypatch.setenv("CC", "/bin/false")
    assert cext.extension(source) is None
    assert "the C speed-up _cext_probe_c.c is not available" in capfd.readouterr().err
    monkeypatch.delenv("CC")
    monkeypatch.setattr(cext, "_TRIED", {})
    monkeypatch.setenv("CKPT_VIZ_CEXT", "0")
    assert cext.extension(source) is None
    assert not list((fresh / "cache").glob("native/_cext_probe_c-*.so"))  # neither try left a module


def test_a_source_that_does_not_compile_is_none_with_the_compiler_message(fresh, capfd):
    broken = fresh / "_cext_probe_d.c"
    broken.write_text("this is not C;\n")
    assert cext.extension(broken) is None
    assert "failed" in capfd.readouterr().err
