"""The native allocation log: what `record(memory=True)` reads, its build, its fallback to the tracker, and the
user's own torch.profiler running beside it (probe/native.py, NOTE [ Native log ])."""
from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import ckpt_viz
from ckpt_viz.probe import native
from ckpt_viz.probe.allocations import AllocationProbe, open_probe
from ckpt_viz.probe.memory import MemoryProbe
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the native log wraps the CPU allocator only")


def _readings(trace: Any) -> list[tuple]:
    return [(m.seq, m.bytes_by_category, m.by_stage) for m in trace.memory]


def _probe_kinds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import ckpt_viz.probe.allocations as allocations

    kinds: list[str] = []
    original = allocations.open_probe

    def counting(*args: Any, **kwargs: Any) -> Any:
        probe = original(*args, **kwargs)
        kinds.append(type(probe).__name__)
        return probe

    monkeypatch.setattr(allocations, "open_probe", counting)
    return kinds


def test_record_memory_reads_the_native_log_and_the_tracker_where_it_cannot_load(monkeypatch: pytest.MonkeyPatch,
                                                                                  capsys: Any, tmp_path: Any) -> None:
    kinds = _probe_kinds(monkeypatch)
    fast = run_scenario(build_builtin("transformer"), "split-reentrant", memory=True)
    assert kinds == ["AllocationProbe"] and native.library() is not None
    # No compiler and nothing cached: the build fails, says so, and memory=True records with the tracker.
    monkeypatch.setattr(native, "_library", [])
    monkeypatch.setenv("CKPT_VIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_account_cache", lambda: tmp_path)
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    slow = run_scenario(build_builtin("transformer"), "split-reentrant", memory=True)
    assert kinds == ["AllocationProbe", "MemoryProbe"]
    assert "native allocation log is not available" in capsys.readouterr().err
    assert _readings(slow) == _readings(fast) and fast.memory


def test_a_child_whose_home_moved_reads_the_accounts_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    built = native.library().path  # the account's home holds the build (as it does where no cache is set)
    monkeypatch.setattr(native, "_account_cache", lambda: built.parent.parent)
    monkeypatch.delenv("CKPT_VIZ_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/g++")  # a build would fail
    monkeypatch.setattr(native, "_library", [])
    assert native.library() is not None and not any(tmp_path.iterdir())


def test_the_log_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_VIZ_NATIVE", "0")
    assert isinstance(open_probe(params=[torch.nn.Parameter(torch.ones(2))]), MemoryProbe)


def test_a_build_goes_to_the_cache_and_says_so(tmp_path: Any, capsys: Any) -> None:
    target = tmp_path / "native" / "alloc_log.so"
    native._build(target)  # built only: a second copy loaded in this process would wrap the first
    assert target.stat().st_size > 0 and list(target.parent.iterdir()) == [target]
    assert "building the native allocation log once" in capsys.readouterr().err


def test_the_users_torch_profiler_runs_while_memory_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = _probe_kinds(monkeypatch)
    alone = run_scenario(build_builtin("mlp"), "reentrant", memory=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        profiled = run_scenario(build_builtin("mlp"), "reentrant", memory=True)
    assert kinds == ["AllocationProbe", "AllocationProbe"]
    names = {event.key for event in prof.key_averages()}
    assert "aten::addmm" in names or "aten::mm" in names  # the user's profile saw the ops
    assert any(event.cpu_memory_usage for event in prof.key_averages())  # and their memory
    assert _readings(profiled) == _readings(alone)


def test_a_free_on_another_thread_is_read() -> None:
    w = torch.nn.Parameter(torch.ones(2))
    probe = open_probe(params=[w])
    assert isinstance(probe, AllocationProbe)
    with probe:
        probe.mark(0, 0)
        box = [torch.ones(1024)]  # 4 KiB made here
        probe.mark(1, 0)
        worker = threading.Thread(target=box.clear)  # and freed there
        worker.start()
        worker.join()
        probe.mark(2, 0)
    others = [s.bytes_by_category["other"] for s in probe.finish()]
    assert others[1] - others[0] == 4096 and others[2] == others[0]


def test_recording_memory_without_a_model_still_uses_the_tracker() -> None:
    x = torch.ones(3, requires_grad=True)
    with ckpt_viz.record(memory=True) as rec:
        probe = rec._probe
        (x * 2).sum().backward()
    assert isinstance(probe, MemoryProbe)  # it finds parameters as ops read them (allocations.py NOTE rule 3a)
