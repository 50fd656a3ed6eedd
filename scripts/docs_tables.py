"""The tables of docs/ that come from the code, so they cannot drift: codes, kinds, categories, states, reasons,
broken runs.

    .venv/bin/python scripts/docs_tables.py          # rewrite the tables in docs/*.md
    .venv/bin/python scripts/docs_tables.py --check  # exit 1 if a table differs from the code (tests run this)

A table sits in a doc between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; everything between is replaced.
"""
from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def codes() -> str:
    """Every diagnosis code of `ckpt_viz.codes.DIAGNOSIS_CODES`: its id (docs/debugger.md), cause and fix."""
    from ckpt_viz.codes import DIAGNOSIS_CODES

    rows = ["| id | code | cause | fix |", "|---|---|---|---|"]
    for d in DIAGNOSIS_CODES.values():
        rows.append(f"| {d.spec_id} | `{d.code}` | {_cell(d.cause)} | {_cell(d.fix)} |")
    return "\n".join(rows)


def kinds() -> str:
    """Every event kind of `ckpt_viz.events`: its type, its own fields, and what it records."""
    from ckpt_viz.events import EVENT_TYPES, EventBase

    common = set(EventBase.__struct_fields__)
    rows = ["| kind | type | fields | what it records |", "|---|---|---|---|"]
    for kind, cls in EVENT_TYPES.items():
        own = [f for f in cls.__struct_fields__ if f not in common]
        doc = inspect.getdoc(cls) or ""
        what = doc.split("\n\n")[0] if doc and cls.__doc__ else ""
        rows.append(f"| `{kind}` | `{cls.__name__}` | {', '.join(f'`{f}`' for f in own) or '-'} | {_cell(what)} |")
    return "\n".join(rows)


def categories() -> str:
    """Every memory category of `ckpt_viz.vocabulary.MEMORY_CATEGORIES`: the word the pages use, and its meaning."""
    from ckpt_viz.analysis.words import CATEGORY_MEANINGS, category_word
    from ckpt_viz.vocabulary import MEMORY_CATEGORIES

    rows = ["| category | shown as | what it counts |", "|---|---|---|"]
    for category in MEMORY_CATEGORIES:
        rows.append(f"| `{category}` | {category_word(category)} | {_cell(CATEGORY_MEANINGS.get(category, ''))} |")
    return "\n".join(rows)


def states() -> str:
    """Every handle state of `ckpt_viz.vocabulary.STATES`: the word the pages use, and its meaning."""
    from ckpt_viz.analysis.words import state_word
    from ckpt_viz.vocabulary import STATE_MEANINGS, STATES

    rows = ["| state | shown as | meaning |", "|---|---|---|"]
    rows.extend(f"| `{s}` | {state_word(s)} | {_cell(STATE_MEANINGS[s])} |" for s in STATES)
    return "\n".join(rows)


def reasons() -> str:
    """Every release reason (`ckpt_viz.vocabulary.RELEASE_REASONS`): its words, the code of a later refusal."""
    from ckpt_viz.analysis.words import reason_word
    from ckpt_viz.codes import CODE_FOR_REASON
    from ckpt_viz.vocabulary import RELEASE_REASONS

    rows = ["| reason | shown as | a later refusal is, unless the trace says more |", "|---|---|---|"]
    rows.extend(f"| `{r}` | {reason_word(r)} | `{CODE_FOR_REASON[r]}` |" if r in CODE_FOR_REASON
                else f"| `{r}` | {reason_word(r)} | - |" for r in RELEASE_REASONS)
    return "\n".join(rows)


def broken() -> str:
    """Every broken run to explore (`ckpt_viz.run.broken.broken_scenarios`): what it does, the code it must get."""
    from ckpt_viz.run.broken import broken_scenarios  # imports torch: the runs are real

    rows = ["| run | what it does | finding |", "|---|---|---|"]
    rows.extend(f"| `{name}` | {_cell(s.title)} | `{s.expected_code}` |" for name, s in broken_scenarios().items())
    return "\n".join(rows)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


TABLES: dict[str, Callable[[], str]] = {"codes": codes, "kinds": kinds, "categories": categories, "states": states,
                                        "reasons": reasons, "broken": broken}
_BLOCK = re.compile(r"(<!-- table:(\w+) -->\n)(.*?)(<!-- /table:\2 -->)", re.S)


def render(text: str) -> str:
    """`text` with every table block replaced by the code's table."""
    return _BLOCK.sub(lambda m: f"{m.group(1)}{TABLES[m.group(2)]()}\n{m.group(4)}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table differs from the code")
    args = parser.parse_args(argv)
    stale = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"docs_tables: stale tables in {', '.join(map(str, stale))}; run scripts/docs_tables.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
