"""Hostile trace files: each gets a clear TraceError (CLI: exit 2, one paragraph, no traceback),
with bounded memory and time, and nothing is read outside the trace (issue 13, "bounded inputs").

The big files are generated here (a gzip bomb is 1 MiB that inflates past the 1 GiB default cap).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from old_layout import as_schema1

from ckpt_viz import Trace, TraceError
from ckpt_viz.events import Event
from ckpt_viz.trace import MemorySample
from ckpt_viz.trace import files as trace_files
from ckpt_viz.trace.files import DEFAULT_MAX_BYTES, TraceFileError

ROOT = Path(__file__).resolve().parent.parent.parent
PASSWD_FIRST = Path("/etc/passwd").read_text().splitlines()[0] if Path("/etc/passwd").is_file() else "root:x:0:0"


def _trace(n: int = 6) -> Trace:
    events = [Event(seq=i, t_ns=1_000 + i, kind="handle_created" if i == 0 else "error", handle_id=0,
                    site="train.py:3", data={"nbytes": 64}) for i in range(n)]
    memory = [MemorySample(seq=i, t_ns=1_000 + i, bytes_by_category={"activations": 8 * i}) for i in range(n)]
    return Trace(events=events, memory=memory, meta={"model": "hand-built"})


def _doc(tmp_path: Path) -> dict[str, Any]:
    _trace().save(tmp_path / "good.json")
    return json.loads((tmp_path / "good.json").read_text())


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
         prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "ckpt_viz", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def _assert_clear_error(result: subprocess.CompletedProcess[str], path: str, *phrases: str) -> str:
    message = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr
    assert message.startswith(f"ckpt_viz.Trace.load: cannot read '{path}': "), message
    lines = message.splitlines()
    assert len(lines) == 2 and lines[1].startswith("Tip: ") and message.endswith("."), message  # one paragraph
    for phrase in phrases:
        assert phrase in message, message
    return message


# ---------------------------------------------------------------- the corpus

@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1 MiB .json.gz that inflates to 1.06 GiB: past the default cap (one gzip member, as a real bomb)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.json.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * (16 << 20)
    with open(path, "wb") as f:
        f.write(packer.compress(b'{"format": "ckpt_viz.trace", "schema_version": 1, "meta": {"pad": "'))
        for _ in range((DEFAULT_MAX_BYTES >> 24) + 4):
            f.write(packer.compress(block))
        f.write(packer.compress(b'"}}') + packer.flush())
    assert path.stat().st_size < 2 << 20
    return path


def test_gzip_bomb_is_refused_quickly_with_bounded_memory(bomb: Path) -> None:
    # A wrapper process, so that RUSAGE_CHILDREN sees the CLI alone (not the other tests' children).
    probe = ("import json, resource, subprocess, sys, time; t = time.monotonic(); "
             "r = subprocess.run([sys.executable, '-m', 'ckpt_viz', 'info', sys.argv[1]], capture_output=True, "
             "text=True, timeout=120); print(json.dumps({'rc': r.returncode, 'err': r.stderr, "
             "'s': time.monotonic() - t, 'kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")
    out = subprocess.run([sys.executable, "-c", probe, str(bomb)], capture_output=True, text=True, timeout=150,
                         cwd=ROOT, check=True)
    report = json.loads(out.stdout)
    result = subprocess.CompletedProcess([], report["rc"], "", report["err"])
    _assert_clear_error(result, str(bomb), f"inflates to more than {DEFAULT_MAX_BYTES:,} bytes",
                        "CKPT_VIZ_TRACE_MAX_BYTES")
    assert report["kib"] < 500 * 1024, f"the CLI peaked at {report['kib'] // 1024} MiB on a refused bomb"
    assert report["s"] < 60, report["s"]


def test_gzip_bomb_under_a_smaller_cap_from_the_environment(bomb: Path) -> None:
    result = _cli("info", str(bomb), env={"CKPT_VIZ_TRACE_MAX_BYTES": str(8 << 20)})
    _assert_clear_error(result, str(bomb), "inflates to more than 8,388,608 bytes")


def test_dev_zero_is_not_read() -> None:
    _assert_clear_error(_cli("info", "/dev/zero", timeout=30), "/dev/zero", "not a regular file but a character device")


def test_a_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    _assert_clear_error(_cli("info", str(fifo), timeout=30), str(fifo), "not a regular file but a FIFO")


@pytest.mark.parametrize("name", ["/proc/self/mem", "/proc/self/environ"])
def test_proc_files_are_not_read(name: str) -> None:
    result = _assert_clear_error(_cli("info", name, timeout=30), name, "/proc or /sys")
    assert "PATH=" not in result


def test_a_folder(tmp_path: Path) -> None:
    _assert_clear_error(_cli("info", str(tmp_path)), str(tmp_path), "it is a folder")


def test_a_symlink_loop(tmp_path: Path) -> None:
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    _assert_clear_error(_cli("info", str(tmp_path / "a.json")), str(tmp_path / "a.json"), "symbolic link loop")


def test_a_name_too_long(tmp_path: Path) -> None:
    name = str(tmp_path / ("t" * 300 + ".json"))
    _assert_clear_error(_cli("info", name), name, "the name is too long")


AS_NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


def test_an_unreadable_file(tmp_path: Path) -> None:
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
        _assert_clear_error(_cli("info", str(path), prefix=prefix), str(path), "permission denied")
    finally:
        for p in folder.glob("*"):
            p.unlink()
        folder.rmdir()


def _hostile_doc(tmp_path: Path, mutate: Any) -> Path:
    doc = _doc(tmp_path)
    mutate(doc)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(doc))
    return path


HUGE = [
    (lambda d: d["memory"]["bytes_by_category"]["activations"].__setitem__(2, 10**40),
     "memory[2].bytes_by_category.activations is 10000000000000000000000000000000000000000, expected 0 to 2**63-1"),
    (lambda d: d["memory"]["bytes_by_category"]["activations"].__setitem__(2, 1e40),
     "memory[2].bytes_by_category.activations is 1e+40 (a number), expected an integer"),
    (lambda d: d["events"]["columns"]["data"]["values"][1][0].__setitem__(2, 1e40),  # event 3: context 1, row 2
     "events[3].data.nbytes is 1e+40 (a number), expected 0 to 2**63-1 bytes"),
    (lambda d: _schema1(d)["events"]["columns"]["data"][3].__setitem__("nbytes", 1e40),  # the old layout
     "events[3].data.nbytes is 1e+40 (a number), expected 0 to 2**63-1 bytes"),
    (lambda d: d["memory"]["columns"]["device_allocated"].__setitem__(1, 2**63),
     "memory[1].device_allocated is 9223372036854775808, expected 0 to 2**63-1 bytes"),
    (lambda d: d["events"]["columns"]["t_ns_delta"].__setitem__(2, -10**6),
     "events[2].t_ns is -998999, expected a time in ns"),
    (lambda d: d["events"]["columns"].__setitem__("seq", {"start": 2**63}), "'events.columns.seq.start' is 9223"),
    (lambda d: d["events"]["columns"]["handle_id"].__setitem__(4, -1), "events[4].handle_id is -1, expected an id"),
    (lambda d: d["meta"].__setitem__("sources", {"train.py:3": "x" * 301}), "meta.sources['train.py:3'] is"),
]


def _schema1(doc: dict[str, Any]) -> dict[str, Any]:
    doc.update(as_schema1(doc))  # in place: the mutations above edit the document they are given
    return doc


@pytest.mark.parametrize("mutate, phrase", HUGE, ids=[p[:40] for _, p in HUGE])
def test_numbers_out_of_range_are_refused_naming_the_field(tmp_path: Path, mutate: Any, phrase: str) -> None:
    path = _hostile_doc(tmp_path, mutate)
    _assert_clear_error(_cli("info", str(path)), str(path), phrase)


@pytest.mark.parametrize("schema", [1, 2])
def test_an_overflowing_float_is_refused(tmp_path: Path, schema: int) -> None:
    path = tmp_path / "t.json"
    if schema == 1:
        text = json.dumps(as_schema1(_doc(tmp_path))).replace('"nbytes": 64', '"norm": 1e999', 1)
    else:
        doc = _doc(tmp_path)
        doc["events"]["columns"]["data"]["keys"][0] = ["norm"]
        text = json.dumps(doc).replace("[[[64]]", "[[[1e999]]", 1)
    path.write_text(text)
    with pytest.raises(TraceError, match=r"events\[0\]\.data\.norm is inf \(a number\), expected a finite number"):
        Trace.load(path)


def test_a_site_pointing_at_etc_passwd_shows_nothing_from_it(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "app"))
    try:
        from ui.show import source_line
    finally:
        sys.path.remove(str(ROOT / "app"))
    trace = _trace()
    trace.events = [Event(seq=e.seq, t_ns=e.t_ns, kind=e.kind, handle_id=0, site="/etc/passwd:1") for e in trace]
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    assert source_line("/etc/passwd:1", loaded) == "(source not recorded)"
    assert source_line("../../../../etc/passwd:1", loaded) == "(source not recorded)"
    result = _cli("info", str(tmp_path / "t.json"))
    assert result.returncode == 0 and PASSWD_FIRST not in result.stdout + result.stderr


# ---------------------------------------------------------------- caps and limits in the API

def test_caps_are_keyword_arguments_and_environment_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.json.gz"
    _trace(10).save(path)
    assert len(Trace.load(path, max_events=10).events) == 10
    with pytest.raises(TraceError, match=r"it holds 10 events, over the cap of 9(.|\n)*max_events"):
        Trace.load(path, max_events=9)
    size = len(gzip.decompress(path.read_bytes()))
    with pytest.raises(TraceError, match=f"inflates to more than {size - 1:,} bytes"):
        Trace.load(path, max_bytes=size - 1)
    assert len(Trace.load(path, max_bytes=size)) == 10
    monkeypatch.setenv("CKPT_VIZ_TRACE_MAX_EVENTS", "5")
    with pytest.raises(TraceError, match="over the cap of 5"):
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


def test_multi_member_gzip_still_loads(tmp_path: Path) -> None:
    _trace().save(tmp_path / "t.json")
    raw = (tmp_path / "t.json").read_bytes()
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(raw[:50]) + gzip.compress(raw[50:]))
    assert Trace.load(tmp_path / "t.json.gz") == _trace()
    (tmp_path / "bad.json.gz").write_bytes(gzip.compress(raw) + b"junk")
    with pytest.raises(TraceError, match="not a valid gzip file"):
        Trace.load(tmp_path / "bad.json.gz")


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


def test_cli_save_errors_come_before_the_work(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "dir" / "t.json"
    started = time.monotonic()
    result = _cli("record", "mlp", "-o", str(target))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().startswith(f"ckpt-viz record: cannot write '{target}': the folder "), result.stderr
    assert "recording" not in result.stderr and time.monotonic() - started < 60

    _trace().save(tmp_path / "t.json")
    out = tmp_path / "missing" / "x.json"
    result = _cli("export", str(tmp_path / "t.json"), "--perfetto", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().startswith(f"ckpt-viz export: cannot write '{out}': the folder "), result.stderr
    assert _temp_files(tmp_path) == []


def test_export_fsyncs_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_viz.cli import main

    _trace().save(tmp_path / "t.json")
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(trace_files.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(trace_files.os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    assert main(["export", str(tmp_path / "t.json"), "--perfetto", str(tmp_path / "out.json")]) == 0
    assert calls[:2] == ["fsync", "replace"], calls
    assert json.loads((tmp_path / "out.json").read_text())["traceEvents"]
    assert _temp_files(tmp_path) == []


# ---------------------------------------------------------------- source lines come from the trace

SCRIPT = '''
import torch
import ckpt_viz
from ckpt_viz.runtime import checkpoint


def block(x):
    return torch.tanh(x) * 2


def run():
    x = torch.ones(3, requires_grad=True)
    with ckpt_viz.record() as rec:
        y = checkpoint(block, x, use_reentrant=False)  # the recorded line
        y.sum().backward()
    return rec.trace
'''


def test_the_shown_line_is_the_recorded_one_after_the_file_changed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "app"))
    try:
        from ui.show import source_line
    finally:
        sys.path.remove(str(ROOT / "app"))
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location("user_script_h9", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    trace = module.run()
    line = SCRIPT.splitlines().index("        y = checkpoint(block, x, use_reentrant=False)  # the recorded "
                                     "line") + 1
    sites = {e.site for e in trace.events if e.site and e.site.endswith(f":{line}")}
    assert len(sites) == 1, {e.site for e in trace.events}
    site = sites.pop()
    trace.save(tmp_path / "t.json")
    script.write_text(SCRIPT.replace("# the recorded line", "# EDITED AFTER THE RUN"))

    shown = source_line(site, Trace.load(tmp_path / "t.json"))
    assert shown == f"{line}: y = checkpoint(block, x, use_reentrant=False)  # the recorded line"
    result = _cli("export", str(tmp_path / "t.json"), "--perfetto", str(tmp_path / "p.json"))
    assert result.returncode == 0, result.stderr
    exported = (tmp_path / "p.json").read_text()
    assert "# the recorded line" in exported and "EDITED" not in exported


@pytest.mark.parametrize("keep", [1_000, 1 << 27], ids=["inflated twice", "kept"])
def test_gunzip_in_one_call_then_pieces_gives_the_same_bytes_and_errors(monkeypatch: pytest.MonkeyPatch,
                                                                        keep: int) -> None:
    import gzip as gzip_module
    import random
    import zlib

    from ckpt_viz.errors import TraceError
    from ckpt_viz.trace import files

    monkeypatch.setattr(files, "_KEEP", keep)
    monkeypatch.setattr(files, "_IN_PIECE", 512)
    monkeypatch.setattr(files, "_OUT_PIECE", 2048)
    rng = random.Random(7)
    text = "".join(rng.choice(["handle_created", "released", str(rng.random()), "\n"]) for _ in range(20_000)).encode()
    one, two = gzip_module.compress(text[:50_000]), gzip_module.compress(text[50_000:])
    assert files.gunzip_bounded(one + two, 10**7, "api", "t.json.gz") == text  # two members
    assert files.gunzip_bounded(one, 10**7, "api", "t.json.gz") == text[:50_000]
    with pytest.raises(EOFError):
        files.gunzip_bounded(one[:-20], 10**7, "api", "t.json.gz")
    with pytest.raises(EOFError):
        files.gunzip_bounded(one + two[:len(two) // 2], 10**7, "api", "t.json.gz")
    with pytest.raises(gzip_module.BadGzipFile):
        files.gunzip_bounded(one + b"garbage", 10**7, "api", "t.json.gz")
    with pytest.raises((OSError, zlib.error)):
        files.gunzip_bounded(one[:30] + bytes(200) + one[230:], 10**7, "api", "t.json.gz")
    with pytest.raises(TraceError, match="inflates to more than 40,000 bytes"):
        files.gunzip_bounded(one + two, 40_000, "api", "t.json.gz")
