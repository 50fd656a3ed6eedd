"""The one palette: a colour for every category, state and part of the step; the cursor's colour is nobody's; the
words beside them (`ckpt_viz.analysis.words`) spell DX and DW in capitals."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from ckpt_viz.analysis import words
from ckpt_viz.analysis.passes import PARTS
from ckpt_viz.render import palette
from ckpt_viz.vocabulary import MEMORY_CATEGORIES, RUN_MODES, STATE_MEANINGS, STATES

HEX = re.compile(r"^#[0-9a-f]{6}$")
ROOT = Path(__file__).resolve().parent.parent.parent


def test_every_category_state_and_part_has_a_colour_in_the_vocabulary_order() -> None:
    assert tuple(palette.CATEGORY_COLOURS) == MEMORY_CATEGORIES
    assert tuple(palette.STATE_COLOURS) == STATES == tuple(palette.STATE_FILLS)
    assert tuple(palette.ACTION_COLOURS) == PARTS == ("F", "DX", "DW", "B")
    assert tuple(palette.MODE_COLOURS) == RUN_MODES
    for table in (palette.CATEGORY_COLOURS, palette.STATE_COLOURS, palette.STATE_FILLS, palette.ACTION_COLOURS,
                  palette.MARK_COLOURS, palette.MODE_COLOURS):
        assert all(HEX.match(c) for c in table.values()), table
    # ... and a word and a meaning for each, in the same order (the words are the analysis's)
    assert tuple(words.CATEGORY_WORDS) == tuple(words.CATEGORY_MEANINGS) == MEMORY_CATEGORIES
    assert tuple(words.STATE_WORDS) == tuple(STATE_MEANINGS) == STATES
    assert tuple(words.PART_WORDS) == PARTS


def test_categories_and_parts_are_told_apart_and_the_cursor_uses_no_other_colour() -> None:
    assert len(set(palette.CATEGORY_COLOURS.values())) == len(MEMORY_CATEGORIES)
    assert len(set(palette.ACTION_COLOURS.values())) == len(PARTS)
    assert len(set(palette.MODE_COLOURS.values())) == len(RUN_MODES)
    others = {*palette.CATEGORY_COLOURS.values(), *palette.STATE_COLOURS.values(), *palette.STATE_FILLS.values(),
              *palette.ACTION_COLOURS.values(), *palette.MARK_COLOURS.values(), *palette.MODE_COLOURS.values(),
              palette.PEAK_COLOUR}
    assert palette.CURSOR_COLOUR not in others


def test_the_palette_holds_colours_only() -> None:
    names = [n for n in palette.__all__ if n != "CURSOR_PICK"]
    for name in names:
        value = getattr(palette, name)
        colours = value.values() if isinstance(value, dict) else [value]
        assert all(HEX.match(c) for c in colours), name
    assert not [n for n in vars(palette) if n.endswith("_WORDS") or n.endswith("_word") or n.endswith("MEANINGS")]


def test_words_spell_dx_and_dw_in_capitals() -> None:
    assert words.phase_word("dx") == "DX" and words.phase_word("dw") == "DW"
    assert words.phase_word(None) == "" and words.phase_word("ordinary") == "ordinary"
    assert words.state_word("phase_dx") == "waiting for DX" and words.state_word("phase_dw") == "waiting for DW"
    assert words.category_word("checkpoint_inputs") == "checkpoint inputs"
    assert words.category_word("new_kind") == "new kind"
    assert words.part_word("DW") == "DW (weight grads)"
    said = [*words.STATE_WORDS.values(), *words.PART_WORDS.values(), *words.PHASE_WORDS.values(),
            *words.CATEGORY_MEANINGS.values(), *words.REASON_WORDS.values()]
    assert not [w for w in said if re.search(r"\bd[xXwW]\b|\bD[xw]\b", w) and not re.search(r"\bD[XW]\b", w)]
    assert not [w for w in said if re.search(r"\bd[XW]\b", w)]


def test_the_palette_imports_nothing_heavy() -> None:
    code = ("import sys\nimport ckpt_viz.render.palette\n"
            "print(sorted(m for m in ('torch', 'altair', 'streamlit', 'graphviz', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]", result.stderr
