"""`import ckpt_viz` makes `ckpt_viz.pipelining` and `ckpt_viz.hf` reachable, and still imports no torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_submodules_load_on_first_access_after_a_torch_free_import() -> None:
    code = ("import sys, ckpt_viz\n"
            "assert 'torch' not in sys.modules and 'ckpt_viz.pipelining' not in sys.modules\n"
            "assert {'hf', 'pipelining'} <= set(dir(ckpt_viz))\n"
            "stage = ckpt_viz.pipelining.PipelineStage\n"
            "assert ckpt_viz.pipelining is sys.modules['ckpt_viz.pipelining'] and 'torch' in sys.modules\n"
            "assert ckpt_viz.hf.enable is sys.modules['ckpt_viz.hf'].enable\n"
            "print(stage.__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "PipelineStage"


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    import pytest

    import ckpt_viz

    with pytest.raises(AttributeError, match="has no attribute 'pipelinin'"):
        ckpt_viz.pipelinin  # noqa: B018
