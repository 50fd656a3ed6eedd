"""Hostile trace files: each gets a clear TraceError with bounded memory and time, and nothing is read outside the
trace (issue 13, "bounded inputs"; NOTE [ Bounded reads ] in ckpt_viz/trace/files.py).

The big files are generated here (a gzip bomb is 1 MiB that inflates past the 1 GiB default cap). What
`ckpt-viz info` makes of each (exit 2, one paragraph) is tests/trace/test_hostile_cli.py.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from ckpt_viz import Trace, TraceError
from ckpt_viz.analysis.diagnosis import diagnose
from ckpt_viz.errors import TraceFileError
from ckpt_viz.events import Error, HandleCreated
from ckpt_viz.trace import MemorySample
from ckpt_viz.trace import files as trace_files
from traces import refused_trace

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_MAX_BYTES = trace_files.DEFAULT_MAX_BYTES
PASSWD_FIRST = Path("/etc/passwd").read_text().splitlines()[0] if Path("/etc/passwd").is_file() else "root:x:0:0"


def _trace(n: int = 6) -> Trace:
    events = [HandleCreated(seq=0, t_ns=1_000, handle_id=0, site="train.py:3"),
              *(Error(seq=i, t_ns=1_000 + i, handle_id=0, site="train.py:3", where="backward", type="E")
                for i in range(1, n))]
    memory = [MemorySample(seq=i, t_ns=1_000 + i, bytes_by_category={"activations": 8 * i}) for i in range(n)]
    return Trace(events=events, memory=memory, meta={"model": "hand-built"})


def _same(a: Trace, b: Trace) -> bool:
    return (a.events, a.memory, a.graphs, a.meta) == (b.events, b.memory, b.graphs, b.meta)


def _load_in_a_child(path: str, env: dict[str, str] | None = None, timeout: float = 60) -> dict[str, Any]:
    """Trace.load(path) in a fresh interpreter: its error, time and peak memory (a hang is a failure).

    The peak is the child's own (VmHWM: its address space's high-water mark). Not `ru_maxrss`: Linux carries
    that across exec, and subprocess's vfork makes the parent's address space the one exec replaces, so a child
    of a big pytest process would report the parent's size."""
    code = ("import json, sys, time; t = time.monotonic()\n"
            "from ckpt_viz import Trace, TraceError\n"
            "try:\n    Trace.load(sys.argv[1]); err = None\n"
            "except TraceError as e:\n    err = str(e)\n"
            "hwm = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
            "print(json.dumps({'err': err, 's': time.monotonic() - t, 'kib': int(hwm.split()[1])}))")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=timeout,
                         cwd=ROOT, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _assert_clear(message: str | None, path: str, *phrases: str) -> str:
    assert message is not None, "it loaded"
    assert message.startswith("ckpt_viz.Trace.load: ") and path in message.splitlines()[0], message
    lines = message.splitlines()
    assert len(lines) == 2 and lines[1].startswith("Tip: ") and message.endswith("."), message  # one paragraph
    for phrase in phrases:
        assert phrase in message, message
    return message


def _refused(path: Path | str, *phrases: str, **caps: Any) -> str:
    with pytest.raises(TraceError) as info:
        Trace.load(path, **caps)
    return _assert_clear(str(info.value), str(path), *phrases)


# ---------------------------------------------------------------- files that are not traces

@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1 MiB .json.gz that inflates to 1.06 GiB: past the default cap (one gzip member, as a real bomb)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.json.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * (16 << 20)
    with open(path, "wb") as f:
        f.write(packer.compress(b'{"format": "ckpt_viz.trace", "schema_version": 3, "meta": {"pad": "'))
        for _ in range((DEFAULT_MAX_BYTES >> 24) + 4):
            f.write(packer.compress(block))
        f.write(packer.compress(b'"}}') + packer.flush())
    assert path.stat().st_size < 2 << 20
    return path


@pytest.mark.serial  # the child's memory peak (VmHWM) and time (under 60 s)
def test_gzip_bomb_is_refused_quickly_with_bounded_memory(bomb: Path) -> None:
    report = _load_in_a_child(str(bomb), timeout=150)
    _assert_clear(report["err"], str(bomb), f"inflates to more than {DEFAULT_MAX_BYTES:,} bytes",
                  "CKPT_VIZ_TRACE_MAX_BYTES")
    assert report["kib"] < 256 * 1024, f"the load peaked at {report['kib'] // 1024} MiB on a refused bomb"
    assert report["s"] < 60, report["s"]


