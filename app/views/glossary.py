"""Glossary: the words of every page (memory categories, handle states, DX/DW, reentrant or not)."""
import streamlit as st

from ckpt_viz import lessons

st.title("Glossary")
for section, entries in lessons.glossary().items():
    st.subheader(section)
    st.dataframe([{"word": w, "meaning": m} for w, m in entries.items()], hide_index=True, width="stretch")
