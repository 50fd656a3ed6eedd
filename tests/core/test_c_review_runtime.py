"""REVIEW's adversarial tests of the bus/owners C (ckpt_viz/csrc; NOTE [ C speed-ups ] in ckpt_viz/cext.py).

The memory-safety reproducers run in a child under PYTHONMALLOC=debug, so a crash fails the test, not pytest.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckpt_viz import cext

ROOT = Path(__file__).resolve().parents[2]
_OWNERS = ROOT / "ckpt_viz" / "csrc" / "ownersfast.c"
needs_c = pytest.mark.skipif(cext.extension(_OWNERS) is None, reason="no C compiler")

_PRELUDE = """
import weakref
from pathlib import Path
from ckpt_viz import cext
m = cext.extension(Path("ckpt_viz/csrc/ownersfast.c"))
class Mod:
    def __init__(self):
        self._parameters, self._buffers, self._modules = {}, {}, {}
class Facts:
    __slots__ = ("submodules", "signature", "params")
"""


def _child(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONMALLOC": "debug", "PYTHONFAULTHANDLER": "1"}
    return subprocess.run([sys.executable, "-X", "dev", "-c", _PRELUDE + textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@needs_c
def test_signature_dict_grown_meanwhile_no_overflow():
    done = _child("""
        class Grower(Mod):
            def __getattribute__(self, name):
                if name == "_modules":
                    for i in range(2000):
                        root._parameters[i] = object()
                return object.__getattribute__(self, name)
        root, sub = Mod(), Grower()
        f = Facts(); f.submodules = (sub,); f.signature = ()
        print(m.current_facts((weakref.ref(root), f), root))
    """)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]


@needs_c
def test_captured_states_entry_removed_meanwhile_no_use_after_free():
    done = _child("""
        cache = {}
        class Owner(Mod):
            def __getattribute__(self, name):
                if name == "_parameters":
                    cache.clear()  # as another thread's cache update could while the GIL is released
                return object.__getattribute__(self, name)
        owner = Owner()
        d = [object.__getattribute__(owner, n) for n in ("_parameters", "_buffers", "_modules")]
        f = Facts(); f.submodules = (); f.params = ()
        f.signature = (*map(id, d), *map(len, d))
        cache[id(owner)] = (weakref.ref(owner), f)
        del f
        print(m.captured_states(cache, Mod, owner))
    """)
    assert done.returncode == 0 and done.stdout.strip() in ("None", "((), (), ())"), done.stderr[-2000:]


@needs_c
def test_signature_unchanged_tree_is_current():
    done = _child("""
        root, sub = Mod(), Mod()
        root._parameters["w"] = object(); sub._buffers["b"] = object()
        ds = [getattr(x, n) for x in (root, sub) for n in ("_parameters", "_buffers", "_modules")]
        f = Facts(); f.submodules = (sub,)
        f.signature = (*map(id, ds), *map(len, ds), *(id(v) for d in ds for v in d.values()))
        print(m.current_facts((weakref.ref(root), f), root) is f)
    """)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


def test_emit_for_scope_keyword_like_python():
    from ckpt_viz import bus

    class Handle:
        handle_id, mode, phase, session_id, _story = 1, None, None, None, None

    was_c = bus.emit_for is not bus._emit_for_py
    if not bus.use_native(True):
        pytest.skip("no C compiler")
    try:
        assert bus.emit_for(Handle(), "released", None, False, {}, scope=None) is None  # nobody listens
    finally:
        bus.use_native(was_c)