@pytest.mark.serial  # beside the test above, so the module's bomb is made in one phase only
def test_gzip_bomb_under_a_smaller_cap_from_the_environment(bomb: Path) -> None:
    report = _load_in_a_child(str(bomb), env={"CKPT_VIZ_TRACE_MAX_BYTES": str(8 << 20)})
    _assert_clear(report["err"], str(bomb), "inflates to more than 8,388,608 bytes")


def test_dev_zero_is_not_read() -> None:
    report = _load_in_a_child("/dev/zero", timeout=30)
    _assert_clear(report["err"], "/dev/zero", "not a regular file but a character device")


def test_a_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    report = _load_in_a_child(str(fifo), timeout=30)
    _assert_clear(report["err"], str(fifo), "not a regular file but a FIFO")


@pytest.mark.parametrize("name", ["/proc/self/mem", "/proc/self/environ"])
def test_proc_files_are_not_read(name: str) -> None:
    message = _refused(name, "/proc or /sys")
    assert "PATH=" not in message


def test_a_folder(tmp_path: Path) -> None:
    _refused(tmp_path, "it is a folder")


def test_a_symlink_loop(tmp_path: Path) -> None:
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    _refused(tmp_path / "a.json", "symbolic link loop")


def test_a_name_too_long(tmp_path: Path) -> None:
    _refused(str(tmp_path / ("t" * 300 + ".json")), "the name is too long")


AS_NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


def test_an_unreadable_file() -> None:
    folder = Path(os.path.realpath("/tmp")) / f"ckpt_viz_unreadable_{os.getpid()}"
    folder.mkdir(exist_ok=True)
    try:
        os.chmod(folder, 0o755)
        path = folder / "t.json"
        _trace().save(path)
        os.chmod(path, 0)
        prefix: tuple[str, ...] = ()
        if os.geteuid() == 0:  # root reads any file: read it as the user nobody instead
            try:
                probe = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import ckpt_viz"], cwd=ROOT,
                                       capture_output=True, timeout=60)
            except OSError:
                probe = None
            if probe is None or probe.returncode != 0:
                pytest.skip("running as root without a way to run Python as the user nobody (setpriv): a "
                            "mode-000 file is readable by root, so the case cannot be made")
            prefix = AS_NOBODY
        code = ("import sys\nfrom ckpt_viz import Trace, TraceError\ntry:\n    Trace.load(sys.argv[1])\n"
                "except TraceError as e:\n    print(e); print('errno', e.errno)")
        out = subprocess.run([*prefix, sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        _assert_clear(out.stdout.rsplit("\nerrno", 1)[0].strip(), str(path), "permission denied")
        assert out.stdout.strip().endswith("errno 13")
    finally:
        for p in folder.glob("*"):
            p.unlink()
        folder.rmdir()


# ---------------------------------------------------------------- numbers no page can show

def _doc(tmp_path: Path) -> dict[str, Any]:
    return json.loads(_trace().to_json())


@pytest.mark.parametrize("where, text, phrase", [
    ("session_id", "1e999", "events[1].session_id"),
    ("t_ns", "1e40", "events[1].t_ns"),
    ("handle_id", "1.5", "events[1].handle_id"),
    ("seq", "-1", "events[1].seq"),
    ("thread_id", "18446744073709551616", "events[1].thread_id"),
])
def test_a_number_no_field_can_hold_is_refused_naming_it(tmp_path: Path, where: str, text: str, phrase: str) -> None:
    doc = _doc(tmp_path)
    doc["events"][1][where] = "@@"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc).replace('"@@"', text))
    _refused(path, phrase)


def test_memory_totals_no_page_can_add_up_are_refused(tmp_path: Path) -> None:
    # Totals over 2**63 crashed the Overview and Memory pages while `info` reported a peak "at event 10**12".
    doc = _doc(tmp_path)
    doc["memory"][2]["bytes_by_category"]["activations"] = 10**40
    (tmp_path / "t.json").write_text(json.dumps(doc))
    _refused(tmp_path / "t.json", "memory[2].bytes_by_category")
    doc["memory"][2]["bytes_by_category"]["activations"] = 2**63 + 5
    (tmp_path / "t.json").write_text(json.dumps(doc))
    _refused(tmp_path / "t.json", "memory[2].bytes_by_category")


# ---------------------------------------------------------------- caps and limits in the API

