"""The history subcommand: the runs recorded by the app and the CLI, listed, shared or deleted."""

from __future__ import annotations

import argparse
import json
import sys
import time

from remat_lab.cli.common import list_arg, reported, rounds_arg
from remat_lab.cli.format import format_table
from remat_lab.config import human_bytes
from remat_lab.model.models import MODELS


def add_parsers(sub) -> None:
    """``history`` under the subcommands ``sub``."""
    p = sub.add_parser("history", help="the runs recorded by the app and the CLI")
    p.add_argument("--json", action="store_true", help="one JSON document: the runs, newest first")
    p.add_argument("--limit", type=rounds_arg, default=50, help="at most this many runs (1..1000)")
    p.add_argument("--model", choices=MODELS, default=None)
    p.add_argument("--policy", default=None)
    p.add_argument("--backend", default=None)
    p.add_argument("--share", type=list_arg(int), default=None, metavar="ID,ID",
                   help="mark runs shared: a public deployment shows them to every visitor")
    p.add_argument("--unshare", type=list_arg(int), default=None, metavar="ID,ID")
    p.add_argument("--delete", type=list_arg(int), default=None, metavar="ID,ID")


def main(args: argparse.Namespace) -> int:
    """Apply --share/--unshare/--delete, then list the runs (a history that cannot be used exits 1)."""
    from remat_lab.store import history

    with reported(failed=history.HistoryError):
        changed = [(what, fn(ids)) for what, ids, fn in (
            ("shared", args.share, history.share),
            ("unshared", args.unshare, lambda ids: history.share(ids, False)),
            ("deleted", args.delete, history.delete)) if ids]
        runs = history.list_runs(limit=args.limit, model=args.model, policy=args.policy,
                                 backend=args.backend)
    for what, n in changed:
        print(f"{what} {n} run{'' if n == 1 else 's'}", file=sys.stderr)
    if args.json:
        print(json.dumps({"path": str(history.db_path()), "runs": runs}, indent=2))
        return 0
    rows = [{**r, "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])),
             "median_ms": "-" if r["median_ms"] is None else f"{r['median_ms']:.4f}",
             "peak": "-" if r["peak_bytes"] is None else human_bytes(r["peak_bytes"]),
             "shared": "yes" if r["shared"] else "", "error": (r["error"] or "")[:60]} for r in runs]
    print(f"{history.db_path()}: {len(rows)} most recent run{'' if len(rows) == 1 else 's'}")
    print(format_table(rows, ["id", "created", "source", "kind", "model", "policy", "width", "batch",
                              "depth", "dtype", "backend", "median_ms", "peak", "shared", "error"]))
    return 0
