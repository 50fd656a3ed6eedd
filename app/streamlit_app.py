"""ckpt_viz app: `streamlit run app` (from the repository root). Routes to the pages in app/views/.

Nothing the browser loads leaves 127.0.0.1: the page icon is a local file (a `:material/...` page
icon makes the browser fetch its picture from fonts.gstatic.com); the icons of the navigation and
the buttons are drawn with the Material Symbols font that Streamlit serves itself.
"""
from pathlib import Path

import streamlit as st

from ui.source import source_sidebar
from ui.url import publish, restore

# While a run is slow (a big trace loading), Streamlit dims what the page showed before: from 0.5 s on it fades
# to a third of its opacity over 1 s, a smooth transition on every element that repaints the page at each frame
# (in a Chromium without a GPU about 0.3 s of CPU per second of waiting, taken from the server's cores). The same
# dimming, at the same times and to the same opacity, in three steps: three repaints.
STALE_FADE = '.stElementContainer[data-stale="true"] {transition: opacity 1s steps(3, jump-end) 0.5s !important}'

st.set_page_config(page_title="ckpt_viz", page_icon=str(Path(__file__).parent / "assets" / "icon.png"),
                   layout="wide")
st.html(f"<style>{STALE_FADE}</style>")
pg = st.navigation({
    "Run": [st.Page("views/overview.py", title="Overview", icon=":material/home:", default=True)],
    "Explore": [st.Page("views/graph.py", title="Autograd graph", icon=":material/account_tree:"),
                st.Page("views/memory.py", title="Memory", icon=":material/memory:"),
                st.Page("views/handles.py", title="Handles", icon=":material/bug_report:"),
                st.Page("views/debugger.py", title="Debugger", icon=":material/troubleshoot:"),
                st.Page("views/routing.py", title="Routing (DX/DW)", icon=":material/alt_route:"),
                st.Page("views/timeline.py", title="Schedule timeline", icon=":material/view_timeline:"),
                st.Page("views/events.py", title="Events", icon=":material/list:")],
    "Compare": [st.Page("views/compare.py", title="Compare", icon=":material/compare:")],
    "Plan": [st.Page("views/plan.py", title="Plan", icon=":material/savings:")],
    "Learn": [st.Page("views/lessons.py", title="Lessons", icon=":material/school:"),
              st.Page("views/glossary.py", title="Glossary", icon=":material/menu_book:")],
})
st.sidebar.page_link("views/glossary.py", label="Glossary: the words on every page", icon=":material/menu_book:")
restore()  # the URL's view, when this session did not write it: a reload, a link, the back button (ui/url.py)
publish(source_sidebar())  # drawn here, not in a page, so the choice survives page changes (NOTE in cursor.py)
pg.run()
