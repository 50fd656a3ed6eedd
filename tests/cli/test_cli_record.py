"""`ckpt-viz record` gets its trace through `obtain_trace`, as the app's loader does, for both model sources."""
from __future__ import annotations

from pathlib import Path

import msgspec

from ckpt_viz.cli import main
from ckpt_viz.run.obtain import RunRequest, obtain_trace
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = f"{ROOT / 'examples' / 'user_model.py'}:make_model"


def _facts(trace: Trace) -> list[tuple]:
    """Every field of every event but its time and thread."""
    return [msgspec.structs.replace(e, t_ns=0, thread_id=0) for e in trace.events]


def test_record_of_a_built_in_model_is_the_obtain_trace_run(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert main(["record", "dropout", "--mode", "split-nonreentrant", "--seed", "3", "-o", str(out)]) == 0
    written = Trace.load(out)
    expected = obtain_trace(RunRequest("builtin", "dropout", mode="split-nonreentrant", seed=3))
    assert _facts(written) == _facts(expected)
    assert [m.bytes_by_category for m in written.memory] == [m.bytes_by_category for m in expected.memory]
    assert written.meta["seed"] == 3 and written.meta["grad_sha256"] == expected.meta["grad_sha256"]


def test_record_of_a_model_file_runs_it_in_the_sandbox(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert main(["record", EXAMPLE, "--mode", "reentrant", "--no-graphs", "-o", str(out)]) == 0
    written = Trace.load(out)
    assert written.meta["sandbox"]["ref"] == EXAMPLE and written.count("handle_created") == 3
    assert written.memory and not written.graphs
