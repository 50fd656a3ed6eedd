"""Semantic validation on load (issue 25, "What to build" item 4; NOTE [ Trace checks ] in ckpt_viz/trace/_codec.py).

Every refusal is a TraceError whose message names the file and the field: a wrong-typed value in any field of any
event kind (and of memory samples and graph snapshots), integers out of range (handle ids, byte counts past 2**56
per category, anything past 64 bits), texts too long, seqs not strictly increasing or duplicated, samples and
snapshots past the last event, meta fields of the wrong type, and files of schema 2. The crafted traces of
tests/data/hostile/refused are refused the same way.

Which JSON values a field takes is read here from its declared annotation by a small table of our own (not by
msgspec), so a field declared loosely (`Any`) or a loader that skipped a field would fail these tests.
"""
from __future__ import annotations

import gzip
import json
import types
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ckpt_viz import TraceError
from ckpt_viz.events import EVENT_TYPES, EventBase
from ckpt_viz.trace import GraphNode, GraphSnapshot, MemorySample, Trace
from ckpt_viz.vocabulary import KINDS

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "data" / "hostile" / "refused"

# A candidate of each JSON kind.
CANDIDATES: dict[str, Any] = {"str": "x", "int": 7, "bool": True, "float": 2.5, "array": [1], "object": {"k": 1},
                              "null": None}


