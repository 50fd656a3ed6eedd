"""Trace files: round trips, atomic saves, and a clear TraceError for every kind of bad file.

No torch: traces are built by hand from the typed events. The semantic checks of a file (every field's type and
range, seq order, meta) are tests/trace/test_validation.py; hostile files (bombs, devices, huge numbers) are
tests/trace/test_hostile.py; random mutations of real traces are tests/trace/test_fuzz.py.
"""
from __future__ import annotations

import ast
import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ckpt_viz import TraceError
from ckpt_viz.events import (
    CapturedParam,
    Error,
    ForwardStarted,
    GradsRouted,
    HandleCreated,
    PhaseSet,
    Released,
    ReplayStarted,
    TensorMeta,
    TensorPacked,
)
from ckpt_viz.trace import (
    SCHEMA_VERSION,
    GraphNode,
    GraphSnapshot,
    MemorySample,
    TorchvizEdge,
    TorchvizGraph,
    TorchvizNode,
    Trace,
    run_meta,
)
from ckpt_viz.trace import files as trace_files
from traces import kinds

ROOT = Path(__file__).resolve().parent.parent.parent
FILES = Path(__file__).resolve().parent / "files"


def make_trace(n_events: int = 40) -> Trace:
    """A hand-made trace touching every field: kinds, modes, phases, tags, sites, sessions, kind fields."""
    def event(i: int) -> Any:
        common = dict(seq=i, t_ns=1_000_000 + 37 * i, handle_id=None if i % 5 == 0 else i % 7,
                      mode=(None, "reentrant", "nonreentrant", "exclude")[i % 4],
                      phase=(None, "ordinary", "dx", "dw")[i % 3], session_id=(None, "mb1", 3, 2.5, True)[i % 5],
                      tags=({}, {"stage": 0, "microbatch": 1}, {"stage": 1, "microbatch": 1, "f": 0.5})[i % 3],
                      site=None if i % 6 == 0 else f"train.py:{10 + i % 4}", thread_id=1234 + i % 2)
        made = [
            HandleCreated(function="Block.forward", label="blocks.1", split=True, input_count=1,
                          inputs=(TensorMeta(shape=(2, 3), dtype="float32", nbytes=24, requires_grad=True),),
                          param_input_mask=(False,), collector="scope", **common),
            ForwardStarted(device_type="cpu", rng_captured=True, **common),
            TensorPacked(index=i, shape=(4, 4), dtype="float32", nbytes=64, **common),
            PhaseSet(old="ordinary", new="dx", **common),
            ReplayStarted(trigger="prefire", key_source="session", **common),
            GradsRouted(targets=(0,), activations=(0,), captured=(CapturedParam(shape=(4,), accumulated=True,
                                                                                name="b"),), **common),
            Released(reason="dw_complete", was_replayed=True, **common),
            Error(where="backward", type="ValueError", message="boom\nsecond line", code="error_raised", **common),
        ]
        return made[i % len(made)]

    events = [event(i) for i in range(n_events)]
    memory = [MemorySample(seq=i, t_ns=1_000_000 + 37 * i, bytes_by_category={"parameters": 64, "activations": 8 * i},
                           device_allocated=None if i % 2 else 4096,
                           by_stage={"0": {"activations": i}} if i % 3 else {}, at="block 0" if i == 4 else None)
              for i in range(0, n_events, 4)]
    viz = TorchvizGraph(nodes=(TorchvizNode(id="n1", label="SumBackward0"),
                               TorchvizNode(id="n2", label="weight\n(4, 5)", fill="lightblue")),
                        edges=(TorchvizEdge(tail="n2", head="n1"),))
    graphs = [GraphSnapshot(seq=5, label="after forward", nodes=(
        GraphNode(id=0, name="SumBackward0", dx_reached=True),
        GraphNode(id=1, name="CheckpointFunctionBackward", kind="checkpoint", handle_id=2, dx_reached=True,
                  dw_reached=True, split=True, phase="dx"),
        GraphNode(id=2, name="weight", kind="leaf", dw_reached=True, shape=(4, 5)),
    ), edges=((0, 1), (1, 2)), torchviz=viz)]
    meta = {"model": "mlp2", "mode": "reentrant", "schedule": None, "versions": {"python": "3.11"},
            "anything": {"nested": [1, 2.5, None, "x"]}}
    return Trace(events=events, memory=memory, graphs=graphs, meta=meta)


