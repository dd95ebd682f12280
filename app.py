"""Remat Lab: the Streamlit router. Run with ``streamlit run app.py``.

Sets the page config, shows the shared controls in the sidebar and runs the selected page. The JAX
work runs in a worker process (``remat_lab.worker``), started by the first session.
"""

import sys
from pathlib import Path

from streamlit.runtime.pages_manager import PagesManager

# This app lists its pages with st.navigation. Streamlit's legacy multipage mode (every file in
# pages/ a page, no router) is on for a server whose first sessions start before any st.navigation
# call; switch it off for the whole process before anything else runs (see _sidebar.controls for
# the runs that started before this line).
PagesManager.uses_pages_directory = False

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:  # for "from pages import _sidebar" (never put pages/ itself on the path)
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

st.set_page_config(page_title="Remat Lab", page_icon=":material/autorenew:", layout="wide")

from pages import _mesh  # noqa: E402

_mesh.start_devices()  # $REMAT_LAB_HOST_DEVICES, before anything starts JAX
from pages import _running, _sidebar, _uploads, _visitor  # noqa: E402  (pages/__init__ imports the engine)

_visitor.watch(_running.pool())  # start (and warm) the worker pool; it stops jobs of ended sessions
_uploads.bound()  # uploads under the byte budget before any page is shown (store/upload_budget.py)
EXPLORE = st.Page("pages/explore.py", title="Explore", icon=":material/science:", url_path="start",
                  default=True)  # served at "/": Streamlit ignores a default page's url_path


def _to_explore() -> None:
    """``/explore`` (a link naming the start page): the Explore page at ``/``, settings kept."""
    st.switch_page(EXPLORE, query_params=st.query_params.to_dict())


PAGES = [
    st.Page("pages/begin.py", title="Start", icon=":material/flag:", url_path="begin"),
    EXPLORE,
    st.Page("pages/compare.py", title="Compare policies", icon=":material/compare_arrows:",
            url_path="compare"),
    st.Page("pages/targets.py", title="Targets", icon=":material/developer_board:", url_path="targets"),
    st.Page("pages/sweep.py", title="Sweep", icon=":material/stacked_line_chart:", url_path="sweep"),
    st.Page("pages/advisor.py", title="Advisor", icon=":material/recommend:", url_path="advisor"),
    st.Page("pages/synthesize.py", title="Synthesize", icon=":material/tune:", url_path="synthesize"),
    st.Page("pages/plan.py", title="Plan the run", icon=":material/account_tree:", url_path="plan"),
    # "1_inspect.py": its legacy-mode address is "inspect" (Streamlit drops a leading number), as a
    # cold server's first /inspect request needs; "inspect.py" would shadow the standard library.
    st.Page("pages/1_inspect.py", title="Inspect", icon=":material/code:", url_path="inspect"),
    st.Page("pages/history.py", title="History", icon=":material/history:", url_path="history"),
    st.Page("pages/results.py", title="Open results", icon=":material/upload_file:", url_path="results"),
    st.Page("pages/guide.py", title="Guide", icon=":material/menu_book:", url_path="guide"),
    # Last: at 1400 px the top bar holds the eleven pages above; this one opens from its menu.
    st.Page("pages/published.py", title="Published runs", icon=":material/fact_check:",
            url_path="published"),
    st.Page(_to_explore, title="Explore", url_path="explore", visibility="hidden"),
]
page = st.navigation(PAGES, position="top")
if page.url_path == "explore":  # switch before the controls, so URL warnings show once, on Explore
    page.run()
config = _sidebar.controls(router=True, page=page.url_path)
with _sidebar.routed(config):
    page.run()
