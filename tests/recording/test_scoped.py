"""Context-scoped recording: threads, nesting, exit order, hand-over, the autograd watch, names and probes.

A recording receives exactly the events of the code it wraps (bus NOTE [ Recording
scopes ], recording NOTE [ What a recording captures ], rules 5 and 6).
"""
from __future__ import annotations

import contextvars
import gc
import json
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from test_probe_memory import reading_at

import ckpt_viz
from ckpt_viz import bus
from ckpt_viz.errors import CkptVizError
from ckpt_viz.events import PhaseSet
from ckpt_viz.runtime import backward_input, backward_weight, checkpoint, memtags, reentrant_checkpoint_scope
from traces import kinds

ORIGINAL_BACKWARD = torch.autograd.backward
ORIGINAL_GRAD = torch.autograd.grad


class Net(torch.nn.Module):
    def __init__(self, width: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)  # a per-model generator: threads never share RNG draws
        self.a = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
        self.b = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
        self.c = torch.nn.Linear(width, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.x = torch.randn(4, width, generator=g)
        self.x2 = torch.randn(4, width, generator=g).requires_grad_()


def workload(net: Net, sync: Callable[[], None], errors: list[str]) -> None:
    """Ordinary reentrant and non-reentrant checkpoints, a split DX/DW pass, and a caught error naming a handle."""
    # 1. One ordinary backward through a reentrant and a non-reentrant checkpoint.
    h = checkpoint(net.a, net.x, use_reentrant=True)
    h = checkpoint(net.b, h, use_reentrant=False)
    loss = net.c(h).pow(2).sum()
    sync()
    loss.backward()
    del loss, h
    sync()
    # 2. Split reentrant: DX, then DW (net.a's parameters are captured: routing names them).
    with reentrant_checkpoint_scope(list(net.parameters())) as handles:
        out = checkpoint(net.a, net.x2, use_reentrant=True)
    loss2 = out.pow(2).sum()
    backward_input(loss2, None, [net.x2], handles=handles)
    sync()
    backward_weight(loss2, None, list(net.parameters()), handles=handles)
    # 3. DW released the handle: a later set_phase fails with a message that names it (h<id>).
    try:
        handles[0].set_phase("dx")
    except CkptVizError as exc:
        errors.append(str(exc))
    del loss2, out, handles


def recorded(width: int, seed: int, sync: Callable[[], None] = lambda: None) -> tuple[Any, list[str]]:
    net, errors = Net(width, seed), []
    with ckpt_viz.record(memory=True, model=net, tensors=(net.x, net.x2)) as rec:
        workload(net, sync, errors)
    return rec.trace, errors


def facts(trace: Any) -> list[tuple]:
    """Everything but timestamps and the emitting thread."""
    return [msgspec.structs.asdict(msgspec.structs.replace(e, t_ns=0, thread_id=0)) for e in trace.events]


def memory(trace: Any) -> list[tuple]:
    return [(s.seq, dict(s.bytes_by_category), s.by_stage, s.device_allocated) for s in trace.memory]


def memory_at_events(trace: Any) -> list[tuple]:
    """The reading right after each event. Two threads recording memory at once read it with two probes (torch's
    profiler is one thread's: probe/stream.py NOTE rule 1), which agree at every event and sampling point; only
    the allocation stream's adds high-water marks between them."""
    return [(e.seq, dict(reading_at(trace, e.seq).bytes_by_category)) for e in trace.events]


@pytest.fixture
def no_gc():
    """node_collected events fire when a graph is freed: by reference counting (deterministic, on the thread
    that drops it) or by a cyclic collection, which any thread may trigger at any time. With automatic
    collection off, every node_collected event comes from reference counting, so it is compared like any
    other event instead of being excluded."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def assert_clean() -> None:
    assert torch.autograd.backward is ORIGINAL_BACKWARD and torch.autograd.grad is ORIGINAL_GRAD
    assert bus.enabled is False and memtags.enabled is False
    assert bus.current_scope().channels == ()


# ------------------------------------------------------------------ threads

def _on_a_thread_of_its_own(width: int, seed: int) -> tuple[Any, list[str]]:
    """`recorded` run alone on a fresh thread: like the threads below, it numbers handles from h0 whatever this
    thread's earlier tests left alive (handle_ids NOTE [ Handle numbering ], rule 2)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(recorded(width, seed)))
    thread.start()
    thread.join(60)
    assert out, "the solo run failed"
    return out[0]


def test_two_threads_recording_different_models_each_get_their_solo_trace(no_gc) -> None:
    solo = {width: _on_a_thread_of_its_own(width, seed) for width, seed in ((6, 1), (10, 2))}
    barrier = threading.Barrier(2, timeout=30)
    results: dict[int, Any] = {}
    failures: list[BaseException] = []

    def run(width: int, seed: int) -> None:
        try:
            barrier.wait()
            results[width] = recorded(width, seed, sync=barrier.wait)  # both threads reach each step together
        except BaseException as exc:  # surfaced below
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=args) for args in ((6, 1), (10, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    for width in (6, 10):
        (trace, errors), (solo_trace, solo_errors) = results[width], solo[width]
        assert facts(trace) == facts(solo_trace), width
        assert memory_at_events(trace) == memory_at_events(solo_trace), width
        assert errors == solo_errors and len(errors) == 1
        assert len({e.thread_id for e in trace.events}) == 1  # nothing from the other thread
        # The error message names the handle by the id the trace uses.
        refused = [e for e in trace.events if e.kind == "error" and e.where == "set_phase"]
        assert len(refused) == 1 and f"h{refused[0].handle_id}" in errors[0]
        assert [e.seq for e in trace.events] == list(range(len(trace.events)))
        captured = [n.name for e in trace.of_kind("grads_routed") for n in e.captured]
        assert captured and set(captured) <= {"a.0.weight", "a.0.bias"}
    # The two runs really overlapped: each one's steps began before the other's first step ended.
    first = {w: results[w][0].events[0].t_ns for w in results}
    last = {w: results[w][0].events[-1].t_ns for w in results}
    assert first[6] < last[10] and first[10] < last[6]
    assert_clean()


def test_an_unrecorded_thread_builds_no_event_while_another_thread_records(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every event emit builds reads the clock first (one call per event, in both of emit's paths): count them.
    built: list[int] = []
    real_clock = bus._monotonic_ns

    def counting_clock() -> int:
        built.append(threading.get_ident())
        return real_clock()

    monkeypatch.setattr(bus, "_monotonic_ns", counting_clock)
    opened, done = threading.Event(), threading.Event()

    def record_elsewhere() -> None:
        with ckpt_viz.record():
            opened.set()
            done.wait(30)

    other = threading.Thread(target=record_elsewhere)
    other.start()
    assert opened.wait(30) and bus.enabled is True  # someone records somewhere: hook points do call emit
    workload(Net(5, 3), lambda: None, [])
    done.set()
    other.join(30)
    assert threading.get_ident() not in built and built == []
    with ckpt_viz.record() as rec:  # control: a recording here does build them, through the counted clock
        workload(Net(5, 3), lambda: None, [])
    assert len(built) == len(rec.trace.events) > 0 and set(built) == {threading.get_ident()}
    assert_clean()


def test_a_thread_started_inside_a_recording_is_not_in_it_unless_handed_over() -> None:
    def emit_from_thread(handover: Callable[[], Any] | None) -> int:
        def work() -> None:
            if handover is None:
                bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=99, capture_site=False)
            else:
                with handover():
                    bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=99, capture_site=False)
        t = threading.Thread(target=work)
        t.start()
        t.join(30)
        return t.ident

    with ckpt_viz.record() as outer:
        with ckpt_viz.record() as rec:
            bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=1, capture_site=False)
            emit_from_thread(None)  # threads do not inherit the recording
            worker = emit_from_thread(rec.attach)  # handed over explicitly
            bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=2, capture_site=False)
    assert [(e.seq, e.handle_id) for e in rec.trace.events] == [(0, 1), (1, 99), (2, 2)]
    assert rec.trace.events[1].thread_id == worker
    assert [e.handle_id for e in outer.trace.events] == [1, 99, 2]  # the outer sees what was handed to the inner
    with pytest.raises(CkptVizError, match=r"attach: this recording is not open\.\nTip:"):
        rec.attach()
    assert_clean()


