"""The per-dot and residual tables at llm scale: grouped by layer and checkpoint name, every dot and byte
kept (checked against the document's own totals), and the page opening the grouped view first."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from remat_lab.present import dot_tables

# A 4-block llm in a loop (37 dots, 79 kept values), from the engine: see the file's "about".
DOC = json.loads((Path(__file__).parent / "fixtures" / "llm_loop_dots.json").read_text())
BLOCKS = DOC["config"]["depth"]


def test_the_fixture_is_llm_sized():
    assert len(DOC["dots"]) > dot_tables.GROUP_ABOVE and len(DOC["residuals"]) > dot_tables.GROUP_ABOVE
    assert {d["layer"].split(".")[0] for d in DOC["dots"] if "." in d["layer"]} == {
        str(b) for b in range(BLOCKS)}


def test_dots_grouped_by_layer_and_name_keep_every_dot():
    groups = dot_tables.dot_groups_frame(DOC)
    tot = DOC["totals"]
    # The document's totals (counted by the dissection, not by this module) are the groups' sums.
    assert groups["dots"].sum() == tot["dots"] == len(DOC["dots"])
    assert groups["saved"].sum() == tot["dots_saved"]
    assert groups["recomputed"].sum() == tot["dots_recomputed"]
    assert groups["unattributed"].sum() == tot["dots_recomputed_in_compiled_unattributed"] > 0
    assert groups["recomputed_in_compiled"].sum() == sum(d["recomputed_in_compiled"] is True
                                                         for d in DOC["dots"])
    assert groups["out_bytes"].sum() == sum(d["out_bytes"] for d in DOC["dots"])
    assert groups["flops"].sum() == sum(d["flops"] for d in DOC["dots"])
    # One row per (layer without its block, checkpoint name): each block layer once, in all blocks.
    keys = list(zip(groups["layer"], groups["name"]))
    assert len(keys) == len(set(keys)) < len(DOC["dots"]) // 3
    assert not any(layer[0].isdigit() for layer, _ in keys)
    rows = groups.set_index(["layer", "name"])
    value = rows.loc[("v_proj", "value_proj")]
    assert value["dots"] == value["blocks"] == BLOCKS
    # minimal saves the value projection, recomputes the attention (whose products XLA's compile
    # cannot tell apart at this size) and needs the query projection in neither way
    assert value["jaxpr"] == "saved"
    assert rows.loc[("attn", "context"), "jaxpr"] == "recomputed"
    assert rows.loc[("q_proj", ""), "jaxpr"] == "neither"
    assert rows.loc[("attn", "context"), "compiled"] == "unknown"
    assert value["compiled"] == "none"


def test_residuals_grouped_keep_every_byte_largest_first():
    groups = dot_tables.residual_groups_frame(DOC)
    assert groups["bytes"].sum() == DOC["totals"]["residual_bytes"]
    assert groups["values"].sum() == len(DOC["residuals"])
    assert list(groups["bytes"]) == sorted(groups["bytes"], reverse=True)
    rows = groups.set_index(["role", "layer", "name"])
    named = rows.loc[("activation", "q_proj", "query_proj")]
    assert named["values"] == named["blocks"] == BLOCKS
    assert named["bytes"] == DOC["totals"]["residual_bytes_by_name"]["query_proj"]
    assert len(groups) < len(DOC["residuals"]) // 3


def test_a_scanned_row_counts_for_every_layer_it_stands_for():
    dots = [{"index": 0, "layer": "l1", "name": "l1", "layers": 3, "lhs_shape": [8, 4], "rhs_shape": [4, 4],
             "out_shape": [8, 4], "has_batch_dims": False, "policy_verdict": "save", "saved": True,
             "offloaded": False, "offloaded_in_compiled": False, "recomputed": False,
             "recomputed_in_compiled": True, "flops": 3 * 256, "out_bytes": 3 * 128, "note": ""}]
    row = dot_tables.dot_groups_frame({"dots": dots}).iloc[0]
    assert (row["dots"], row["blocks"], row["saved"], row["compiled"]) == (3, 3, 3, "all")


def test_the_narrow_views_say_each_dot_in_words_and_show_offloading_only_when_there_is_some():
    each = dot_tables.dot_decisions_frame(DOC)
    assert len(each) == len(DOC["dots"]) and "offloaded" not in each
    assert set(each["recomputed_in_compiled"]) <= {"yes", "no", "not attributable"}
    offloaded = [{**DOC["dots"][0], "offloaded": True, "saved": True}]
    assert "offloaded_in_compiled" in dot_tables.dot_decisions_frame({"dots": offloaded})
    shapes = dot_tables.dot_shapes_frame(DOC)
    assert shapes.loc[0, "lhs"] == "(" + ", ".join(map(str, DOC["dots"][0]["lhs_shape"])) + ")"
    kept = dot_tables.residual_rows_frame(DOC)
    first = DOC["residuals"][0]
    assert kept.loc[0, "value"] == dot_tables.value_text(first["dtype"], first["shape"])
    assert set(kept["memory"]) == {"device"}
    for empty in (dot_tables.dot_groups_frame({}), dot_tables.residual_groups_frame(None)):
        assert isinstance(empty, pd.DataFrame) and empty.empty


@pytest.mark.parametrize(("dtype", "shape", "text"), [
    ("float32", [2, 16, 64], "f32[2,16,64]"), ("bfloat16", [8], "bf16[8]"), ("f32", "(64, 64)", "f32[64,64]"),
    ("bool", [], "pred[]")])
def test_a_value_in_one_short_cell(dtype, shape, text):
    assert dot_tables.value_text(dtype, shape) == text


def _tables_script():
    import json
    from pathlib import Path

    from pages import _run_tables

    doc = json.loads((Path("tests/fixtures/llm_loop_dots.json")).read_text())
    _run_tables.dots_table(doc, "t")
    _run_tables.residuals_table(doc, "t")


def test_the_page_opens_an_llm_s_tables_grouped():
    at = AppTest.from_function(_tables_script, default_timeout=60).run()
    assert not at.exception
    assert at.segmented_control(key="t_dot_view").value == "by layer and name"
    assert at.segmented_control(key="t_res_view").value == "by layer and name"
    assert "jaxpr" in at.dataframe[0].value and len(at.dataframe[0].value) < len(DOC["dots"])
    at.segmented_control(key="t_dot_view").set_value("each dot").run()
    assert len(at.dataframe[0].value) == len(DOC["dots"])


def test_a_document_missing_fields_is_shown_not_miscounted():
    """An older or hand-made document (Open results) may lack fields: nothing is counted from NaN."""
    dots = [{"index": 0, "layer": "1.l1", "saved": True}, {"index": 1, "layer": "1.l1"}]
    groups = dot_tables.dot_groups_frame({"dots": dots})
    assert groups[["layer", "dots", "saved", "recomputed"]].values.tolist() == [["l1", 2, 1, 0]]
    kept = dot_tables.residual_groups_frame({"residuals": [{"index": 0, "bytes": 8}, {"index": 1}]})
    assert kept["bytes"].sum() == 8 and kept["values"].sum() == 2


def test_a_note_every_block_repeats_is_said_once_per_layer():
    lines = dot_tables.note_lines(DOC)
    noted = [d for d in DOC["dots"] if d["note"]]
    assert len(lines) < len(noted)
    q = [line for line in lines if "(q_proj" in line]
    want = [str(d["index"]) for d in noted if d["layer"].endswith(".q_proj")]
    assert q == [f"Dots {', '.join(want)} (q_proj in {BLOCKS} blocks): {noted[0]['note']}"]
    one = {"dots": [{**DOC["dots"][0], "layer": "l1", "note": "a note"}]}
    assert dot_tables.note_lines(one) == ["Dot 0 (l1): a note"]
