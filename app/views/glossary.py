"""Glossary: the words of every page (memory categories, handle states, DX/DW, reentrant or not), each as the
pages say it (`ckpt_viz.analysis.words`)."""
import streamlit as st

from ckpt_viz.analysis.words import CATEGORY_MEANINGS, category_word, state_word
from ckpt_viz.lessons.glossary import SPLIT_COST, TERMS
from ckpt_viz.vocabulary import STATE_MEANINGS

SECTIONS = {
    "Terms": dict(TERMS),
    "Memory categories": {category_word(c): m for c, m in CATEGORY_MEANINGS.items()},
    "Handle states": {state_word(s): m for s, m in STATE_MEANINGS.items()},
    "Why split modes peak higher": {"split modes": SPLIT_COST},
}

st.title("Glossary")
for section, entries in SECTIONS.items():
    st.subheader(section)
    st.dataframe([{"word": w, "meaning": m} for w, m in entries.items()], hide_index=True, width="stretch")
