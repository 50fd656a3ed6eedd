"""Text from a trace, a model file or an error, shown as text: the one escape of the app.

Streamlit reads markdown in st.markdown, st.caption, st.info / st.warning / st.error / st.success,
headings, metric labels, radio options and expander labels. A label, tag, site, reason, detail,
description, "what to look at", file name or error message is data: a page puts it there only
through `md(text)`, or shows it with st.code / st.text / a dataframe, which show text as it is.

NOTE [ Text as text ]
  1. `md` backslash-escapes every ASCII punctuation character (CommonMark allows it for each of them),
     so no markdown, HTML, directive (`:red[...]`), icon or math syntax survives: `![](http://x/y)`,
     `<img src=x onerror=...>`, `**bold**` and `$x$` are shown as their characters.
  2. GitHub's autolinks are found in the text after parsing, where an escape no longer shows: a
     word joiner (U+2060, invisible) after "http", "https", "ftp", "www" and "@" keeps
     `http://host/...`, `www.host` and `name@host` from becoming links.
  3. Line breaks stay line breaks and leading spaces stay (as no-break spaces), so an error's
     traceback-like lines keep their shape.
"""
from __future__ import annotations

import re

__all__ = ["md", "md_table"]

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_AUTOLINK = re.compile(r"(?i)\b(?:https?|ftp)(?=:)|\bwww(?=\.)|@")
_JOINER = "\u2060"


def md(text: object) -> str:
    """`text` for an element that reads markdown, shown exactly as its characters (NOTE [ Text as text ])."""
    plain = _AUTOLINK.sub(lambda m: m.group(0) + _JOINER, str(text))
    escaped = _PUNCTUATION.sub(r"\\\1", plain)
    lines = [re.sub(r"^ +", lambda m: "\u00a0" * len(m.group(0)), line) for line in escaped.splitlines()]
    return "  \n".join(lines)


def md_table(rows: list[dict]) -> list[dict[str, str]]:
    """Rows for `st.table`, which reads markdown in every cell and header: each of them through `md`."""
    return [{md(k): md(v) for k, v in row.items()} for row in rows]
