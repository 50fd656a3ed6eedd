"""The README and docs/ as a user meets them: short, runnable as written, linked to what exists (issue 27).

1. README.md is at most 250 lines and starts with the two commands (`bash scripts/app.sh`, `bash scripts/test.sh`).
2. Every ```python block of README.md runs as it is in a fresh interpreter, and every ```bash block whose first
   command is `ckpt-viz` (other than `ckpt-viz app`, which serves until stopped) runs too: one subprocess per
   block, in document order, all in one temporary folder (a later block reads what an earlier one wrote), with
   the repository on PYTHONPATH and `examples/` in view. In a bash block `ckpt-viz` is `python -m ckpt_viz`
   and the line `ckpt-viz app` is skipped. The torchrun start runs for real (gloo, 2 ranks, tiny sizes).
   The examples of docs/*.md run the same way (marked slow: outside the inner loop).
3. Every relative link and image of README.md and docs/*.md names a file that exists, and an `#anchor` a
   heading of that file.
4. The tables of docs/ generated from the code are current (`scripts/docs_tables.py --check`).
5. No doc points outside the repository (`../shared`, the spec's folder).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
ALL_DOCS = [README, *DOCS, ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "HISTORY.md",
            ROOT / "lessons" / "README.md"]
MAX_README_LINES = 250
BLOCK_TIMEOUT_S = 300
# In a bash block: `ckpt-viz` is this checkout's command, and `ckpt-viz app` (a server) is skipped.
BASH_PRELUDE = """set -euo pipefail
ckpt-viz() { if [ "${1:-}" = app ]; then echo "(ckpt-viz app: not started by the test)"; return 0; fi
             "$CKPT_VIZ_PYTHON" -m ckpt_viz "$@"; }