def test_caps_are_keyword_arguments_and_environment_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.json.gz"
    _trace(10).save(path)
    assert len(Trace.load(path, max_events=10).events) == 10
    _refused(path, "it holds more than 9 events (the cap", "max_events", max_events=9)
    size = len(gzip.decompress(path.read_bytes()))
    with pytest.raises(TraceError, match=f"inflates to more than {size - 1:,} bytes"):
        Trace.load(path, max_bytes=size - 1)
    assert len(Trace.load(path, max_bytes=size)) == 10
    monkeypatch.setenv("CKPT_VIZ_TRACE_MAX_EVENTS", "5")
    with pytest.raises(TraceError, match="more than 5 events"):
        Trace.load(path)
    monkeypatch.setenv("CKPT_VIZ_TRACE_MAX_EVENTS", "many")
    with pytest.raises(TraceError, match=r"CKPT_VIZ_TRACE_MAX_EVENTS='many' is not a positive whole number"):
        Trace.load(path)
    with pytest.raises(TraceError, match=r"max_bytes=0 is not a positive whole number"):
        Trace.load(path, max_bytes=0)
    plain = tmp_path / "t.json"
    _trace(10).save(plain)
    with pytest.raises(TraceError, match=f"the file holds {plain.stat().st_size:,} bytes, over the cap of 100 "):
        Trace.load(plain, max_bytes=100, max_events=10)


def test_the_event_cap_stops_the_decode_of_a_long_list(tmp_path: Path) -> None:
    # The cap is part of the decoder's type: a file of many small events is refused without building them all.
    events = [{"kind": "memory_sampled", "seq": i, "t_ns": i} for i in range(50_000)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "ckpt_viz.trace", "schema_version": 3, "events": events}))
    _refused(path, "it holds more than 1,000 events", max_events=1_000)
    assert len(Trace.load(path, max_events=50_000).events) == 50_000


def test_multi_member_gzip_still_loads(tmp_path: Path) -> None:
    _trace().save(tmp_path / "t.json")
    raw = (tmp_path / "t.json").read_bytes()
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(raw[:50]) + gzip.compress(raw[50:]))
    assert _same(Trace.load(tmp_path / "t.json.gz"), _trace())
    (tmp_path / "bad.json.gz").write_bytes(gzip.compress(raw) + b"junk")
    _refused(tmp_path / "bad.json.gz", "not a valid gzip file")


# ---------------------------------------------------------------- saves

def _temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*.tmp"))


def test_save_into_a_missing_folder_names_the_users_path(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "dir" / "t.json"
    with pytest.raises(TraceFileError) as info:
        _trace().save(target)
    message = str(info.value)
    assert message.startswith(f"ckpt_viz.Trace.save: cannot write '{target}': the folder "), message
    assert ".tmp" not in message and "\nTip: create it first" in message
    assert isinstance(info.value, OSError) and info.value.errno == 2


@pytest.mark.parametrize("race", [False, True])
def test_a_failed_rename_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, race: bool) -> None:
    target = tmp_path / "t.json"
    target.mkdir()
    (target / "inside").write_text("kept")
    if race:  # the folder appears after the check: the rename itself fails
        monkeypatch.setattr(trace_files.os.path, "isdir", lambda name: False)
    with pytest.raises(TraceError, match=f"cannot write '{target}': it is a folder") as info:
        _trace().save(target)
    assert ".tmp" not in str(info.value)
    assert _temp_files(tmp_path) == []
    assert (target / "inside").read_text() == "kept"


# ---------------------------------------------------------------- source lines come from the trace

SCRIPT = '''
import torch
import ckpt_viz
from ckpt_viz.runtime import checkpoint, recompute_handle_collector_ctx


def block(x):
    return torch.tanh(x) * 2


def run():
    x = torch.ones(3, requires_grad=True)
    with ckpt_viz.record() as rec:
        with recompute_handle_collector_ctx() as handles:
            y = checkpoint(block, x, use_reentrant=True)
        y.sum().backward(retain_graph=True)  # the recorded line
        try:
            y.sum().backward()
        except ckpt_viz.HandleReleasedError:
            pass
    return rec.trace
'''


