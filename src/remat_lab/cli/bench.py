"""The bench subcommand: the benchmarks of timing fidelity, latency and sweep throughput."""

from __future__ import annotations

import argparse


def add_parsers(sub) -> None:
    """``bench`` under the subcommands ``sub``."""
    bench = sub.add_parser("bench", help="benchmarks: timing fidelity, latency, sweep throughput")
    bench.add_argument("--quick", action="store_true",
                       help="smaller sizes; the transformer advice compile-only (minutes on 2 cores)")
    bench.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    """Run the benchmarks (studies.bench prints their report)."""
    from remat_lab.studies.bench import main as bench_main

    return bench_main(quick=args.quick, as_json=args.json)
