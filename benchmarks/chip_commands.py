"""Every command and page of the lab on the attached accelerator, one process: what each answered.

    python benchmarks/chip_commands.py OUT.jsonl [--deadline-s S | --deadline-at EPOCH] [--only A,B]
        [--part cli|pages]

Each item is a CLI command (``remat_lab.cli.main``, in this process: a TPU process starts in ~20 s)
or a page through Streamlit's AppTest, at configurations whose own program fits one v5e chip and
which the lab once refused or killed (issue 63). The pages run in a process of their own that never
touches the chip (``--part pages``): a page's work runs in the app's worker process, which must be
the one process holding it, as under ``streamlit run``. One JSON line each, written as it finishes: the
exit status, the wall time, the output's tail, and for pages the exceptions, errors and metrics.
The Advisor's item runs ``run`` at the advised largest batch and one above it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPT2 = "--preset gpt2-small --seq 1024"
LLAMA = "--preset llama3.2-1b --seq 2048"
LLM = "--model llm --width 1024 --depth 8 --heads 16 --seq 2048 --vocab 32000 --dtype bfloat16"

# (name, argv): configurations the lab refused or killed on a v5e before (issue 63's list)
COMMANDS = [
    ("run_gpt2s_b16_nothing_train", f"run {GPT2} --batch 16 --policy nothing_saveable --step train"),
    ("run_llama1b_b2_full_grad", f"run {LLAMA} --batch 2 --policy full"),
    ("explain_llama1b_b1_qkv", f"explain {LLAMA} --batch 1 --policy save_qkv_proj"),
    ("compare_gpt2s_b16_train", f"compare {GPT2} --batch 16 --step train "
     "--policies nothing_saveable,minimal --repeats 3"),
    ("sweep_llm_w1024_b4", "sweep --models llm --widths 1024 --depths 8 --seqs 2048 --batches 4 "
     "--dtypes bfloat16 --heads 16 --policies minimal,no_remat --repeats 3 --out {out}/sweep.jsonl"),
    # a small llm: gpt2-small's synthesis is 28 compiles of ~15 s each on a v5e (2026-12-08)
    ("synthesize_llm_small_train", "synthesize --model llm --width 512 --depth 4 --heads 8 --seq 1024 "
     "--vocab 32000 --dtype bfloat16 --step train --max-batch 512 --json"),
    ("plan_local_gpt2s", f"plan {GPT2} --target local --target-devices 1 --top 1 --json"),
]
ADVISE = f"advise {GPT2} --step train --policies nothing_saveable --max-batch 256 --no-time --json"
PAGE_PARAMS = {"preset": "gpt2-small", "seq": "1024", "batch": "16", "policy": "nothing_saveable",
               "step": "train", "repeats": "3"}
# the pages that run on load with the sidebar's default model first, gpt2-small's run last
PAGES = [("app.py", {}), ("pages/compare.py", {}), ("pages/1_inspect.py", {}), ("pages/advisor.py", {}),
         ("pages/synthesize.py", {}), ("pages/plan.py", {}), ("pages/sweep.py", {}),
         ("pages/begin.py", {}), ("pages/results.py", {}), ("pages/history.py", {}),
         ("pages/targets.py", {}), ("pages/published.py", {}), ("pages/guide.py", {}),
         ("pages/explore.py", PAGE_PARAMS)]


class _Late(Exception):
    pass


def _alarm(_sig, _frame):
    raise _Late()


def cli(argv: str, limit_s: int) -> dict:
    """``python -m remat_lab ARGV`` in this process: status, seconds, the output's last lines."""
    from remat_lab.cli import main

    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    signal.alarm(limit_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv.split())
            except SystemExit as e:
                rc = e.code
    except _Late:
        rc = f"over {limit_s} s"
    except Exception as e:  # a traceback would be a bug in the lab: kept as the answer
        rc = f"{type(e).__name__}: {str(e)[:500]}"
    finally:
        signal.alarm(0)
    return {"argv": argv, "rc": rc, "wall_s": time.perf_counter() - t0,
            "stdout": out.getvalue(), "stderr_tail": err.getvalue()[-2000:]}