def test_events_in_the_engines_launch_context_reach_the_recording() -> None:
    """On CUDA the engine runs backward nodes on a device thread that carries a copy of the caller's context
    in torch's thread-local state (runtime/handover NOTE [ Engine hand-over ]). Here a plain thread carries
    it the same way, by stashing it where the engine's graph task puts it."""
    from ckpt_viz.runtime import handover

    seen: list[Any] = []

    def device_thread(context: contextvars.Context) -> None:
        torch._C._stash_obj_in_tls("context", context)
        try:
            seen.append(handover.launch_context())
            bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=7, capture_site=False)
            handover.carried(lambda: bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=8, capture_site=False))
        finally:
            torch._C._remove_obj_from_tls("context")
        # the graph task is over: nothing carried
        bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=9, capture_site=False)

    with ckpt_viz.record() as rec, ckpt_viz.tag(stage=1):
        launched = contextvars.copy_context()
        t = threading.Thread(target=device_thread, args=(launched,))
        t.start()
        t.join(30)
    assert seen == [launched]
    assert [(e.handle_id, dict(e.tags)) for e in rec.trace.events] == [(7, {"stage": 1}), (8, {"stage": 1})]
    assert_clean()


def test_node_collected_goes_to_the_recording_that_saw_the_handle_created(no_gc) -> None:
    """Whichever thread drops a graph runs its node's callback; the event still belongs to the handle's recording."""
    w = torch.randn(3, 3, requires_grad=True)
    held: list[Any] = []
    dropped = threading.Event()
    theirs: list[Any] = []

    def drop_elsewhere() -> None:
        with ckpt_viz.record() as other:
            held.pop()  # the last reference to the graph: its node is collected on this thread
            dropped.set()
        theirs.append(other)

    with ckpt_viz.record() as rec:
        held.append(checkpoint(lambda t: torch.tanh(t @ w), torch.randn(2, 3), use_reentrant=True))
        t = threading.Thread(target=drop_elsewhere)
        t.start()
        t.join(30)
    assert dropped.is_set()
    assert kinds(rec.trace) == ["handle_created", "forward_started", "forward_finished", "node_collected"]
    assert kinds(theirs[0].trace) == []
    assert_clean()


