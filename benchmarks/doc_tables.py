"""The docs' tables of figures, generated from the files that hold the figures.

    python benchmarks/doc_tables.py           # rewrite every table block in README.md and docs/*.md
    python benchmarks/doc_tables.py --check   # exit 1, naming the blocks, when a file and its table disagree

A block sits between ``<!-- table:NAME:start -->`` and ``<!-- table:NAME:end -->``; NAME is one of
``TABLES``. Each is built from one file or folder: the stored published checks
(``benchmarks/published_checks/*.json``), the TPU schedule walk
(``benchmarks/tpu_step_model/schedule-*.jsonl``) and the chip's catalogue
(``benchmarks/chip/tpu-v5e.jsonl``). Standard library only: no JAX, no Streamlit.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
WORDS = ("none", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
         "nineteen", "twenty", "twenty-one", "twenty-two", "twenty-three", "twenty-four")
BLOCK = re.compile(r"(<!-- table:([a-z0-9-]+):start -->\n)(.*?)(<!-- table:\2:end -->)", re.S)
CHIP = Path("benchmarks/chip/tpu-v5e.jsonl")


def _word(n: int) -> str:
    return WORDS[n] if n < len(WORDS) else str(n)


def _seconds(s: float | None, ms_below: float = 0.1) -> str:
    if s is None:
        return "-"
    if s < ms_below:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s" if s < 10 else f"{s:.2f} s"


def _ratio(s: float | None, measured: float | None, ms_below: float = 0.1) -> str:
    if s is None:
        return "-"
    return _seconds(s, ms_below) + (f" ({s / measured:.3f}×)" if measured else "")


def _bytes(b: float | None) -> str:
    return "-" if b is None else f"{b / GIB:.2f} GiB"


def published_checks(root: Path = ROOT) -> list[dict]:
    """Every stored check (``benchmarks/published_checks/NAME.json``), by name."""
    folder = root / "benchmarks" / "published_checks"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def fitted_runs(root: Path = ROOT) -> set[str]:
    """The published runs a TPU generation's rate is fitted to (named in its step model's source)."""
    targets = json.loads((root / "src" / "remat_lab" / "config" / "targets.json").read_text())["targets"]
    sources = " ".join(str((t.get("step_model") or {}).get("source", ""))
                       for t in targets if t.get("platform") == "tpu")
    return {d["name"] for d in published_checks(root) if d["name"] in sources}


def _chips(config: dict) -> str:
    """``256 × tpu-v6e``; a TPU run over several slices as ``2 × 256 tpu-v6e`` (its ``dcn_*`` axes)."""
    devices, target = config.get("target_devices") or 1, config.get("target", "local")
    slices = 1
    for part in filter(None, (config.get("mesh") or "").split(",")):
        axis, _, size = part.partition("=")
        slices *= int(size) if axis.startswith("dcn_") else 1
    if target.startswith("tpu") and slices > 1:
        return f"{slices} slices × {devices // slices} {target}"
    return f"{devices} × {target}"


def table_published(root: Path = ROOT) -> str:
    """One row per stored check: chips, per-device batch, fit, measured, predicted and bound steps."""
    fitted = fitted_runs(root)
    rows = ["| run | chips | per-device batch | fits (peak / HBM) or refused | measured step "
            "| predicted (÷ measured) | bound (÷ measured) | checked (date, JAX, wall time) |",
            "|---|---|---|---|---|---|---|---|"]
    for d in published_checks(root):
        c, on = d["config"], d["measured_on"]
        devices = c.get("target_devices") or 1
        fit = (f"fits: {d['peak_bytes'] / GIB:.2f} / {d['hbm_bytes'] / GIB:.1f} GiB" if d.get("fits")
               else f"refused: {_bytes(d.get('temp_bytes'))} of temporaries" if d.get("temp_bytes")
               else "refused")
        measured = d.get("measured_step_s")
        predicted = _ratio(d.get("predicted_s"), measured)
        if d["name"] in fitted:
            predicted += ", the rate's calibration"
        rows.append(f"| `{d['name']}` | {_chips(c)} | {c['batch'] // devices} | {fit} "
                    f"| {_seconds(measured) if measured else 'none published'} | {predicted} "
                    f"| {_ratio(d.get('bound_s'), measured)} | {on['date'][:10]}, JAX {on['jax']}"
                    + (f", {on['wall_s']} s" if on.get("wall_s") else "") + " |")
    return "\n".join(rows)


def table_published_error(root: Path = ROOT) -> str:
    """The prediction's error over the held-out runs (those no rate was fitted to), in one paragraph."""
    fitted = fitted_runs(root)
    ratios, bounded = {}, 0
    for d in published_checks(root):
        if d.get("predicted_s") and d.get("measured_step_s"):
            bounded += d["bound_s"] < d["measured_step_s"]
            if d["name"] not in fitted:
                ratios[d["name"]] = d["predicted_s"] / d["measured_step_s"]
    if not ratios:
        return "No stored check has both a measured and a predicted step."
    off = {n: abs(1 - r) for n, r in ratios.items()}
    worst = max(off, key=off.get)
    outside = [n for n, o in off.items() if o > 0.2]
    n = _word(len(ratios))
    verb = "is" if len(outside) <= 1 else "are"
    calibrations = ", ".join(f"`{f}`" for f in sorted(fitted))
    checked = sum(1 for d in published_checks(root) if d.get("predicted_s") and d.get("measured_step_s"))
    return (f"**The model's error over the published runs**: over the {n} with a measured step that "
            f"no rate was fitted to, the prediction is {min(ratios.values()):.2f}× to "
            f"{max(ratios.values()):.2f}× the measured step, "
            f"{statistics.median(off.values()) * 100:.1f} % off at the median and "
            f"{off[worst] * 100:.0f} % at worst (`{worst}`); {_word(len(outside))} of the {n} {verb} "
            f"outside 20 %. {calibrations} are calibrations, not predictions: a TPU generation's "
            f"rate is fitted to each. The bound is under the measured step on "
            f"{'all ' + _word(checked) if bounded == checked else f'{bounded} of {checked}'}.")


