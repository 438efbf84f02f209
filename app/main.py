"""rankscope dashboard entry: declares the pages and the run picker they share.

streamlit run app/main.py -- --data-dir D      (or: rankscope dashboard --data-dir D)
"""

from pathlib import Path

import duckdb
import streamlit as st

from app import state

# Not "pages/": Streamlit would also serve that folder as a legacy multipage app.
PAGES = Path(__file__).parent / "views"

# An emoji favicon is drawn in the page (a data: URL); a ":material/...:" one is fetched from
# fonts.gstatic.com, which fails offline and tells a third party who opened the dashboard.
st.set_page_config(page_title="rankscope", page_icon="📈", layout="wide")
page = st.navigation(
    {
        "Runs": [
            st.Page(PAGES / "runs.py", title="Runs", icon=":material/list:", default=True),
            st.Page(PAGES / "overview.py", title="Overview", icon=":material/dashboard:"),
        ],
        "Distributed": [
            st.Page(PAGES / "comms.py", title="Comms", icon=":material/swap_horiz:"),
            st.Page(PAGES / "stragglers.py", title="Stragglers", icon=":material/hourglass_bottom:"),
            st.Page(PAGES / "liveness.py", title="Liveness", icon=":material/heart_broken:"),
            st.Page(PAGES / "pipeline.py", title="Pipeline", icon=":material/view_timeline:"),
        ],
        "Model": [
            st.Page(PAGES / "flops.py", title="FLOPS", icon=":material/account_tree:"),
            st.Page(PAGES / "memory.py", title="Memory", icon=":material/memory:"),
            st.Page(PAGES / "moe.py", title="MoE", icon=":material/hub:"),
        ],
        "Query": [st.Page(PAGES / "sql.py", title="SQL console", icon=":material/terminal:")],
    }
)
state.sidebar_picker()
# Every page: a stuck or hung collective, a mismatch or a silent rank is news wherever one looks.
# It sits above the page but is worked out after it (the live collector asked, or the liveness
# tables read): the page's first chart does not wait for it.
banner = st.container()
try:
    page.run()
except duckdb.Error as exc:  # e.g. a damaged segment: say so instead of showing a traceback
    st.error(f"Could not read this run's data: {exc}")
with banner:
    state.liveness_banner()
state.skipped_segments_notice()