@pytest.mark.gpu
def test_cuda_backward_on_device_threads_reaches_the_recording(no_gc) -> None:
    """On CUDA the engine runs the checkpoints' backward on its device thread (skipped without a GPU)."""
    def run(device: str) -> Any:
        net = Net(8, 4).to(device)
        net.x, net.x2 = net.x.to(device), net.x2.detach().to(device).requires_grad_()
        with ckpt_viz.record(memory=True, model=net) as rec:
            workload(net, lambda: None, [])
        return rec.trace

    cpu, cuda = run("cpu"), run("cuda")
    # The device thread may drop a graph's last reference at another point than the calling thread does,
    # so node_collected events are compared by count, every other event in order.
    def ordered(trace: Any) -> list[tuple]:
        return [(e.kind, e.handle_id, e.phase) for e in trace.events if e.kind != "node_collected"]

    assert ordered(cuda) == ordered(cpu) and cuda.count("node_collected") == cpu.count("node_collected")
    assert {e.thread_id for e in cuda.events} - {threading.get_ident()}  # some came from a device thread
    assert cuda.memory and any(s.device_allocated for s in cuda.memory)
    assert_clean()


# ------------------------------------------------------------------ nesting and exit order

def test_nested_recordings_inner_sees_its_own_events_outer_sees_both() -> None:
    with ckpt_viz.record() as outer:
        bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=0, capture_site=False)
        with ckpt_viz.record() as inner:
            bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=1, capture_site=False)
            bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=2, capture_site=False)
        bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=3, capture_site=False)
    assert [(e.seq, e.handle_id) for e in inner.trace.events] == [(0, 1), (1, 2)]
    assert [(e.seq, e.handle_id) for e in outer.trace.events] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert_clean()


def test_nested_recording_of_a_real_run_matches_the_solo_runs(no_gc) -> None:
    net = Net(6, 5)
    with ckpt_viz.record(model=net) as solo:
        workload(net, lambda: None, [])
    net = Net(6, 5)
    with ckpt_viz.record(model=net) as outer, ckpt_viz.record(model=net) as inner:
        workload(net, lambda: None, [])
    assert facts(outer.trace) == facts(inner.trace) == facts(solo.trace)
    assert all(not hasattr(p, "_ckpt_viz_name") for p in net.parameters())
    assert_clean()


