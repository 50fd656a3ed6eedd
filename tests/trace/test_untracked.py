"""Events, memory samples and graph snapshots are `gc=False` msgspec Structs (issue 26, item 1): the cyclic
collector never tracks them, so a big loaded trace adds nothing for it to walk (no columns, no pausing or freezing
the collector for it)."""
from __future__ import annotations

import gc
from pathlib import Path

from ckpt_viz.events import EVENT_TYPES
from ckpt_viz.trace import GraphNode, GraphSnapshot, MemorySample, TorchvizGraph, Trace
from traces import split_trace, synthetic_trace


def test_every_event_type_and_trace_part_is_declared_untracked() -> None:
    for cls in (*EVENT_TYPES.values(), MemorySample, GraphSnapshot, GraphNode, TorchvizGraph):
        assert cls.__struct_config__.gc is False and cls.__struct_config__.frozen is True, cls


def test_a_200000_event_trace_loads_without_adding_200000_objects_for_the_collector(tmp_path: Path) -> None:
    path = tmp_path / "big.json.gz"
    synthetic_trace(200_000, memory_every=10).save(path)
    gc.collect()
    before = len(gc.get_objects())
    trace = Trace.load(path)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert len(trace.events) == 200_000 and len(trace.memory) == 20_000
    assert not any(map(gc.is_tracked, trace.events)) and not any(map(gc.is_tracked, trace.memory))
    assert grown < 1_000, f"loading added {grown:,} objects the collector tracks"


def test_the_control_a_tracked_object_per_event_would_show(tmp_path: Path) -> None:
    # The measure sees tracked objects: a dict per event (what `Event.data` was) grows it by one per event.
    gc.collect()
    before = len(gc.get_objects())
    held = [{"i": [i]} for i in range(20_000)]
    assert len(gc.get_objects()) - before >= 20_000 and len(held) == 20_000


def test_tags_and_nested_parts_of_a_loaded_event_are_untracked_too(tmp_path: Path) -> None:
    split_trace().save(tmp_path / "t.json")
    trace = Trace.load(tmp_path / "t.json")
    gc.collect()
    for e in trace.events:
        assert not gc.is_tracked(e) and not gc.is_tracked(e.tags)
        for name in e.__struct_fields__:
            value = getattr(e, name)
            if isinstance(value, tuple):
                assert not gc.is_tracked(value), (e.kind, name)
    assert not any(gc.is_tracked(n) for g in trace.graphs for n in g.nodes)
