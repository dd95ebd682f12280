"""The per-dot and residual tables as the pages show them: narrow views, and grouped by layer and name.

pandas only. A run document's ``dots`` and ``residuals`` hold one row per product or kept value; an
llm of many blocks has dozens (a loop stack: one per block), so the pages offer them grouped by
layer and ``checkpoint_name``: one row per (layer, name), its block prefix (``"3.q_proj"``) left out,
with how many values, their bytes and the verdicts. Every view fits a 1024 px window (about 560 px
of page): shapes, flops and sources are a view of their own, not columns of every view.
"""

from __future__ import annotations

import re

import pandas as pd

# More rows than this and the pages open the grouped view first.
GROUP_ABOVE = 24
_BLOCK = re.compile(r"^(\d+)\.(.+)$")


def _size(n: float) -> str:
    from remat_lab.config import human_bytes  # on use: ``config`` imports the models

    return human_bytes(n)


def _shape(value) -> str:
    return "(" + ", ".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")" \
        if isinstance(value, list | tuple) else str(value)


_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "s32",
           "int64": "s64", "int8": "s8", "uint8": "u8", "uint32": "u32", "bool": "pred"}


def value_text(dtype: object, shape: object) -> str:
    """A value's type as XLA writes it, in one cell: ``float32``, ``[2, 16, 64]`` -> ``f32[2,16,64]``."""
    dims = ",".join(str(d) for d in shape) if isinstance(shape, list | tuple) else str(shape).strip("()")
    return f"{_DTYPES.get(str(dtype), str(dtype))}[{dims.replace(' ', '').rstrip(',')}]"


def block_of(layer: str) -> tuple[str, str | None]:
    """``'3.q_proj'`` -> ``('q_proj', '3')``; a layer without a block prefix -> ``(layer, None)``."""
    m = _BLOCK.match(str(layer))
    return (m.group(2), m.group(1)) if m else (str(layer), None)


def _dots(result: dict | None) -> pd.DataFrame:
    cols = ["index", "layer", "name", "layers", "lhs_shape", "rhs_shape", "out_shape", "has_batch_dims",
            "policy_verdict", "saved", "offloaded", "offloaded_in_compiled", "recomputed",
            "recomputed_in_compiled", "flops", "out_bytes", "note"]
    df = pd.DataFrame((result or {}).get("dots") or [], columns=cols)
    return _filled(df, {"name": "", "layer": "other", "layers": 1, "policy_verdict": "", "saved": False,
                        "offloaded": False, "offloaded_in_compiled": False, "recomputed": False,
                        "flops": 0, "out_bytes": 0, "note": ""})


def _filled(df: pd.DataFrame, defaults: dict) -> pd.DataFrame:
    """``df`` with each missing cell of ``defaults``' columns set to its default (an older or a
    hand-made document may lack a field: no NaN counted as True or as a layer)."""
    for col, value in defaults.items():
        df[col] = df[col].astype(object).where(df[col].notna(), value).infer_objects()
    return df


def _compiled(value) -> str:
    """``recomputed_in_compiled`` in words: True, False, None (products of this size not told apart)."""
    return {True: "yes", False: "no"}.get(value, "not attributable")


def dot_decisions_frame(result: dict | None) -> pd.DataFrame:
    """One row per forward dot: what the policy says, what the jaxpr and the compiled program do.

    Columns (the document's names): index, layer, policy_verdict, saved, recomputed,
    recomputed_in_compiled ("yes", "no", "not attributable"), output (its size, binary units),
    out_bytes (exact, for sorting); offloaded and offloaded_in_compiled only when a dot is offloaded.
    """
    df = _dots(result)
    out = pd.DataFrame({
        "index": df["index"], "layer": df["layer"], "policy_verdict": df["policy_verdict"],
        "saved": df["saved"].astype(bool), "recomputed": df["recomputed"].astype(bool),
        "recomputed_in_compiled": df["recomputed_in_compiled"].map(_compiled),
        "output": df["out_bytes"].map(_size), "out_bytes": df["out_bytes"]})
    if df["offloaded"].astype(bool).any() or df["offloaded_in_compiled"].astype(bool).any():
        out.insert(4, "offloaded", df["offloaded"].astype(bool))
        out.insert(5, "offloaded_in_compiled", df["offloaded_in_compiled"].astype(bool))
    return out


