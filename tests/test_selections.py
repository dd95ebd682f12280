"""Compare keeps its chosen policies when the user goes to another page and comes back."""

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_compare_policies_survive_navigation():
    # Width 256, batch 64, 1000 repeats: not "quick", so each page waits for a click and nothing is
    # compiled or timed here (width 64, batch 8 is quick: Compare would time every policy 1000 times).
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.query_params.update(width="256", batch="64", repeats="1000")
    at.run()
    at.switch_page("pages/compare.py").run()
    assert not at.exception
    assert any("only when you click" in i.value for i in at.info)  # waiting, as on the home page
    at.multiselect(key="compare_policies").set_value(["no_remat", "nothing_saveable"]).run()
    at.switch_page("pages/guide.py").run()
    assert not at.exception and not at.multiselect  # the Compare widget is gone from the page
    at.switch_page("pages/compare.py").run()
    assert not at.exception
    assert at.multiselect(key="compare_policies").value == ["no_remat", "nothing_saveable"]