"""


class Block(NamedTuple):
    line: int  # 1-based line of the opening fence
    lang: str
    code: str


def fenced_blocks(text: str) -> list[Block]:
    """Every fenced code block of a markdown text, in order."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"line {i + 1}: a code block that never closes"
        blocks.append(Block(i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return blocks


def _first_command(code: str) -> str:
    return next((ln.strip() for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")


def runnable(block: Block) -> bool:
    """A python block, or a bash block that starts with a `ckpt-viz` command other than `app` (rule 2)."""
    if block.lang == "python":
        return True
    first = _first_command(block.code)
    return block.lang == "bash" and first.startswith("ckpt-viz ") and not first.startswith("ckpt-viz app")


@functools.cache
def runnable_blocks(doc: Path) -> tuple[Block, ...]:
    return tuple(b for b in fenced_blocks(doc.read_text()) if runnable(b))


RUNNABLE = runnable_blocks(README)
DOC_BLOCKS = [(doc, i) for doc in DOCS for i in range(len(runnable_blocks(doc)))]


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run one block in a fresh process in `cwd`, with this repository's ckpt_viz."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "CKPT_VIZ_PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    if block.lang == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-c", BASH_PRELUDE + block.code]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)


@pytest.fixture(scope="module")
def doc_runs(tmp_path_factory: pytest.TempPathFactory):
    """`result(doc, index)`: that runnable block's result, each doc's blocks run once, in order, in one folder."""
    folders: dict[Path, Path] = {}
    results: dict[tuple[Path, int], subprocess.CompletedProcess[str]] = {}

    def result(doc: Path, index: int) -> subprocess.CompletedProcess[str]:
        if doc not in folders:
            folders[doc] = tmp_path_factory.mktemp(doc.stem)
            (folders[doc] / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
        blocks = runnable_blocks(doc)
        for i in range(index + 1):  # the blocks before it first: it may read what they wrote
            if (doc, i) not in results:
                results[doc, i] = run_block(blocks[i], folders[doc])
        return results[doc, index]

    return result


def _is_slow(block: Block) -> bool:
    return "--distributed" in block.code or "torchrun" in block.code


def _marks(doc: Path, index: int) -> list[pytest.MarkDecorator]:
    """`slow` for a block that starts torchrun; `serial` for it and every later block of its doc (which runs it
    first, `doc_runs`): the merge after torchrun checks the ranks' clocks (every receive after its send), aligned
    from round trips that a busy machine stretches unevenly."""
    blocks = runnable_blocks(doc)
    serial = [pytest.mark.serial] if any(_is_slow(b) for b in blocks[:index + 1]) else []
    return ([pytest.mark.slow] if _is_slow(blocks[index]) else []) + serial


# -------------------------------------------------------------------------------------------------- 1. the README


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    body = [ln for ln in lines if ln.strip()]
    assert body[0] == "# ckpt_viz"
    assert body[1] == "```bash" and body[4] == "```", "the first thing after the title is one bash block"
    assert body[2].startswith("bash scripts/app.sh") and body[3].startswith("bash scripts/test.sh")


def test_the_readme_has_the_three_starts() -> None:
    runs = [b for b in RUNNABLE if b.lang == "python"]
    assert runs, "the README's own training step (start 2) is a python block"
    assert any("ckpt_viz.record(" in b.code and "torch.utils.checkpoint" in b.code for b in runs)
    commands = [_first_command(b.code) for b in RUNNABLE if b.lang == "bash"]
    assert any(c.startswith("ckpt-viz record ") and "--distributed" not in c for c in commands)
    assert any(c.startswith("ckpt-viz record --distributed") for c in commands), "the torchrun start runs"


@pytest.mark.parametrize("index", [pytest.param(i, marks=_marks(README, i)) for i in range(len(RUNNABLE))],
                         ids=[f"README.md:{b.line}:{b.lang}" for b in RUNNABLE])
def test_readme_block_runs_as_it_is(doc_runs, index: int) -> None:
    _assert_ran(README, index, doc_runs(README, index))


@pytest.mark.slow  # the examples of docs/ are checked like the README's, outside the inner loop
@pytest.mark.parametrize(("doc", "index"), [pytest.param(d, i, marks=_marks(d, i)) for d, i in DOC_BLOCKS],
                         ids=[f"{d.name}:{runnable_blocks(d)[i].line}:{runnable_blocks(d)[i].lang}"
                              for d, i in DOC_BLOCKS])
def test_doc_block_runs_as_it_is(doc_runs, doc: Path, index: int) -> None:
    _assert_ran(doc, index, doc_runs(doc, index))


def _assert_ran(doc: Path, index: int, done: subprocess.CompletedProcess[str]) -> None:
    block = runnable_blocks(doc)[index]
    assert done.returncode == 0, (f"{doc.relative_to(ROOT)} line {block.line} ({block.lang}) exited "
                                  f"{done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def test_block_runner_sees_a_failing_block(tmp_path: Path) -> None:
    text = "```python\nraise SystemExit(3)\n```\n\n```bash\nckpt-viz app\nckpt-viz nothing-such\n```\n"
    python, bash = fenced_blocks(text)
    assert runnable(python) and not runnable(bash), "a block that starts with `ckpt-viz app` is not run"
    assert run_block(python, tmp_path).returncode == 3
    bash = bash._replace(code="ckpt-viz app\nckpt-viz nothing-such\n")
    done = run_block(bash, tmp_path)
    assert done.returncode == 2 and "ckpt-viz app: not started" in done.stdout, done.stderr


# ------------------------------------------------------------------------------------------------------ 3. links


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def _anchors(path: Path) -> frozenset[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return frozenset(_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M))


def broken_links(path: Path) -> list[str]:
    """The relative links and images of a markdown file whose target file, or heading, does not exist."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)  # code is not a link
    bad = []
    for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            bad.append(f"{target} (no file {where})")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            bad.append(f"{target} (no heading #{anchor} in {where.name})")
    return bad


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_what_exists(path: Path) -> None:
    assert not broken_links(path), f"{path.relative_to(ROOT)}: {broken_links(path)}"


def test_the_readme_links_every_doc() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in re.findall(r"\]\(([^)\s]+)\)", README.read_text())}
    assert not [d.name for d in DOCS if d.resolve() not in linked]


def test_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](there.md) [ok](there.md#a-heading) [web](https://example.org/x) [self](#top)\n# Top\n"
                   "[gone](missing.md) ![gone](img/none.png) [bad](there.md#no-such)\n"
                   "```\n[in code](not-a-link.md)\n```\n")
    assert [b.split(" ")[0] for b in broken_links(doc)] == ["missing.md", "img/none.png", "there.md#no-such"]


# ------------------------------------------------------------------------------------- 4. generated tables, 5. spec


def _docs_tables():
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "scripts" / "docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert _docs_tables().main(["--check"]) == 0, capsys.readouterr().err
    named = {m for d in DOCS for m in re.findall(r"<!-- table:(\w+) -->", d.read_text())}
    assert named == set(_docs_tables().TABLES), "every generated table appears in docs/"


def test_table_check_sees_a_stale_table() -> None:
    tables = _docs_tables()
    stale = "<!-- table:reasons -->\n| reason |\n<!-- /table:reasons -->\n"
    fresh = tables.render(stale)
    assert fresh != stale and "`dw_complete`" in fresh and tables.render(fresh) == fresh


@pytest.mark.parametrize("path", ALL_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_doc_points_outside_the_repository(path: Path) -> None:
    text = path.read_text()
    assert "../shared" not in text and "shared/spec" not in text, (
        f"{path.relative_to(ROOT)} points at the spec outside the repository; say it in docs/ instead")
