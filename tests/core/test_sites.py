"""Call sites are the user's line: NOTE [ The user's line ] in ckpt_viz/sites.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_viz import sites

ROOT = Path(__file__).resolve().parent.parent.parent
LIBRARY = "def site():\n    return sites.call_site(1)\n\n\ndef run(fn):\n    return fn()\n"


def _package(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("from ckpt_viz import sites\n\n" + LIBRARY)
    return folder


def test_skip_package_moves_the_site_out_of_that_package_to_the_users_line(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _package(tmp_path, "ckvz_helperlib")
    monkeypatch.syspath_prepend(str(tmp_path))
    import ckvz_helperlib  # type: ignore[import-not-found]

    before = ckvz_helperlib.run(ckvz_helperlib.site)  # its own line: a package like any other, until named
    assert before.endswith("ckvz_helperlib/__init__.py:4")
    sites.skip_package("ckvz_helperlib")
    here = sys._getframe().f_lineno + 1
    after = ckvz_helperlib.run(ckvz_helperlib.site)
    assert after.endswith(f"test_sites.py:{here}"), after


def test_with_no_user_line_on_the_stack_the_innermost_library_line_is_the_site(tmp_path: Path) -> None:
    """A stack of library frames only (here: `python -c`, whose code has no file) names the library's line."""
    _package(tmp_path, "ckvz_onlylib")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ckvz_onlylib; "
            "print(ckvz_onlylib.run(ckvz_onlylib.site))")
    env = {**os.environ, "CKPT_VIZ_SKIP_PACKAGES": "ckvz_onlylib", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ckvz_onlylib/__init__.py:4"  # the innermost library line (rule 2)


def test_the_environment_variable_names_packages_for_a_whole_process(tmp_path: Path) -> None:
    _package(tmp_path, "ckvz_envlib")
    (tmp_path / "user.py").write_text("import ckvz_envlib\nprint(ckvz_envlib.run(ckvz_envlib.site))\n")
    env = {**os.environ, "CKPT_VIZ_SKIP_PACKAGES": " ckvz_envlib, other ", "PYTHONPATH": f"{ROOT}:{tmp_path}"}
    done = subprocess.run([sys.executable, "user.py"], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "user.py:2"


def test_skip_package_refuses_a_dotted_or_empty_name() -> None:
    for bad in ("torch.utils", "", 3):
        with pytest.raises(ValueError, match=r"^ckpt_viz.sites.skip_package: expected a top-level package name") \
                as info:
            sites.skip_package(bad)  # type: ignore[arg-type]
        assert str(info.value).splitlines()[-1].startswith("Tip: ")


def test_ckpt_viz_torch_and_transformers_files_are_never_the_users() -> None:
    import torch
    import transformers.modeling_layers

    import ckpt_viz.pipelining

    assert sites._kind(torch.__file__) is sites._SKIP
    assert sites._kind(transformers.modeling_layers.__file__) is sites._SKIP  # the wrapper that calls checkpoint
    assert sites._kind(transformers.__file__) is sites._LIBRARY
    assert sites._kind(ckpt_viz.pipelining.__file__) is sites._LIBRARY
    assert sites._kind(os.__file__) is sites._LIBRARY  # the standard library
    assert sites._kind(str(ROOT / "ckpt_viz" / "run" / "zoo.py")) is sites._USER  # the built-in demo models
    assert sites._kind(__file__) is sites._USER