def test_closing_out_of_order_corrupts_nothing() -> None:
    first, second = ckpt_viz.record(graphs=True), ckpt_viz.record(memory=True)
    first.__enter__()
    second.__enter__()
    bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=1, capture_site=False)
    first.__exit__(None, None, None)  # the outer closes first
    assert torch.autograd.backward is not ORIGINAL_BACKWARD  # `second` still watches
    bus.emit(PhaseSet, old="ordinary", new="dx", handle_id=2, capture_site=False)
    w = torch.randn(3, 3, requires_grad=True)
    checkpoint(lambda t: torch.tanh(t @ w), torch.randn(2, 3), use_reentrant=True).sum().backward()
    second.__exit__(None, None, None)
    assert [e.handle_id for e in first.trace.events] == [1]
    assert first.trace.graphs == []  # closed: the backward above was not snapshotted for it
    assert kinds(second.trace)[:2] == ["phase_set", "phase_set"] and "released" in kinds(second.trace)
    assert [e.seq for e in second.trace.events] == list(range(len(second.trace.events)))
    assert any(s.bytes_by_category["checkpoint_inputs"] > 0 for s in second.trace.memory)  # its probe still counts
    assert_clean()
    with ckpt_viz.record() as again:  # a new recording starts from seq 0 with nothing left over
        bus.emit(PhaseSet, old="ordinary", new="dx", capture_site=False)
    assert [e.seq for e in again.trace.events] == [0]
    with pytest.raises(CkptVizError, match="already closed"):
        second.__enter__()
    assert_clean()


def test_an_exception_escaping_nested_recordings_is_reported_once_to_each() -> None:
    with pytest.raises(KeyError):
        with ckpt_viz.record(memory=True, graphs=True) as outer:
            with ckpt_viz.record(memory=True) as inner:
                bus.emit(PhaseSet, old="ordinary", new="dx", capture_site=False)
                raise KeyError("user bug")
    for rec in (outer, inner):
        assert kinds(rec.trace) == ["phase_set", "error"]
        assert rec.trace.events[-1].where == "record" and rec.trace.events[-1].seq == 1
    assert_clean()


# ------------------------------------------------------------------ the autograd watch

def test_autograd_is_watched_once_while_recordings_are_open_and_restored_after() -> None:
    with ckpt_viz.record():
        watched = torch.autograd.backward
        assert watched is not ORIGINAL_BACKWARD
        with ckpt_viz.record():
            assert torch.autograd.backward is watched  # installed once, not wrapped again
        assert torch.autograd.backward is watched
    assert_clean()


def test_a_closed_graphs_recording_never_snapshots_again() -> None:
    w = torch.randn(3, 3, requires_grad=True)

    def backward() -> None:
        (torch.randn(2, 3) @ w).sum().backward()

    with ckpt_viz.record(graphs=True) as rec:
        backward()
    assert [g.label for g in rec.trace.graphs] == ["before autograd.backward #1"]
    backward()  # nobody records
    with ckpt_viz.record(graphs=True) as later:
        backward()
    assert len(rec.trace.graphs) == 1 and len(later.trace.graphs) == 1
    opened, done = threading.Event(), threading.Event()
    elsewhere: list[Any] = []

    def record_elsewhere() -> None:
        with ckpt_viz.record(graphs=True) as other_rec:
            opened.set()
            done.wait(30)
        elsewhere.append(other_rec)

    other = threading.Thread(target=record_elsewhere)
    other.start()
    assert opened.wait(30)
    backward()  # this thread records nothing, while another thread's graphs=True recording is open
    done.set()
    other.join(30)
    assert elsewhere[0].trace.graphs == [] and len(rec.trace.graphs) == 1
    assert_clean()


# ------------------------------------------------------------------ names and probes

def test_nested_record_with_the_same_model_names_parameters_beside_them() -> None:
    net = Net(4, 6)
    with ckpt_viz.record(model=net) as outer:
        with ckpt_viz.record(model=net) as inner:
            workload(net, lambda: None, [])
        assert bus.name_of(net.a[0].weight) == "a.0.weight"  # the outer still names them
    assert bus.name_of(net.a[0].weight) is None
    assert all(not hasattr(p, "_ckpt_viz_name") for p in net.parameters())
    for rec in (outer, inner):
        names = {n.name for e in rec.trace.of_kind("grads_routed") for n in e.captured}
        assert names == {"a.0.weight", "a.0.bias"}
    assert_clean()