def table_schedule(root: Path = ROOT) -> str:
    """The TPU schedule walk: each run's step with its collectives as libtpu writes them."""
    paths = sorted((root / "benchmarks" / "tpu_step_model").glob("schedule-*.jsonl"))
    if not paths:
        return "No schedule walk is stored."
    lines = paths[-1].read_text().splitlines()
    rows = ["| run | measured step | kernels alone | all-gathers beside the kernels | every collective "
            "as written | collectives (sync / async) |", "|---|---|---|---|---|---|"]
    for r in map(json.loads, lines[1:]):
        m = r["measured_step_s"]
        rows.append(f"| `{r['name']}` | {_seconds(m)} | {_ratio(r['kernels_s'], m)} "
                    f"| {_ratio(r['all_gathers_beside_s'], m)} | {_ratio(r['as_written_s'], m)} "
                    f"| {r['synchronous']} / {r['asynchronous']} |")
    on = json.loads(lines[0])["measured_on"]
    source = f"From `{paths[-1].relative_to(root)}` ({on['date']}, JAX {on['jax']}, libtpu {on['libtpu']}):"
    return source + "\n\n" + "\n".join(rows)


def table_maxtext_compile(root: Path = ROOT) -> str:
    """The catalogued runs' temporaries in MaxText's own compile (``maxtext_compile``) beside the lab's."""
    runs = json.loads((root / "src" / "remat_lab" / "config" / "published.json").read_text())["runs"]
    checks = {d["name"]: d for d in published_checks(root)}
    rows = ["| run (per-device batch) | MaxText's own | with the run's libtpu flags | the lab "
            "| lab / MaxText | measured with |", "|---|---|---|---|---|---|"]
    for run in runs:
        if not (mt := run.get("maxtext_compile")) or run["name"] not in checks:
            continue
        d = checks[run["name"]]
        verdict = "fits" if mt.get("fits") else "refused"
        lab = d.get("temp_bytes")
        flagged = mt.get("temp_bytes_with_flags")
        rows.append(f"| `{run['name']}` ({d['config']['batch'] // (d['config'].get('target_devices') or 1)}) "
                    f"| {_bytes(mt['temp_bytes'])} ({verdict}) "
                    f"| {_bytes(flagged) + ' (' + verdict + ')' if flagged else '-'} "
                    f"| {_bytes(lab)} ({'fits' if d.get('fits') else 'refused'}) "
                    f"| {lab / mt['temp_bytes']:.3f} | {mt.get('measured_with') or 'none published'} |")
    return (f"HLO temporaries per chip (MaxText {runs[0].get('maxtext_compile', {}).get('maxtext', '0.2.5')} "
            "compiled with the lab's JAX and libtpu):\n\n" + "\n".join(rows)) if len(rows) > 2 else \
        "No catalogued run names MaxText's own compile."


