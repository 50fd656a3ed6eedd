"""A recording's memory samples kept as columns as they come (`RecordedMemory`, NOTE [ Lazy events ], rule 5,
in ckpt_viz/trace/rows.py): they read as the MemorySamples, save to the same bytes, load back equal, and a bad
value is still refused on save. No torch.
"""
from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

from ckpt_viz import TraceError
from ckpt_viz.trace import MemorySample, Trace
from ckpt_viz.trace.rows import RecordedMemory


def samples() -> list[MemorySample]:
    """Samples with every case keep meets: the same categories, one missing, one first measured late, stages."""
    out = []
    for i in range(40):
        reading = {"parameters": 4096, "activations": 100 * i}
        if i % 7 == 3:
            del reading["activations"]  # not measured in this sample
        if i >= 20:
            reading["replay_activations"] = i  # first measured at sample 20
        stages = {str(i % 2): {"activations": i}} if i % 5 == 0 else {}
        out.append(MemorySample(seq=3 * i, t_ns=1_000 + 10 * i, bytes_by_category=reading,
                                device_allocated=None if i % 2 else 8 * i, by_stage=stages))
    return out


def kept(source: list[MemorySample]) -> RecordedMemory:
    memory = RecordedMemory()
    for s in source:
        memory.keep(s.seq, s.t_ns, s.bytes_by_category, s.device_allocated, s.by_stage)
    return memory


def test_kept_samples_read_as_the_samples() -> None:
    source = samples()
    memory = kept(source)
    assert len(memory) == 40 and memory == source and list(memory) == source
    assert memory[3] == source[3] and memory[-1] == source[-1] and memory[5:9] == source[5:9]
    assert "activations" not in memory[3].bytes_by_category  # a gap reads as the category being absent
    assert memory.columns["bytes_by_category"]["replay_activations"][:20] == [None] * 20


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_kept_samples_save_the_bytes_of_the_samples_and_load_back_equal(tmp_path: Path, suffix: str) -> None:
    source = samples()
    Trace(memory=source).save(tmp_path / ("list" + suffix))
    Trace(memory=kept(source)).save(tmp_path / ("kept" + suffix))
    assert (tmp_path / ("kept" + suffix)).read_bytes() == (tmp_path / ("list" + suffix)).read_bytes()
    assert list(Trace.load(tmp_path / ("kept" + suffix)).memory) == source


def test_no_stages_save_as_null(tmp_path: Path) -> None:
    source = [MemorySample(seq=i, t_ns=i, bytes_by_category={"other": i}) for i in range(10)]
    memory = kept(source)
    assert memory.saved_columns()["by_stage"] is None and memory.saved_columns()["seq"] == range(10)
    Trace(memory=memory).save(tmp_path / "t.json")
    assert list(Trace.load(tmp_path / "t.json").memory) == source


@pytest.mark.parametrize(("field", "bad", "named"), [
    ("bytes", -1, "memory[2].bytes_by_category.activations is -1"),
    ("bytes", "12", "memory[2].bytes_by_category.activations is '12'"),
    ("device", 1.5, "memory[2].device_allocated"),
    ("stage", {"0": {"activations": -5}}, "memory[2].by_stage['0']"),
])
def test_a_bad_kept_value_is_refused_on_save(tmp_path: Path, field: str, bad: object, named: str) -> None:
    # The values come from a probe: nothing proves their types, so the save checks them as any others.
    memory = kept(samples()[:2])
    memory.keep(6, 2_000, {"parameters": 1, "activations": bad if field == "bytes" else 1},
                bad if field == "device" else None, bad if field == "stage" else {})
    with pytest.raises(TraceError, match=named.replace("[", r"\[").replace("]", r"\]")):
        Trace(memory=memory).save(tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def test_a_write_turns_it_into_a_list_that_later_samples_join() -> None:
    source = samples()
    memory = kept(source[:10])
    memory.append(source[10])  # the list protocol: a plain list from now on
    assert memory.materialized
    for s in source[11:]:
        memory.keep(s.seq, s.t_ns, s.bytes_by_category, s.device_allocated, s.by_stage)
    assert memory == source


def test_a_save_while_samples_arrive_writes_those_kept_before_it(tmp_path: Path) -> None:
    memory = kept(samples()[:10])
    columns = memory.saved_columns()
    memory.keep(99, 9_999, {"parameters": 1}, None, {})  # after the save read its columns
    assert len(columns["t_ns"]) == 10 and all(len(c) == 10 for c in columns["bytes_by_category"].values())


def test_a_copy_or_a_pickle_is_the_list_of_samples() -> None:
    memory = kept(samples())
    assert copy.copy(memory) == samples() and type(copy.copy(memory)) is list
    assert pickle.loads(pickle.dumps(memory)) == samples()
