"""examples/train_hf.py: the lines a user adds to their own HF loop (marked `# ckpt_viz`), run as a user runs it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from ckpt_viz.cli.info import summarize
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "examples" / "train_hf.py"


def test_the_example_adds_ten_lines_at_most() -> None:
    added = [line for line in EXAMPLE.read_text().splitlines() if line.rstrip().endswith("# ckpt_viz")]
    assert 1 <= len(added) <= 10, added
    assert any("ckpt_viz.record(" in line for line in added) and any(".save(" in line for line in added)


def test_the_example_records_each_step_of_the_loop(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--out", str(tmp_path), "--steps", "2"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["step 0", "step 1"]
    for step in range(2):
        trace = Trace.load(tmp_path / f"step-{step}.json")
        created = trace.of_kind("handle_created")
        assert [e.label for e in created] == [f"model.layers.{k}" for k in range(4)]
        assert {(e.mode, e.runtime) for e in created} == {("nonreentrant", "torch")}
        assert trace.count("replay_started") == 4 and trace.count("released") == 4 and trace.memory
        # the site is the loop's own line in the example, not transformers'
        assert {e.site.rpartition(":")[0] for e in created} == {str(EXAMPLE)}
        text = summarize(trace)
        assert text.splitlines()[0] == "model LlamaForCausalLM  mode nonreentrant (torch)"
        assert "problems: none" in text
