"""Headless runs: ``python -m remat_lab run|explain|compare|advise|synthesize|sweep|history|...``.

Bad input exits with status 2 and one line on stderr; an XLA failure exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from remat_lab.cli import (
    advise,
    bench,
    calibrate,
    compare,
    history,
    plan,
    policies,
    published,
    run,
    sweep,
    synthesize,
    targets,
)
from remat_lab.cli.common import STATUS, Failure, Parser
from remat_lab.cli.common import config_from as _config_from
from remat_lab.cli.devices import setup_devices

__all__ = ["_config_from", "build_parser", "main"]

# Each subcommand's runner: args in, exit status out. The subcommands in NO_DEVICES start no JAX.
COMMANDS = {"run": run.main, "explain": run.main, "compare": compare.main, "calibrate": calibrate.main,
            "policies": policies.main, "advise": advise.main, "sweep": sweep.main,
            "history": history.main, "bench": bench.main, "targets": targets.main,
            "synthesize": synthesize.main, "published": published.main,
            "plan": plan.main}
NO_DEVICES = ("policies", "history", "targets")  # published without --check: below


def build_parser() -> argparse.ArgumentParser:
    """The command line: every subcommand's flags, in the order ``--help`` lists them."""
    parser = Parser(prog="python -m remat_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in (run, compare, calibrate, policies, advise, synthesize, plan, sweep, history, bench,
                   targets, published):
        module.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, set up the devices, run the subcommand; a ``Failure`` is one line on stderr."""
    args = build_parser().parse_args(argv)
    if args.command in NO_DEVICES or (args.command == "published" and args.check is None):
        return _run(args)
    from remat_lab.program.native_log import captured_logs

    with captured_logs() as logs:  # XLA's C++ log lines and JAX's warnings: summarized, not raw
        status = _run(args)
    if logs.summary():
        print(f"remat_lab: note: {logs.summary()}", file=sys.stderr)
    return status


def _run(args: argparse.Namespace) -> int:
    try:
        if args.command not in NO_DEVICES and not (args.command == "published" and args.check is None):
            setup_devices(args)  # before anything starts JAX: emulated devices, jax.distributed
            from remat_lab.program.targets import start_backend_quietly

            start_backend_quietly()  # the CUDA plugin's "no driver" lines are not the user's concern
        return COMMANDS[args.command](args)
    except Failure as failure:
        print(f"remat_lab: error: {failure}", file=sys.stderr)
        return failure.status
    except Exception as err:  # noqa: BLE001 - not the user's nor XLA's: the lab's own bug, said so
        from remat_lab.program.failures import lab_bug

        if os.environ.get("REMAT_LAB_TRACEBACK") == "1":
            traceback.print_exc()
        print(f"remat_lab: error: {lab_bug(f'running {args.command}', err)}", file=sys.stderr)
        return STATUS["LabBug"]