def same(a: Trace, b: Trace) -> bool:
    """Two traces hold the same events, samples, snapshots and meta (Trace itself compares by identity)."""
    return (a.events, a.memory, a.graphs, a.meta) == (b.events, b.memory, b.graphs, b.meta)


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_round_trip_keeps_every_field(tmp_path: Path, suffix: str) -> None:
    trace = make_trace()
    path = tmp_path / f"trace{suffix}"
    trace.save(path)
    loaded = Trace.load(path)
    assert same(loaded, trace)
    assert [type(e) for e in loaded.events] == [type(e) for e in trace.events]
    assert [msgspec.to_builtins(e) for e in loaded.events] == [msgspec.to_builtins(e) for e in trace.events]
    assert loaded.events[2].tags == {"stage": 1, "microbatch": 1, "f": 0.5} and loaded.events[3].session_id == 2.5
    assert loaded.events[5].captured == (CapturedParam(shape=(4,), accumulated=True, name="b"),)
    assert loaded.graphs[0].torchviz == trace.graphs[0].torchviz and loaded.memory[1].at == "block 0"
    assert isinstance(loaded.events, list) and isinstance(loaded.memory, list)


def test_gzip_file_is_gzip_and_plain_file_is_json(tmp_path: Path) -> None:
    trace = make_trace()
    trace.save(tmp_path / "t.json.gz")
    trace.save(tmp_path / "t.json")

    raw_gz = (tmp_path / "t.json.gz").read_bytes()
    assert raw_gz[:2] == b"\x1f\x8b"
    with gzip.open(tmp_path / "t.json.gz", "rt", encoding="utf-8") as f:
        from_gz = json.load(f)
    with open(tmp_path / "t.json", encoding="utf-8") as f:
        from_plain = json.load(f)
    assert from_gz == from_plain
    assert list(from_plain)[:2] == ["format", "schema_version"]  # first, so `head` identifies a file
    assert from_plain["format"] == "ckpt_viz.trace" and from_plain["schema_version"] == SCHEMA_VERSION == 3
    assert from_plain["events"][0]["kind"] == "handle_created"  # one object per event, tagged by its kind
    assert (tmp_path / "t.json").read_bytes() == trace.to_json()
    assert gzip.decompress(raw_gz) == trace.to_json()


def test_twenty_thousand_events_round_trip(tmp_path: Path) -> None:
    trace = make_trace(20_000)
    trace.save(tmp_path / "big.json.gz")
    loaded = Trace.load(tmp_path / "big.json.gz")
    assert len(loaded.events) == 20_000 and len(loaded.memory) == 5_000
    assert same(loaded, trace)


def test_empty_trace_round_trips(tmp_path: Path) -> None:
    Trace().save(tmp_path / "empty.json")
    loaded = Trace.load(tmp_path / "empty.json")
    assert same(loaded, Trace())
    assert len(loaded) == 0 and kinds(loaded) == [] and loaded.handle_ids() == []