def test_the_shown_line_is_the_recorded_one_after_the_file_changed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location("user_script_h9", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    trace = module.run()
    line = SCRIPT.splitlines().index("        y.sum().backward(retain_graph=True)  # the recorded line") + 1
    site = next(e.site for e in trace.events if e.kind == "released")
    assert site.endswith(f"user_script.py:{line}"), site
    assert trace.meta["sources"][site] == "y.sum().backward(retain_graph=True)  # the recorded line"
    trace.save(tmp_path / "t.json")
    script.write_text(SCRIPT.replace("# the recorded line", "# EDITED AFTER THE RUN"))

    (finding,) = diagnose(Trace.load(tmp_path / "t.json"))
    assert finding.code == "released_by_ordinary_backward" and finding.site == site
    assert "y.sum().backward(retain_graph=True)  # the recorded line" in finding.explanation
    assert "EDITED" not in finding.explanation


def test_a_site_pointing_at_etc_passwd_shows_nothing_from_it(tmp_path: Path) -> None:
    import msgspec

    trace = refused_trace()
    trace.events[:] = [msgspec.structs.replace(e, site="/etc/passwd:1") for e in trace.events]
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    (finding,) = diagnose(loaded)
    assert "/etc/passwd:1" in finding.explanation and PASSWD_FIRST not in finding.explanation
    loaded.meta["sources"] = {"../../../../etc/passwd:1": "shown only because the trace says so"}
    assert PASSWD_FIRST not in "".join(f.explanation for f in diagnose(loaded))


# ---------------------------------------------------------------- the capped gunzip itself

@pytest.mark.parametrize("keep", [1_000, 1 << 27], ids=["inflated twice", "kept"])
def test_gunzip_in_one_call_then_pieces_gives_the_same_bytes_and_errors(monkeypatch: pytest.MonkeyPatch,
                                                                        keep: int) -> None:
    monkeypatch.setattr(trace_files, "_KEEP", keep)
    monkeypatch.setattr(trace_files, "_KEEP_RATIO", 0)
    monkeypatch.setattr(trace_files, "_IN_PIECE", 512)
    monkeypatch.setattr(trace_files, "_OUT_PIECE", 2048)
    rng = random.Random(7)
    text = "".join(rng.choice(["handle_created", "released", str(rng.random()), "\n"]) for _ in range(20_000)).encode()
    one, two = gzip.compress(text[:50_000]), gzip.compress(text[50_000:])
    assert trace_files.gunzip_bounded(one + two, 10**7, "api", "t.json.gz") == text  # two members
    assert trace_files.gunzip_bounded(one, 10**7, "api", "t.json.gz") == text[:50_000]
    with pytest.raises(EOFError):
        trace_files.gunzip_bounded(one[:-20], 10**7, "api", "t.json.gz")
    with pytest.raises(EOFError):
        trace_files.gunzip_bounded(one + two[:len(two) // 2], 10**7, "api", "t.json.gz")
    with pytest.raises(gzip.BadGzipFile):
        trace_files.gunzip_bounded(one + b"garbage", 10**7, "api", "t.json.gz")
    with pytest.raises((OSError, zlib.error)):
        trace_files.gunzip_bounded(one[:30] + bytes(200) + one[230:], 10**7, "api", "t.json.gz")
    with pytest.raises(TraceError, match="inflates to more than 40,000 bytes"):
        trace_files.gunzip_bounded(one + two, 40_000, "api", "t.json.gz")


def test_a_trace_ckpt_viz_wrote_is_inflated_once_past_the_fixed_keep(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """NOTE [ Bounded reads ], rule 2: what is kept on the first pass grows with the compressed size, so a trace
    (which inflates about 11 times) is not inflated twice once it is past 128 MiB; a bomb still is dropped."""
    calls: list[int] = []
    inflate = trace_files._inflate

    def counted(raw: bytes, max_bytes: int, keep: int) -> tuple[bytes | None, int]:
        calls.append(keep)
        return inflate(raw, max_bytes, keep)

    monkeypatch.setattr(trace_files, "_inflate", counted)
    monkeypatch.setattr(trace_files, "_KEEP", 1_000)  # as if the trace were bigger than the fixed keep
    trace = refused_trace()
    trace.save(tmp_path / "t.json.gz")
    assert Trace.load(tmp_path / "t.json.gz").events == trace.events
    assert len(calls) == 1, calls
    calls.clear()
    packed = gzip.compress(b" " * (4 << 20))  # 4 MiB inflated from 4 KiB: past 16 times its size, not kept
    assert trace_files.gunzip_bounded(packed, 10**8, "api", "b.json.gz") == b" " * (4 << 20)
    assert len(calls) == 2 and calls[0] < 4 << 20, calls