def table_h200(root: Path = ROOT) -> str:
    """The H200's measured programs: the step, and the real compile's peak against the deviceless one's."""
    paths = sorted(p for p in (root / "benchmarks" / "device_truth_h200").glob("*.json") if p.stem != "rates")
    rows = ["| program | configuration | measured step (min–max) | real compile's peak | deviceless peak "
            "| deviceless ÷ real |", "|---|---|---|---|---|---|"]
    for path in paths:
        d = json.loads(path.read_text())
        c, step = d["config"], d["step_s"]
        what = (f"{c['model']} width {c['width']}, depth {c['depth']} ({c['stack']}), batch {c['batch']}"
                + (f", seq {c['seq']}" if c["model"] == "llm" else "") + f", {c['dtype']}, `{c['policy']}`")
        real, lab = d["real_memory"]["peak_bytes"], d["deviceless"]["memory"]["peak_bytes"]
        rows.append(f"| `{d['name']}` | {what} | {_seconds(step['median'])} ({_seconds(step['min'])}–"
                    f"{_seconds(step['max'])}) | {_bytes(real)} | {_bytes(lab)} | {lab / real:.3f} |")
    if not paths:
        return "No H200 measurement is stored."
    device = json.loads(paths[0].read_text())
    return (f"Measured on one {device['device']} (JAX {device['jax']}), from "
            "`benchmarks/device_truth_h200/`:\n\n" + "\n".join(rows))