def json_kinds(hint: Any) -> set[str]:
    """The JSON kinds (keys of CANDIDATES) a field of type `hint` can hold, read from the annotation."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return json_kinds(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(json_kinds(a) for a in typing.get_args(hint)))
    if origin is typing.Literal:
        return {"str" if isinstance(v, str) else "bool" if isinstance(v, bool) else "int"
                for v in typing.get_args(hint)}
    if hint is type(None):
        return {"null"}
    if hint is bool:
        return {"bool"}
    if hint is int:
        return {"int"}
    if hint is float:
        return {"int", "float"}
    if hint is str:
        return {"str"}
    if origin in (tuple, list) or hint in (tuple, list):
        return {"array"}
    if origin is dict or hint is dict or (isinstance(hint, type) and issubclass(hint, msgspec.Struct)):
        return {"object"}
    raise AssertionError(f"a field of type {hint!r} is not one a trace file holds")


def _fields(cls: type) -> dict[str, Any]:
    return {name: hint for name, hint in typing.get_type_hints(cls, include_extras=True).items()
            if typing.get_origin(hint) is not typing.ClassVar}


def _valid(info: Any) -> Any:
    """A valid JSON value for msgspec type info `info` (for the required fields of a sample event)."""
    if isinstance(info, msgspec.inspect.LiteralType):
        return info.values[0]
    if isinstance(info, msgspec.inspect.IntType):
        return info.ge if info.ge is not None else 0
    if isinstance(info, msgspec.inspect.StrType):
        return "x"
    if isinstance(info, msgspec.inspect.BoolType):
        return False
    if isinstance(info, (msgspec.inspect.VarTupleType, msgspec.inspect.ListType, msgspec.inspect.TupleType)):
        return []
    if isinstance(info, msgspec.inspect.UnionType):
        return _valid(info.types[0])
    raise AssertionError(info)


def sample_event(cls: type[EventBase], seq: int = 0) -> dict[str, Any]:
    """A valid event of `cls` as JSON: its required fields set, every optional field left at its default."""
    event: dict[str, Any] = {"kind": cls.kind, "seq": seq, "t_ns": 1000 + seq}
    for field in msgspec.inspect.type_info(cls).fields:
        if field.required and field.name not in event:
            event[field.name] = _valid(field.type)
    return event


def document(events: list[dict[str, Any]] | None = None, **parts: Any) -> dict[str, Any]:
    events = events if events is not None else [sample_event(cls, i) for i, cls in enumerate(EVENT_TYPES.values())]
    return {"format": "ckpt_viz.trace", "schema_version": 3, "meta": parts.pop("meta", {}), "events": events,
            "memory": parts.pop("memory", []), "graphs": parts.pop("graphs", []), **parts}


def refusal(tmp_path: Path, doc: dict[str, Any], *phrases: str, gz: bool = False) -> str:
    """Write `doc` and load it: a TraceError naming the file, with each phrase."""
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    text = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    with pytest.raises(TraceError) as info:
        Trace.load(path)
    message = str(info.value)
    assert message.startswith(f"ckpt_viz.Trace.load: {path} is not a valid trace"), message
    assert message.splitlines()[-1].startswith("Tip: "), message
    for phrase in phrases:
        assert phrase in message, message
    return message


def loads(tmp_path: Path, doc: dict[str, Any]) -> Trace:
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(doc))
    return Trace.load(path)


def test_the_sample_document_loads_with_one_event_of_each_kind(tmp_path: Path) -> None:
    trace = loads(tmp_path, document())
    assert [e.kind for e in trace.events] == list(EVENT_TYPES) and set(EVENT_TYPES) == set(KINDS)
    assert all(type(e) is EVENT_TYPES[e.kind] for e in trace.events)


# ---------------------------------------------------------------- every field of every kind

@pytest.mark.parametrize("kind", list(EVENT_TYPES))
def test_a_wrong_typed_value_in_any_field_of_any_event_kind_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    cls = EVENT_TYPES[kind]
    checked = 0
    for name, hint in _fields(cls).items():
        accepted = json_kinds(hint)
        wrong = [k for k in CANDIDATES if k not in accepted]
        assert wrong, f"{kind}.{name} takes any JSON value"
        for json_kind in wrong:
            events = [sample_event(EVENT_TYPES["handle_created"], 0), sample_event(cls, 1)]
            events[1][name] = CANDIDATES[json_kind]
            refusal(tmp_path, document(events), f"events[1].{name}")
            checked += 1
        if typing.get_origin(hint) is typing.Literal or ("str" in accepted and any(
                typing.get_origin(a) is typing.Literal for a in typing.get_args(hint))):
            events = [sample_event(cls, 0)]
            events[0][name] = "not-one-of-its-words"
            refusal(tmp_path, document(events), f"events[0].{name}", "Invalid enum value 'not-one-of-its-words'")
    assert checked >= len(_fields(EventBase)) * 2


@pytest.mark.parametrize("kind", list(EVENT_TYPES))
def test_integers_out_of_their_range_and_past_64_bits_are_refused(tmp_path: Path, kind: str) -> None:
    cls = EVENT_TYPES[kind]
    for field in msgspec.inspect.type_info(cls).fields:
        infos = field.type.types if isinstance(field.type, msgspec.inspect.UnionType) else (field.type,)
        for info in infos:
            if not isinstance(info, msgspec.inspect.IntType):
                continue
            assert info.le is not None and info.le <= 2**63 - 1, f"{kind}.{field.name} has no upper bound"
            for bad in {info.le + 1, 2**64, 10**30, *(() if info.ge is None else (info.ge - 1,))}:
                events = [sample_event(cls, 0)]
                events[0][field.name] = bad
                message = refusal(tmp_path, document(events), f"events[0].{field.name}")
                assert "Expected `int`" in message or "out of range" in message, message


def test_a_handle_id_past_2_53_or_negative_is_refused(tmp_path: Path) -> None:
    for bad in (2**53 + 1, -1, 2**64):
        events = [dict(sample_event(EVENT_TYPES["released"]), handle_id=bad)]
        refusal(tmp_path, document(events), "events[0].handle_id")
    events = [dict(sample_event(EVENT_TYPES["released"]), handle_id=2**53)]
    assert loads(tmp_path, document(events)).events[0].handle_id == 2**53


@pytest.mark.parametrize("path, value", [
    (("inputs", 0, "nbytes"), "x"), (("inputs", 0, "shape"), [1, -2]), (("inputs", 0, "dtype"), 3),
    (("inputs", 0), [1]), (("param_input_mask",), [True, 1]),
])
def test_a_wrong_value_inside_a_nested_field_is_refused_with_its_path(tmp_path: Path, path: tuple,
                                                                       value: Any) -> None:
    event = dict(sample_event(EVENT_TYPES["handle_created"]),
                 inputs=[{"shape": [2, 3], "dtype": "float32", "nbytes": 24}], param_input_mask=[True])
    node: Any = event
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    where = "events[0]." + ".".join(str(p) for p in path).replace(".0", "[0]")  # e.g. events[0].inputs[0].nbytes
    refusal(tmp_path, document([event]), where)


def test_captured_params_and_texts_too_long_are_refused(tmp_path: Path) -> None:
    routed = dict(sample_event(EVENT_TYPES["grads_routed"]), captured=[{"shape": [4], "accumulated": "yes"}])
    refusal(tmp_path, document([routed]), "events[0].captured[0].accumulated")
    for name, limit in (("message", 65536), ("where", 1024), ("site", 4096)):
        error = dict(sample_event(EVENT_TYPES["error"]), **{name: "x" * (limit + 1)})
        refusal(tmp_path, document([error]), f"events[0].{name}", f"length <= {limit}")
        error[name] = "x" * limit
        assert len(getattr(loads(tmp_path, document([error])).events[0], name)) == limit


def test_tags_hold_only_scalars_under_short_keys(tmp_path: Path) -> None:
    base = sample_event(EVENT_TYPES["released"])
    for tags, phrase in (({"stage": {"deep": [1, 2]}}, "events[0].tags"), ({"stage": [0]}, "events[0].tags"),
                         ({"k" * 65: 1}, "events[0].tags"), ({f"t{i}": i for i in range(65)}, "events[0].tags"),
                         ([["stage", 0]], "events[0].tags")):
        refusal(tmp_path, document([dict(base, tags=tags)]), phrase)
    ok = loads(tmp_path, document([dict(base, tags={"stage": 0, "note": "x", "f": 0.5, "b": True, "n": None})]))
    assert ok.events[0].tags == {"stage": 0, "note": "x", "f": 0.5, "b": True, "n": None}


def test_an_unknown_kind_or_an_event_without_a_kind_is_refused(tmp_path: Path) -> None:
    for bad, phrase in (("<script>", "Invalid value '<script>'"), (None, "events[0]"), (7, "events[0]")):
        event = dict(sample_event(EVENT_TYPES["released"]), kind=bad)
        refusal(tmp_path, document([event]), "events[0]", phrase)
    event = sample_event(EVENT_TYPES["released"])
    del event["kind"]
    refusal(tmp_path, document([event]), "events[0]", "missing required field `kind`")
    refusal(tmp_path, document(events=[1]), "events[0]")  # type: ignore[list-item]
    refusal(tmp_path, document(events={"0": {}}), "events")  # type: ignore[arg-type]


# ---------------------------------------------------------------- order: seqs, samples, snapshots

def _events(n: int) -> list[dict[str, Any]]:
    return [sample_event(EVENT_TYPES["released"], seq) for seq in range(n)]


@pytest.mark.parametrize("seqs, at, phrase", [
    ([0, 1, 1, 2], 2, "events[2].seq is 1 after 1"),
    ([0, 2, 1, 3], 2, "events[2].seq is 1 after 2"),
    ([3, 2, 1, 0], 1, "events[1].seq is 2 after 3"),
    ([0, 0], 1, "events[1].seq is 0 after 0"),
])
def test_seqs_that_do_not_strictly_increase_are_refused(tmp_path: Path, seqs: list[int], at: int, phrase: str) -> None:
    events = _events(len(seqs))
    for event, seq in zip(events, seqs):
        event["seq"] = seq
    refusal(tmp_path, document(events), phrase, "must strictly increase")
    assert at == int(phrase.split("]")[0].split("[")[1])


def test_a_duplicated_or_moved_event_is_refused(tmp_path: Path) -> None:
    events = _events(5)
    refusal(tmp_path, document([*events[:3], events[2], *events[3:]]), "events[3].seq is 2 after 2")
    refusal(tmp_path, document([*events[:1], events[3], *events[1:3], *events[4:]]), "events[2].seq is 1 after 3")


def _sample(seq: int, **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "t_ns": seq, "bytes_by_category": {"activations": 8}, **fields}


def test_memory_samples_follow_events_in_order(tmp_path: Path) -> None:
    refusal(tmp_path, document(_events(3), memory=[_sample(0), _sample(3)]), "memory[1].seq is 3, past the last "
                                                                            "event (2)")
    refusal(tmp_path, document(_events(3), memory=[_sample(2), _sample(1)]), "memory[1].seq is 1 after 2")
    refusal(tmp_path, document([], memory=[_sample(0)]), "memory[0].seq is 0, past the last event (-1)")
    refusal(tmp_path, document(_events(3), memory=[_sample(10**9)]), "memory[0].seq is 1000000000, past the last")
    ok = loads(tmp_path, document(_events(3), memory=[_sample(0), _sample(0), _sample(2)]))  # several at one seq
    assert [s.seq for s in ok.memory] == [0, 0, 2]


def test_graph_snapshots_follow_an_event(tmp_path: Path) -> None:
    graph = {"seq": 3, "label": "before backward", "nodes": [{"id": 0, "name": "SumBackward0"}], "edges": []}
    refusal(tmp_path, document(_events(3), graphs=[graph]), "graphs[0].seq is 3, past the last event (2)")
    before_any = dict(graph, seq=-1)  # a snapshot taken before the first event
    assert loads(tmp_path, document(_events(3), graphs=[before_any])).graphs[0].seq == -1
    refusal(tmp_path, document(_events(3), graphs=[dict(graph, seq=-2)]), "graphs[0].seq")


# ---------------------------------------------------------------- memory samples and graph snapshots, field by field

@pytest.mark.parametrize("cls, make, where", [
    (MemorySample, lambda: _sample(0), "memory[0]"),
    (GraphSnapshot, lambda: {"seq": 0, "label": "g"}, "graphs[0]"),
    (GraphNode, lambda: {"id": 0, "name": "SumBackward0"}, "graphs[0].nodes[0]"),
])
def test_a_wrong_typed_value_in_a_sample_or_snapshot_is_refused_naming_it(tmp_path: Path, cls: type, make: Any,
                                                                           where: str) -> None:
    for name, hint in _fields(cls).items():
        for json_kind in [k for k in CANDIDATES if k not in json_kinds(hint)]:
            item = make()
            item[name] = CANDIDATES[json_kind]
            if cls is GraphNode:
                doc = document(_events(1), graphs=[{"seq": 0, "label": "g", "nodes": [item]}])
            elif cls is GraphSnapshot:
                doc = document(_events(1), graphs=[item])
            else:
                doc = document(_events(1), memory=[item])
            refusal(tmp_path, doc, f"{where}.{name}")


def test_byte_counts_past_2_56_per_category_are_refused(tmp_path: Path) -> None:
    # One category's bytes stay below 2**56 so that sums of a few (a run's total, a merged trace's ranks) stay far
    # inside 64 bits: memory totals over 2**63 crashed the Overview and Memory pages (issue 25, finding 8).
    for sample, phrase in (
        (_sample(0, bytes_by_category={"parameters": 2**56 + 1}), "memory[0].bytes_by_category"),
        (_sample(0, bytes_by_category={"parameters": 2**63 + 5}), "memory[0].bytes_by_category"),
        (_sample(0, bytes_by_category={"parameters": -1}), "memory[0].bytes_by_category"),
        (_sample(0, bytes_by_category={"parameters": 1e40}), "memory[0].bytes_by_category"),
        (_sample(0, device_allocated=2**56 + 1), "memory[0].device_allocated"),
        (_sample(0, by_stage={"0": {"activations": 2**56 + 1}}), "memory[0].by_stage"),
        (_sample(0, by_stage={"0": {"weights": 1}}), "memory[0].by_stage"),
        (_sample(0, rank=-1), "memory[0].rank"),
    ):
        refusal(tmp_path, document(_events(1), memory=[sample]), phrase)
    every = {c: 2**56 for c in ("parameters", "gradients", "optimizer_state", "activations", "checkpoint_inputs",
                                "replay_activations", "excluded_outputs", "inputs", "other")}
    ok = loads(tmp_path, document(_events(1), memory=[_sample(0, bytes_by_category=every)]))
    assert ok.memory[0].total_nbytes == 9 * 2**56 < 2**63  # the largest total a sample can state


def test_graph_edges_and_torchviz_drawings_are_checked(tmp_path: Path) -> None:
    base = {"seq": 0, "label": "g", "nodes": [{"id": 0, "name": "a"}, {"id": 1, "name": "b"}]}
    for graph, phrase in (
        (dict(base, edges=[[0, 1, 2]]), "graphs[0].edges[0]"),
        (dict(base, edges=[[0, {"x": 1}]]), "graphs[0].edges[0]"),
        (dict(base, nodes=[{"id": 0, "name": "a", "kind": "tensor"}]), "graphs[0].nodes[0].kind"),
        (dict(base, torchviz={"nodes": [{"id": "n1\"];evil", "label": "x"}], "edges": []}), "graphs[0].torchviz"),
        (dict(base, torchviz={"nodes": [{"id": "n1", "label": "x", "fill": "red\" URL=\"x"}], "edges": []}),
         "graphs[0].torchviz.nodes[0].fill"),
        (dict(base, torchviz={"nodes": [], "edges": [{"tail": "n1", "head": "n2", "style": "invis"}]}),
         "graphs[0].torchviz.edges[0].style"),
        (dict(base, torchviz="digraph { a [URL=\"javascript:x\"] }"), "graphs[0].torchviz"),
    ):
        refusal(tmp_path, document(_events(1), graphs=[graph]), phrase)


# ---------------------------------------------------------------- meta

META_WRONG = [
    ("model", 3), ("mode", ["reentrant"]), ("schedule", {"x": 1}), ("description", 1.5), ("look_at", False),
    ("versions", ["3.11"]), ("versions", {"python": 3}), ("sources", ["<script>"]), ("sources", {"a.py:1": 7}),
    ("sources", {"a.py:1": "x" * 401}), ("actions", [["X", 0, 0, 0]]), ("actions", [["F", -1, 0, 0]]),
    ("actions", "F"), ("replay_checks", {"policy": "all"}), ("replay_checks", []), ("distributed", "rank 0"),
    ("distributed", {"world_size": 10**7}), ("distributed", {"world_size": 0}), ("distributed", {"rank": "0"}),
    ("distributed", {"run_id": "../../etc"}), ("distributed", {"run_id": "/abs/path"}),
    ("distributed", {"ranks": [0, -1]}), ("distributed", {"missing_ranks": "1"}), ("partial", "yes"),
    ("partial_reason", ["x"]), ("plan_profile", "a profile"), ("plan_profile", {"blocks": 3}),
]


@pytest.mark.parametrize("key, value", META_WRONG, ids=[f"{k}={v!r}"[:40] for k, v in META_WRONG])
def test_known_meta_fields_of_the_wrong_type_are_refused_naming_them(tmp_path: Path, key: str, value: Any) -> None:
    refusal(tmp_path, document(_events(1), meta={key: value}), "meta", key)


def test_every_known_meta_key_is_checked() -> None:
    from ckpt_viz.trace._codec import _Meta

    assert {k for k, _ in META_WRONG} == set(_Meta.__struct_fields__)


def test_other_meta_keys_are_any_json_and_good_meta_loads(tmp_path: Path) -> None:
    meta = {"model": "mlp", "mode": "split-reentrant", "schedule": None, "versions": {"python": "3.11"},
            "sources": {"train.py:3": "loss.backward()"}, "actions": [["F", 0, 0, 4]], "partial": False,
            "distributed": {"run_id": "run-1.a_b", "world_size": 4, "rank": 0, "ranks": [0, 1]},
            "replay_checks": {"policy": "sampled", "first_checks": 2, "budget": 0.05, "checked": 3, "skipped": 1},
            "anything": [{"deep": [1, None, "x", 2.5, True]}]}
    assert loads(tmp_path, document(_events(1), meta=meta)).meta == meta
    refusal(tmp_path, document(_events(1), meta=[1]), "meta")
    refusal(tmp_path, document(_events(1), meta={"k" * 257: 1}), "meta")


# ---------------------------------------------------------------- schema 2, and the crafted corpus

def test_a_schema_2_document_is_refused_before_its_events_are_read(tmp_path: Path) -> None:
    doc = document(_events(2))
    doc["schema_version"] = 2
    doc["events"] = {"count": 2, "columns": {}}  # the packed layout, not read
    message = refusal_of_version(tmp_path, doc)
    assert "schema version 2, written by an older ckpt_viz" in message
    assert message.splitlines()[1].startswith("Tip: record the run again with this version of ckpt_viz")


def refusal_of_version(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as info:
        Trace.load(path)
    assert str(info.value).startswith(f"ckpt_viz.Trace.load: {path} is a trace of schema version")
    return str(info.value)


REFUSED = {
    "reverse_order": "seq", "duplicate_seq": "events[1].seq", "total_past_2_63": "memory[0].bytes_by_category",
    "int_past_64_bits": "events[0].session_id", "wrong_type_field": "events[0].split",
    "wrong_type_reason": ".reason", "unknown_kind": "events[0]", "handle_id_negative": "events[0].handle_id",
    "sample_past_end": "memory[", "schema_2": "schema version 2", "meta_sources_wrong": "meta",
    "tags_nested": "events[0].tags",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_crafted_refused_traces_are_refused_naming_the_file_and_field(name: str) -> None:
    path = HOSTILE / f"{name}.json.gz"
    with pytest.raises(TraceError) as info:
        Trace.load(path)
    message = str(info.value)
    assert message.startswith(f"ckpt_viz.Trace.load: {path} ") and REFUSED[name] in message, message
    assert len(message.splitlines()) == 2 and message.splitlines()[1].startswith("Tip: "), message


def test_the_crafted_corpus_is_what_the_tests_know() -> None:
    assert {p.name.removesuffix(".json.gz") for p in HOSTILE.glob("*.json.gz")} == set(REFUSED)


def test_a_refusal_reads_the_same_from_a_gzip_file(tmp_path: Path) -> None:
    events = _events(2)
    events[1]["handle_id"] = "h3"
    refusal(tmp_path, document(events), "events[1].handle_id", "Expected `int | null`, got `str`", gz=True)
