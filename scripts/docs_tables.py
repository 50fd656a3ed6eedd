"""The tables of docs/ that come from the code, so they cannot drift: the diagnosis codes and the event kinds.

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
    """Every diagnosis code of `ckpt_viz.codes.DIAGNOSIS_CODES`: its cause and its fix."""
    from ckpt_viz.codes import DIAGNOSIS_CODES

    rows = ["| code | cause | fix |", "|---|---|---|"]
    for d in DIAGNOSIS_CODES.values():
        rows.append(f"| `{d.code}` | {_cell(d.cause)} | {_cell(d.fix)} |")
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


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


TABLES: dict[str, Callable[[], str]] = {"codes": codes, "kinds": kinds}
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
