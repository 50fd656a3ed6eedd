"""The one palette: a colour and a word for every category, state and action; the cursor's colour is nobody's."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import ckpt_viz
from ckpt_viz.render import palette
from ckpt_viz.trace import MEMORY_CATEGORIES
from ckpt_viz.trace.lifecycle import STATE_MEANINGS, STATES

HEX = re.compile(r"^#[0-9a-f]{6}$")
ROOT = Path(__file__).resolve().parent.parent.parent


def test_every_category_state_and_action_has_a_colour_and_a_word_in_the_vocabulary_order() -> None:
    assert tuple(palette.CATEGORY_COLOURS) == MEMORY_CATEGORIES
    assert tuple(palette.CATEGORY_WORDS) == MEMORY_CATEGORIES
    assert tuple(palette.CATEGORY_MEANINGS) == MEMORY_CATEGORIES
    assert tuple(palette.STATE_COLOURS) == STATES == tuple(palette.STATE_FILLS) == tuple(palette.STATE_WORDS)
    assert tuple(STATE_MEANINGS) == STATES
    assert tuple(palette.ACTION_COLOURS) == palette.ACTIONS == tuple(palette.ACTION_WORDS) == ("F", "DX", "DW", "B")
    for table in (palette.CATEGORY_COLOURS, palette.STATE_COLOURS, palette.STATE_FILLS, palette.ACTION_COLOURS,
                  palette.MARK_COLOURS):
        assert all(HEX.match(c) for c in table.values()), table


def test_categories_and_actions_are_told_apart_and_the_cursor_uses_no_other_colour() -> None:
    assert len(set(palette.CATEGORY_COLOURS.values())) == len(MEMORY_CATEGORIES)
    assert len(set(palette.ACTION_COLOURS.values())) == len(palette.ACTIONS)
    others = {*palette.CATEGORY_COLOURS.values(), *palette.STATE_COLOURS.values(), *palette.STATE_FILLS.values(),
              *palette.ACTION_COLOURS.values(), *palette.MARK_COLOURS.values(), palette.PEAK_COLOUR}
    assert palette.CURSOR_COLOUR not in others


def test_words_spell_dx_and_dw_in_capitals() -> None:
    assert palette.phase_word("dx") == "DX" and palette.phase_word("dw") == "DW"
    assert palette.phase_word(None) == "" and palette.phase_word("ordinary") == "ordinary"
    assert palette.state_word("phase_dx") == "waiting for DX" and palette.state_word("phase_dw") == "waiting for DW"
    assert palette.category_word("checkpoint_inputs") == "checkpoint inputs"
    assert palette.category_word("new_kind") == "new kind"
    assert palette.action_word("DW") == "DW (weight grads)"
    words = [*palette.STATE_WORDS.values(), *palette.ACTION_WORDS.values(), *palette.PHASE_WORDS.values(),
             *palette.CATEGORY_MEANINGS.values()]
    assert not [w for w in words if re.search(r"\bd[xXwW]\b|\bD[xw]\b", w) and not re.search(r"\bD[XW]\b", w)]
    assert not [w for w in words if re.search(r"\bd[XW]\b", w)]


def test_the_palette_is_public_and_imports_nothing_heavy() -> None:
    assert ckpt_viz.palette is palette and "palette" in ckpt_viz.__all__
    code = ("import sys\nimport ckpt_viz.render.palette\n"
            "print(sorted(m for m in ('torch', 'altair', 'streamlit', 'graphviz', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]", result.stderr