def test_nested_memory_probes_do_not_switch_each_other_off(no_gc) -> None:
    def part(net: Net, step: int) -> None:
        x = net.x2.detach().requires_grad_()
        with reentrant_checkpoint_scope(list(net.parameters())) as handles:
            out = checkpoint(net.a, x * step, use_reentrant=True)
        loss = net.c(checkpoint(net.b, out, use_reentrant=False)).pow(2).sum()
        backward_input(loss, None, [x], handles=handles)
        backward_weight(loss, None, list(net.parameters()), handles=handles)

    def run(nested: bool) -> tuple[Any, Any]:
        net = Net(6, 7)
        with ckpt_viz.record(memory=True, model=net, tensors=(net.x, net.x2)) as outer:
            part(net, 1)
            inner_rec = ckpt_viz.record(memory=True, model=net, tensors=(net.x, net.x2))
            with inner_rec if nested else _nothing():
                part(net, 2)
            part(net, 3)
        return outer.trace, inner_rec.trace

    solo_outer, _ = run(nested=False)
    outer, inner = run(nested=True)
    assert memory(outer) == memory(solo_outer)  # the inner probe changed nothing for the outer one
    assert facts(outer) == facts(solo_outer)
    # The inner probe's own samples: the activations it saw held, and every step of a solo recording.
    net = Net(6, 7)
    with ckpt_viz.record(memory=True, model=net, tensors=(net.x, net.x2)):
        part(net, 1)
    with ckpt_viz.record(memory=True, model=net, tensors=(net.x, net.x2)) as solo_inner:
        part(net, 2)
    assert memory(inner) == memory(solo_inner.trace)
    assert max(s.bytes_by_category["replay_activations"] for s in inner.memory) > 0
    assert_clean()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def test_two_threads_recording_memory_get_their_own_samples(no_gc) -> None:
    """Each thread's probe sees only its own thread's ops (dispatch modes and saved-tensor hooks are per thread)."""
    solo = {w: memory_at_events(recorded(w, s)[0]) for w, s in ((6, 8), (12, 9))}
    barrier = threading.Barrier(2, timeout=30)
    got: dict[int, Any] = {}

    def run(width: int, seed: int) -> None:
        got[width] = memory_at_events(recorded(width, seed, sync=barrier.wait)[0])

    threads = [threading.Thread(target=run, args=a) for a in ((6, 8), (12, 9))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == solo and solo[6] != solo[12]
    assert_clean()


def test_the_first_memory_recording_in_a_process_frees_its_graphs_by_reference_counting() -> None:
    """See NOTE [ Memory categories ], rule 8 (probe/memory.py): torch's lazy torch._dynamo import must not
    pin the first run's frames. A fresh interpreter, with automatic garbage collection off."""
    script = (
        "import gc, json, sys; gc.disable(); sys.path[:0] = ['tests', 'tests/recording']\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "import test_scoped as T\n"
        "trace, _ = T.recorded(6, 1)\n"
        "ids = lambda kind: sorted(e.handle_id for e in trace.of_kind(kind) if e.mode == 'reentrant')\n"
        "print(json.dumps([ids('node_collected'), ids('handle_created')]))\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    collected, created = json.loads(done.stdout.strip().splitlines()[-1])
    assert collected == created and len(created) == 2  # every reentrant node was freed inside the run


def test_fifty_closed_memory_recordings_leave_no_live_probe() -> None:
    net = Net(8, 10)  # long-lived parameters: what kept every closed probe alive through its finalizers
    gc.collect()
    finalizers = len(weakref.finalize._registry)  # type: ignore[attr-defined]
    probes = []
    for _ in range(50):
        with ckpt_viz.record(memory=True, model=net) as rec:
            net.c(net.b(net.a(net.x))).sum().backward()
            probes.append(weakref.ref(rec._probe))
        assert rec._probe is None
    gc.collect()
    assert [p for p in probes if p() is not None] == []
    assert len(weakref.finalize._registry) <= finalizers  # type: ignore[attr-defined]
    from ckpt_viz.probe.memory import MemoryProbe

    assert not any(type(o) is MemoryProbe for o in gc.get_objects())
    assert_clean()