def table_load(root: Path, stem: str) -> str:
    """One load benchmark's rows (``tests/load/STEM.json``): each step's time, RSS and cgroup peak."""
    path = root / "tests" / "load" / f"{stem}.json"
    if not path.exists():
        return f"No load benchmark is stored as `tests/load/{stem}.json`."
    doc = json.loads(path.read_text())
    rows = doc if isinstance(doc, list) else (doc.get("load_bench") or doc)["rows"]
    out = ["| step | seconds | server RSS | worker RSS | cgroup peak | OOM kills | load (1 min) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        step = re.sub(r"^issue \d+: ", "", r["step"])
        seconds = f"{r['seconds']:.1f}" if r.get("seconds") is not None else "-"
        out.append(f"| {step} | {seconds} | {r['server_rss_mib']:.1f} MiB | {r['worker_rss_mib']:.1f} MiB "
                   f"| {r['cgroup_peak_mib']:.1f} MiB | {r['oom_kills']} | {r['load_avg_1m']:.2f} |")
    return f"From `tests/load/{stem}.json`:\n\n" + "\n".join(out)


def chip_rows(root: Path = ROOT) -> list[dict] | None:
    """The chip's catalogue, one dict a line; None when the file is not there."""
    path = root / CHIP
    if not path.exists():
        return None
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _args(a) -> str:
    return " ".join(map(str, a)) if isinstance(a, list) else str(a)


def _chip_caption(rows: list[dict]) -> str:
    kinds = sorted({r["measured"]["device_kind"] for r in rows})
    dates = sorted(r["measured"]["date"][:10] for r in rows)
    jax = sorted({r["measured"]["jax"] for r in rows})
    deviceless = sorted({r["deviceless"]["jax"] for r in rows})
    span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    spans = []
    for held, what in ((True, "held out"), (False, "fitted")):
        ratios = [r["deviceless"]["predicted_s"] / r["measured"]["step_s"] for r in rows
                  if bool(r.get("held_out")) == held and r["deviceless"].get("predicted_s")]
        if ratios:
            spans.append(f"{len(ratios)} {what}: {min(ratios):.2f}× to {max(ratios):.2f}× the measured step")
    return (f"Measured on {', '.join(kinds)} ({span}, JAX {', '.join(jax)}); predicted deviceless "
            f"(JAX {', '.join(deviceless)}). Held-out runs were not used to fit any rate "
            f"({'; '.join(spans)}). From `{CHIP}`:")


def table_chip(root: Path = ROOT) -> str:
    """The chip's catalogue in full: step measured against predicted, compiled peak against the
    allocator's, flops."""
    rows = chip_rows(root)
    if rows is None:
        return f"No chip catalogue yet: `{CHIP}` is not there."
    out = ["| run | arguments | held out | measured step (p25–p75) | predicted (÷ measured) "
           "| bound (÷ measured) | compiled peak | allocator peak | deviceless peak "
           "| flops: chip / deviceless |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, d = r["measured"], r["deviceless"]
        flops = (f"{m['flops']:.3e} / {d['flops']:.3e}" if m.get("flops") and d.get("flops") else "-")
        step, spread = _seconds(m["step_s"], 1), f"{_seconds(m['step_p25'], 1)}–{_seconds(m['step_p75'], 1)}"
        predicted, bound = (_ratio(d.get(k), m["step_s"], 1) for k in ("predicted_s", "bound_s"))
        out.append(f"| `{r['name']}` | `{_args(r['args'])}` | {'yes' if r.get('held_out') else 'no'} "
                   f"| {step} ({spread}) | {predicted} | {bound} "
                   f"| {_bytes(m.get('compiled_peak_bytes'))} | {_bytes(m.get('allocator_peak_bytes'))} "
                   f"| {_bytes(d.get('peak_bytes'))} | {flops} |")
    return _chip_caption(rows) + "\n\n" + "\n".join(out)


def table_chip_short(root: Path = ROOT) -> str:
    """The chip's catalogue, short: step measured against predicted, compiled against allocator peak."""
    rows = chip_rows(root)
    if rows is None:
        return f"No chip catalogue yet: `{CHIP}` is not there."
    out = ["| run | measured step | predicted (÷ measured) | compiled peak | allocator peak |",
           "|---|---|---|---|---|"]
    for r in rows:
        m, d = r["measured"], r["deviceless"]
        predicted = _ratio(d.get("predicted_s"), m["step_s"], 1)
        held = " (held out)" if r.get("held_out") else ""
        out.append(f"| `{r['name']}`{held} | {_seconds(m['step_s'], 1)} | {predicted} "
                   f"| {_bytes(m.get('compiled_peak_bytes'))} | {_bytes(m.get('allocator_peak_bytes'))} |")
    return _chip_caption(rows) + "\n\n" + "\n".join(out)


def table_data(root: Path, stem: str) -> str:
    """A table whose figures are kept as data in ``docs/data/STEM.json`` (``columns``, ``rows``,
    ``source``): measurements with no other file behind them, each row as stored."""
    doc = json.loads((root / "docs" / "data" / f"{stem}.json").read_text())
    line = lambda cells: "| " + " | ".join(str(c) for c in cells) + " |"
    return "\n".join([line(doc["columns"]), "|" + "---|" * len(doc["columns"]),
                      *(line(r) for r in doc["rows"])])


TABLES = {"published": table_published, "published-error": table_published_error,
          "schedule": table_schedule, "maxtext-compile": table_maxtext_compile, "chip": table_chip,
          "chip-short": table_chip_short, "h200": table_h200}


def rewrite(text: str, root: Path = ROOT) -> str:
    """``text`` with every table block's body generated again; an unknown NAME is a ValueError."""
    def body(match: re.Match) -> str:
        name = match.group(2)
        if name.startswith("data-"):  # a measurement's rows kept as data: docs/data/STEM.json
            return f"{match.group(1)}{table_data(root, name[len('data-'):])}\n{match.group(4)}"
        if name.startswith("load-"):  # a load benchmark's rows: load-STEM for tests/load/STEM.json
            return f"{match.group(1)}{table_load(root, name[len('load-'):])}\n{match.group(4)}"
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r}: the tables are {', '.join(TABLES)}")
        return f"{match.group(1)}{TABLES[name](root)}\n{match.group(4)}"
    return BLOCK.sub(body, text)


def documents(root: Path = ROOT) -> list[Path]:
    """The files whose tables are generated: README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def stale(root: Path = ROOT) -> list[str]:
    """The documents whose tables disagree with their files."""
    return [str(p.relative_to(root)) for p in documents(root)
            if rewrite(p.read_text(), root) != p.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only say which documents disagree with their files")
    args = parser.parse_args(argv)
    if args.check:
        for name in (bad := stale()):
            print(f"{name}: a table disagrees with its file; run python benchmarks/doc_tables.py",
                  file=sys.stderr)
        return 1 if bad else 0
    for path in documents():
        text = path.read_text()
        if (new := rewrite(text)) != text:
            path.write_text(new)
            print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