def test_gaps_in_seq_and_decreasing_t_ns_round_trip(tmp_path: Path) -> None:
    # seqs must increase (test_validation.py); gaps are fine (a trace cut from a longer one) and so is a clock read
    # on several threads.
    events = [Released(seq=s, t_ns=t, reason="explicit_release") for s, t in [(3, 900), (7, 100), (8, 5), (20, 10**15)]]
    trace = Trace(events=events)
    trace.save(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert [e["seq"] for e in doc["events"]] == [3, 7, 8, 20] and [e["t_ns"] for e in doc["events"]][1] == 100
    assert same(Trace.load(tmp_path / "t.json"), trace)


def test_json_has_no_nan_and_a_value_json_cannot_hold_comes_back_changed(tmp_path: Path) -> None:
    # What JSON cannot hold comes back changed (NaN as null, a tuple as a list, an int key as a str), never lost
    # into an unreadable file.
    trace = Trace(events=[Error(seq=0, t_ns=1, where="w", type="T", session_id=float("nan"),
                                tags={"inf": float("inf")})],
                  meta={"shape": (2, 3), "by_id": {1: "a"}})
    trace.save(tmp_path / "t.json")
    text = (tmp_path / "t.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    loaded = Trace.load(tmp_path / "t.json")
    assert loaded.events[0].session_id is None and loaded.events[0].tags == {"inf": None}
    assert loaded.meta == {"shape": [2, 3], "by_id": {"1": "a"}}


def test_to_json_from_json_without_files() -> None:
    trace = make_trace()
    assert same(Trace.from_json(trace.to_json()), trace)
    assert same(Trace.from_json(trace.to_json().decode()), trace)  # str or bytes
    doc = json.loads(trace.to_json())
    del doc["events"][3]["old"]
    with pytest.raises(TraceError, match=r"^ckpt_viz\.Trace\.from_json: <bytes> is not a valid trace: field "
                                         r"events\[3\]: Object missing required field `old`"):
        Trace.from_json(json.dumps(doc))
    with pytest.raises(TraceError, match=r"^ckpt_viz\.Trace\.from_json: my\.json is not a valid trace"):
        Trace.from_json(json.dumps(doc), name="my.json")
    with pytest.raises(TraceError, match=r"^ckpt_viz\.Trace\.to_json: cannot write <bytes>: a value of the trace "
                                         r"cannot be written as JSON"):
        Trace(meta={"x": object()}).to_json()


def test_saving_a_loaded_trace_gives_the_same_bytes(tmp_path: Path) -> None:
    make_trace().save(tmp_path / "a.json")
    Trace.load(tmp_path / "a.json").save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_queries_on_loaded_trace_match_the_original(tmp_path: Path) -> None:
    trace = make_trace(60)
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")

    assert kinds(loaded) == kinds(trace)
    assert loaded.handle_ids() == trace.handle_ids() == [1, 2, 3, 4, 6, 0, 5]
    for kind in ("released", "error", "tensor_packed", "memory_sampled"):
        assert loaded.count(kind) == trace.count(kind)
    assert trace.count("released") == 7 == trace.count(Released)  # i % 8 == 6 for i < 60
    assert loaded.of_kind("released", "error") == trace.of_kind(Released, Error)
    at = trace.positions("released", Error)
    assert len(at) == 7 + trace.count("error") and at == sorted(at)
    assert [trace.events[i] for i in at] == trace.of_kind("released", "error")
    assert [i for i, e in enumerate(trace.events) if e.kind in ("released", "error")] == at
    assert loaded.for_handle(3) == trace.for_handle(3) and all(e.handle_id == 3 for e in loaded.for_handle(3))
    assert loaded.events[-1] == trace.events[-1] and loaded.events[10:13] == trace.events[10:13]
    assert list(loaded) == loaded.events and len(loaded) == 60


def test_events_are_frozen_and_a_loaded_trace_is_plain_lists(tmp_path: Path) -> None:
    trace = make_trace(10)
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    with pytest.raises(AttributeError):
        loaded.events[0].seq = 99  # type: ignore[misc]
    extra = Error(seq=10, t_ns=5, where="record", type="KeyError")
    loaded.events.append(extra)
    assert loaded.events == [*trace.events, extra] and loaded.count("error") == trace.count("error") + 1
    del loaded.events[0]
    assert loaded.events[0] == trace.events[1]


# ---------------------------------------------------------------- atomic save (NOTE [ Atomic save ] in files.py)

def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_failed_serialization_keeps_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    make_trace().save(path)
    before = path.read_bytes()
    bad = make_trace()
    bad.events[3] = Error(seq=3, t_ns=1, where=object(), type="T")  # type: ignore[arg-type]

    with pytest.raises(TraceError) as info:
        bad.save(path)
    message = str(info.value)
    assert message.startswith(f"ckpt_viz.Trace.save: cannot write {path}: a value of the trace cannot be written "
                              "as JSON (Encoding objects of type object is unsupported)")
    assert "\nTip: " in message
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failed_write_keeps_previous_file_and_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            failing: str) -> None:
    path = tmp_path / "trace.json.gz"
    make_trace().save(path)
    before = path.read_bytes()

    def boom(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(trace_files.os, failing, boom)
        with pytest.raises(OSError, match="No space left") as info:
            make_trace(80).save(path)
    assert isinstance(info.value, TraceError) and info.value.errno == 28
    assert str(info.value).startswith(f"ckpt_viz.Trace.save: cannot write '{path}': No space left on device.")
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []
    assert same(Trace.load(path), make_trace())


def test_failed_first_save_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(trace_files.os, "fsync", boom)
    with pytest.raises(OSError, match="Input/output error"):
        make_trace().save(tmp_path / "new.json")
    assert list(tmp_path.iterdir()) == []


def test_save_checks_what_it_writes_and_writes_nothing_when_wrong(tmp_path: Path) -> None:
    # NOTE [ Trace checks ], rule 4: a file ckpt_viz writes is one it reads.
    cases = [
        (Trace(events=[Error(seq=0, t_ns=1, where="w", type="T"), Error(seq=1, t_ns=2, where="w", type="T",
                                                                         site=["x"])]),  # type: ignore[arg-type]
         r"field events\[1\]\.site: Expected `str \| null`, got `array`"),
        (Trace(events=[Error(seq=0, t_ns=1.5, where="w", type="T")]),  # type: ignore[arg-type]
         r"field events\[0\]\.t_ns: Expected `int`, got `float`"),
        (Trace(events=[Error(seq=0, t_ns=1, where="w", type="T"), {"seq": 1}]),  # type: ignore[list-item]
         r"field events\[1\]: Object missing required field `kind`"),
        (Trace(memory=[MemorySample(seq=0, t_ns=0, bytes_by_category={"weights": 1})]),  # type: ignore[dict-item]
         r"a key of field memory\[0\]\.bytes_by_category: Invalid enum value 'weights'"),
        (Trace(events=[Released(seq=0, t_ns=0, reason="tired")]),  # type: ignore[arg-type]
         r"field events\[0\]\.reason: Invalid enum value 'tired'"),
        (Trace(events=[Error(seq=1, t_ns=0, where="w", type="T"), Error(seq=1, t_ns=0, where="w", type="T")]),
         r"events\[1\]\.seq is 1 after 1; event seqs must strictly increase"),
    ]
    for trace, phrase in cases:
        with pytest.raises(TraceError, match=r"^ckpt_viz\.Trace\.save: .*t\.json is not a valid trace: " + phrase
                           + r"[^\n]*\nTip: "):
            trace.save(tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []


def test_save_keeps_an_existing_files_permissions(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    make_trace().save(path)
    os.chmod(path, 0o640)
    make_trace(8).save(path)
    assert (path.stat().st_mode & 0o777) == 0o640


# ---------------------------------------------------------------- bad files

def _expect_load_error(path: Path, *phrases: str) -> str:
    """Load `path`: a TraceError that starts with the API, names the file, has one tip and ends with a full stop."""
    with pytest.raises(TraceError) as info:
        Trace.load(path)
    message = str(info.value)
    assert message.startswith("ckpt_viz.Trace.load: "), message
    assert str(path) in message.splitlines()[0], message
    assert len(message.splitlines()) == 2 and message.splitlines()[1].startswith("Tip: "), message
    assert message.endswith((".", ").")), message
    for phrase in phrases:
        assert phrase in message, message
    return message


def test_missing_file(tmp_path: Path) -> None:
    _expect_load_error(tmp_path / "nope.json", "no such file")


def test_folder_instead_of_file(tmp_path: Path) -> None:
    _expect_load_error(tmp_path, "it is a folder")


@pytest.mark.parametrize("content", [b"", b"  \n\t "])
def test_empty_file(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "t.json").write_bytes(content)
    _expect_load_error(tmp_path / "t.json", "is empty")


def test_empty_gzip(tmp_path: Path) -> None:
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(b""))
    _expect_load_error(tmp_path / "t.json.gz", "is empty")


@pytest.mark.parametrize("content", [b"hello, world", b'{"format": "ckpt_viz.trace", "schema_version": 3,,}',
                                     b"\xff\xfe\x00garbage", b'{"format": NaN}'])
def test_not_json(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "t.json").write_bytes(content)
    _expect_load_error(tmp_path / "t.json", "it is not valid JSON")


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.99, 0.999])
def test_truncated_json(tmp_path: Path, cut: float) -> None:
    make_trace().save(tmp_path / "t.json")
    raw = (tmp_path / "t.json").read_bytes()
    (tmp_path / "t.json").write_bytes(raw[:int(len(raw) * cut)])
    _expect_load_error(tmp_path / "t.json", "truncated")


def test_truncated_gzip(tmp_path: Path) -> None:
    make_trace(400).save(tmp_path / "t.json.gz")
    raw = (tmp_path / "t.json.gz").read_bytes()
    (tmp_path / "t.json.gz").write_bytes(raw[:len(raw) // 2])
    _expect_load_error(tmp_path / "t.json.gz", "the gzip data is truncated")


def test_corrupt_gzip(tmp_path: Path) -> None:
    make_trace(400).save(tmp_path / "t.json.gz")
    raw = bytearray((tmp_path / "t.json.gz").read_bytes())
    raw[-8] ^= 0xFF  # the CRC-32 of the trailer no longer matches the data
    (tmp_path / "t.json.gz").write_bytes(bytes(raw))
    _expect_load_error(tmp_path / "t.json.gz", "not a valid gzip file, or it is corrupt")


def test_pickle_is_refused_not_unpickled(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {tmp_path / 'PWNED'}",))

    (tmp_path / "t.pkl").write_bytes(pickle.dumps([make_trace(), Boom()]))
    _expect_load_error(tmp_path / "t.pkl", "looks like a Python pickle", "never unpickles")
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("doc, phrase", [
    ({"events": []}, 'its "format" is None'),
    ({"format": "chrome.trace", "schema_version": 1}, "its \"format\" is 'chrome.trace'"),
    ([1, 2, 3], "got `array`"),
    ("ckpt_viz.trace", "got `str`"),
])
def test_wrong_format_marker(tmp_path: Path, doc: Any, phrase: str) -> None:
    (tmp_path / "t.json").write_text(json.dumps(doc))
    _expect_load_error(tmp_path / "t.json", "is not a ckpt_viz trace", phrase)


@pytest.mark.parametrize("version, when", [(4, "another"), ("3", "another"), (None, "another"), (3.0, "another"),
                                           (True, "another")])
def test_another_schema_version(tmp_path: Path, version: Any, when: str) -> None:
    doc = json.loads(make_trace().to_json())
    doc["schema_version"] = version
    doc["events"] = "a layout this version does not know"
    (tmp_path / "t.json").write_text(json.dumps(doc))
    _expect_load_error(tmp_path / "t.json", f"written by {when} ckpt_viz", "reads schema version 3 only",
                       "Tip: record the run again")


@pytest.mark.parametrize("name, version", [("schema1.json", 1), ("schema2.json", 2)])
def test_files_of_the_previous_schemas_are_refused_with_a_way_to_record_again(name: str, version: int) -> None:
    # Real files written by earlier versions (schema 1: columns; schema 2: packed columns). Their events are never
    # decoded: the version is read first.
    assert json.loads((FILES / name).read_text())["schema_version"] == version
    message = _expect_load_error(FILES / name, f"is a trace of schema version {version}, written by an older ckpt_viz",
                                 "this version reads schema version 3 only")
    assert message.splitlines()[1].startswith("Tip: record the run again with this version of ckpt_viz")


# ---------------------------------------------------------------- no pickle, no torch

def test_trace_modules_never_import_pickle_or_torch() -> None:
    for path in sorted((ROOT / "ckpt_viz" / "trace").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"pickle", "marshal", "shelve", "dill", "torch"}, (path.name, imported)


def test_loading_a_trace_does_not_import_torch(tmp_path: Path) -> None:
    make_trace().save(tmp_path / "t.json.gz")
    code = ("import sys, ckpt_viz; from ckpt_viz.trace import Trace; "
            f"t = Trace.load({str(tmp_path / 't.json.gz')!r}); assert len(t.events) == 40; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_run_meta_names_versions() -> None:
    meta = run_meta(model="mlp2", mode="reentrant", schedule="1F1B", microbatches=4)
    assert meta["model"] == "mlp2" and meta["mode"] == "reentrant" and meta["schedule"] == "1F1B"
    assert meta["versions"]["python"] == sys.version.split()[0] and meta["versions"]["ckpt_viz"]
    assert meta["microbatches"] == 4
    json.dumps(meta)  # plain data
    trace = Trace(meta=meta)
    assert same(Trace.from_json(trace.to_json()), trace)  # and a valid meta


def test_memory_sample_total_and_defaults() -> None:
    sample = MemorySample(seq=3, t_ns=9, bytes_by_category={"parameters": 10, "activations": 32})
    assert sample.total_nbytes == 42
    assert sample.device_allocated is None and sample.by_stage == {} and sample.at is None and sample.rank is None