def page(path: str, params: dict, limit_s: int) -> dict:
    """One page through AppTest with ``params`` in its URL."""
    from streamlit.testing.v1 import AppTest

    t0 = time.perf_counter()
    at = AppTest.from_file(str(ROOT / path), default_timeout=limit_s)
    for k, v in params.items():
        at.query_params[k] = v
    try:
        at.run()
        got = {"exceptions": [str(e.value)[:500] for e in at.exception],
               "errors": [str(e.value)[:500] for e in at.error],
               "warnings": [str(e.value)[:300] for e in at.warning],
               "metrics": {m.label: m.value for m in at.metric},
               "captions": [c.value[:300] for c in at.caption][:12]}
    except Exception as e:
        got = {"exceptions": [f"{type(e).__name__}: {str(e)[:500]}"]}
    return {"page": path, "params": params, "wall_s": time.perf_counter() - t0, **got}


def advisor_answer_runs(out: Path, limit_s: int) -> list[dict]:
    """advise, then ``run`` at its largest batch (must run) and one above (the chip must refuse)."""
    adv = cli(ADVISE, limit_s)
    rows = [adv]
    try:
        doc = json.loads(adv["stdout"])
        best = doc["rows"][0]
    except (ValueError, KeyError, IndexError):
        return rows
    adv["stdout"] = json.dumps({"rows": [{k: r.get(k) for k in ("policy", "max_batch", "next_batch",
                                "peak_bytes", "next_peak_bytes", "reason", "limited_by", "runs")}
                                         for r in doc["rows"]], "budget_bytes": doc["budget_bytes"],
                                "budget_source": doc["budget_source"]})
    base = ADVISE.replace("advise", "run", 1).split(" --policies")[0] + f" --policy {best['policy']}"
    for batch in (best["max_batch"], best["max_batch"] + 1):
        rows.append(cli(f"{base} --batch {batch} --repeats 3", limit_s))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--deadline-s", type=float, default=480)
    ap.add_argument("--deadline-at", type=float, default=None, help="start nothing after this epoch")
    ap.add_argument("--part", choices=("cli", "pages", "all"), default="all")
    ap.add_argument("--only", default="")
    ap.add_argument("--limit-s", type=int, default=300)
    a = ap.parse_args()
    import jax

    signal.signal(signal.SIGALRM, _alarm)
    only = set(filter(None, a.only.split(",")))
    # the pages' process leaves the chip to the app's worker: it never starts a backend
    kind = jax.devices()[0].device_kind if a.part != "pages" else None
    head = {"device_kind": kind, "jax": jax.__version__, "part": a.part,
            "python": sys.version.split()[0], "date": datetime.date.today().isoformat()}
    deadline = a.deadline_at if a.deadline_at is not None else time.time() + a.deadline_s
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def keep(name: str, rows) -> None:
        with a.out.open("a") as f:
            for r in rows if isinstance(rows, list) else [rows]:
                f.write(json.dumps({"name": name, **head, **r}, default=str) + "\n")
        last = rows[-1] if isinstance(rows, list) else rows
        print(f"{name}: {last.get('rc', last.get('exceptions'))} in {last['wall_s']:.0f} s", flush=True)

    items = [(n, lambda c=c: cli(c.format(out=a.out.parent), a.limit_s)) for n, c in COMMANDS[:2]]
    items.append(("advise_gpt2s_train", lambda: advisor_answer_runs(a.out.parent, a.limit_s)))
    items += [(n, lambda c=c: cli(c.format(out=a.out.parent), a.limit_s)) for n, c in COMMANDS[2:5]]
    items += [(f"page_{Path(p).stem}", lambda p=p, q=q: page(p, q, a.limit_s)) for p, q in PAGES]
    items += [(n, lambda c=c: cli(c.format(out=a.out.parent), a.limit_s)) for n, c in COMMANDS[5:]]
    for name, fn in items:
        if only and name not in only:
            continue
        if (name.startswith("page_")) != (a.part == "pages") and a.part != "all":
            continue
        if time.time() > deadline:
            print(f"{name}: not started (past the deadline)", flush=True)
            continue
        keep(name, fn())
    return 0


if __name__ == "__main__":
    sys.exit(main())