def dot_shapes_frame(result: dict | None) -> pd.DataFrame:
    """One row per forward dot, its operands: index, layer, lhs, rhs, out (shapes as text), batch_dims,
    flops (of every layer the row stands for)."""
    df = _dots(result)
    return pd.DataFrame({"index": df["index"], "layer": df["layer"], "lhs": df["lhs_shape"].map(_shape),
                         "rhs": df["rhs_shape"].map(_shape), "out": df["out_shape"].map(_shape),
                         "batch_dims": df["has_batch_dims"].astype(bool), "flops": df["flops"]})


def _joined(values) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values if str(v)))


def _with_blocks(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``group`` (its layer without the block prefix) and ``block`` columns."""
    parts = [block_of(v) for v in df["layer"]]
    return df.assign(group=[p[0] for p in parts], block=[p[1] for p in parts])


def note_lines(result: dict | None) -> list[str]:
    """The dots' notes, one line per (layer without its block, note): an llm's blocks say the same
    thing about the same layer, so "Dots 0, 9, 18, 27 (q_proj in 4 blocks): ..." once, not four times."""
    df = _with_blocks(_dots(result))
    lines = []
    for (group, note), part in df[df["note"] != ""].groupby(["group", "note"], sort=False):
        idx = [str(i) for i in part["index"]]
        if len(idx) == 1:
            lines.append(f"Dot {idx[0]} ({part['layer'].iloc[0]}): {note}")
            continue
        shown = ", ".join(idx) if len(idx) <= 6 else f"{idx[0]}, {idx[1]}, …, {idx[-1]}"
        blocks = part["block"].nunique()
        lines.append(f"Dots {shown} ({group}" + (f" in {blocks} blocks" if blocks > 1 else "") + f"): {note}")
    return lines


def _jaxpr_says(n: int, saved: int, recomputed: int) -> str:
    """What the backward jaxpr does with a group of ``n`` dots, in a word where it is one thing."""
    if saved == n or recomputed == n:
        return "saved" if saved == n else "recomputed"
    return "neither" if not (saved or recomputed) else f"{saved} saved, {recomputed} recomputed"


def _compiled_says(n: int, yes: int, unknown: int) -> str:
    """How many of ``n`` dots the compiled program recomputes (``unknown``: not attributable)."""
    if unknown == n:
        return "unknown"
    if not unknown and yes in (0, n):
        return "all" if yes else "none"
    return f"{yes} of {n}" + (f", {unknown} unknown" if unknown else "")


def dot_groups_frame(result: dict | None) -> pd.DataFrame:
    """The forward dots by (layer, checkpoint name), the block prefix left out, in program order.

    Columns: layer, name ("" untagged), dots (every layer counted: a scanned row stands for
    ``layers``), blocks (how many blocks hold them), policy (the verdicts, joined), saved and
    recomputed (dots, per the jaxpr) and jaxpr (the same in words: "saved", "recomputed",
    "neither", "2 saved, 2 recomputed"), recomputed_in_compiled and unattributed (dots the compiled
    program recomputes, and those it cannot tell apart) and compiled (in words: "all", "none",
    "unknown", "2 of 4"), output (their outputs' size), out_bytes, flops."""
    cols = ["layer", "name", "dots", "blocks", "policy", "saved", "recomputed", "jaxpr",
            "recomputed_in_compiled", "unattributed", "compiled", "output", "out_bytes", "flops"]
    df = _dots(result)
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = _with_blocks(df)
    n = df["layers"].astype(int)
    df = df.assign(n=n, n_saved=n * df["saved"].astype(bool), n_rec=n * df["recomputed"].astype(bool),
                   n_yes=n * (df["recomputed_in_compiled"] == True),  # noqa: E712 - None is a third value
                   n_unknown=n * df["recomputed_in_compiled"].isna())
    rows = []
    for (group, name), part in df.groupby(["group", "name"], sort=False):
        count, saved, rec = int(part["n"].sum()), int(part["n_saved"].sum()), int(part["n_rec"].sum())
        yes, unknown = int(part["n_yes"].sum()), int(part["n_unknown"].sum())
        rows.append({
            "layer": group, "name": name, "dots": count,
            "blocks": max(part["block"].nunique(), int(part["layers"].max())),
            "policy": _joined(part["policy_verdict"]), "saved": saved, "recomputed": rec,
            "jaxpr": _jaxpr_says(count, saved, rec), "recomputed_in_compiled": yes,
            "unattributed": unknown, "compiled": _compiled_says(count, yes, unknown),
            "out_bytes": int(part["out_bytes"].sum()), "flops": int(part["flops"].sum())})
    out = pd.DataFrame(rows, columns=cols)
    out["output"] = out["out_bytes"].map(_size)
    return out


def _residuals(result: dict | None) -> pd.DataFrame:
    cols = ["index", "shape", "dtype", "bytes", "layers", "role", "memory_kind", "memory_kind_in_compiled",
            "kind", "layer", "name", "source"]
    df = pd.DataFrame((result or {}).get("residuals") or [], columns=cols)
    return _filled(df, {"name": "", "layer": "other", "layers": 1, "bytes": 0, "role": "", "kind": "",
                        "memory_kind": "device", "memory_kind_in_compiled": "device", "source": ""})


def _memory(jaxpr: object, compiled: object) -> str:
    """Where a value is kept: ``device``, ``host``, or ``host → device`` when the compiled program
    keeps on the device what the jaxpr puts on the host."""
    return str(jaxpr) if jaxpr == compiled else f"{jaxpr} → {compiled}"


def residual_rows_frame(result: dict | None) -> pd.DataFrame:
    """One row per value kept for the backward pass: index, layer, name, kind, value (``f32[8,64]``),
    size, memory (``device``, ``host``), bytes (exact), source (where the program makes it)."""
    df = _residuals(result)
    return pd.DataFrame({
        "index": df["index"], "layer": df["layer"], "name": df["name"], "kind": df["kind"],
        "value": [value_text(d, s) for d, s in zip(df["dtype"], df["shape"])],
        "size": df["bytes"].map(_size),
        "memory": [_memory(a, b) for a, b in zip(df["memory_kind"], df["memory_kind_in_compiled"])],
        "bytes": df["bytes"], "source": df["source"]})


def residual_groups_frame(result: dict | None) -> pd.DataFrame:
    """The kept values by (role, layer, checkpoint name), the block prefix left out, largest first.

    Columns: role (parameter, activation, ...), layer, name, values (rows of the table), blocks,
    kinds (joined), memory (joined), size, bytes (their sum, exact)."""
    cols = ["role", "layer", "name", "values", "blocks", "kinds", "memory", "size", "bytes"]
    df = _residuals(result)
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = _with_blocks(df)
    df["where"] = [_memory(a, b) for a, b in zip(df["memory_kind"], df["memory_kind_in_compiled"])]
    rows = [{"role": role, "layer": group, "name": name, "values": len(part),
             "blocks": max(part["block"].nunique(), int(part["layers"].max())),
             "kinds": _joined(part["kind"]), "memory": _joined(part["where"]),
             "bytes": int(part["bytes"].sum())}
            for (role, group, name), part in df.groupby(["role", "group", "name"], sort=False)]
    out = pd.DataFrame(rows, columns=cols)
    out["size"] = out["bytes"].map(_size)
    return out.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)
