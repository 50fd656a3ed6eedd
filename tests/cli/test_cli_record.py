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
    """Every field of every event but its time, thread and site (the caller's line: each call is on its own)."""
    return [msgspec.structs.replace(e, t_ns=0, thread_id=0, site=None) for e in trace.events]


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


def test_record_help_shows_every_default(capsys) -> None:
    import argparse

    import pytest

    from ckpt_viz.cli import build_parser

    with pytest.raises(SystemExit):
        main(["record", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    record = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "record")[1]
    options = [a for a in record._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    assert {a.dest for a in options} >= {"mode", "output", "timeout", "memory_mb", "seed", "no_memory"}
    for action in options:  # each option's help says its default, in the words a user reads
        assert "default: " in (action.help or ""), action.dest
    assert "(default: 120 s)" in text and "(default: split-reentrant)" in text and "(default: 8192)" in text


SLOW_MODEL = '''
import time
import torch


class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        x = self.a(x)
        while self.calls > 1:  # the load's trial forward passes; the recorded run never ends
            time.sleep(0.01)
        return self.b(x)


def make_model():
    return {"model": Slow(), "inputs": torch.randn(2, 4), "checkpoint": ["a"]}
'''


def test_a_run_stopped_at_its_time_limit_keeps_its_trace_marked_partial(tmp_path: Path, capsys) -> None:
    model = tmp_path / "slow_model.py"
    model.write_text(SLOW_MODEL)
    out = tmp_path / "t.json"
    assert main(["record", f"{model}:make_model", "--mode", "reentrant", "--timeout", "25", "--no-graphs",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    # the tip names the flag the user typed, with this run's value
    tip = err.strip().splitlines()[-1]
    assert tip.startswith("Tip: ") and "pass a larger --timeout" in tip and tip.endswith("(this run: --timeout 25)")
    assert "timeout_s" not in err
    assert f"The trace recorded until then is in {out}" in err
    trace = Trace.load(out)  # what it had: the handle of block `a`, its forward; the error that stopped it
    assert trace.meta["partial"] is True and "stopped at its time limit of 25 s" in trace.meta["partial_reason"]
    assert [e.function for e in trace.of_kind("handle_created")] == ["a"]
    assert trace.of_kind("error")[-1].type == "TimeLimitReached"
    from ckpt_viz.cli.info import summarize

    text = summarize(trace)
    assert "partial: the run of mode 'reentrant' was stopped at its time limit of 25 s" in text
    # a partial run is never said clean (NOTE [ Nothing said clean that is not ] in ckpt_viz/analysis/diagnosis.py)
    assert "problems: none" not in text and ": run_partial: The trace is partial: it stopped early" in text
