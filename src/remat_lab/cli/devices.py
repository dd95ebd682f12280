"""The CLI's devices: emulated host devices and jax.distributed set up first, quiet native output."""

from __future__ import annotations

import argparse
import os
import sys

from remat_lab.cli.common import reported
from remat_lab.config import ConfigError


def setup_devices(args: argparse.Namespace) -> None:
    """Apply --host-devices and join jax.distributed before JAX starts; only process 0 prints.

    A bad setting is a ``Failure`` (exit 2).
    """
    from remat_lab.program.distributed import setup

    with reported(ConfigError):
        setup(getattr(args, "host_devices", None), getattr(args, "coordinator", None),
              getattr(args, "num_processes", None), getattr(args, "process_id", None))
    if getattr(args, "process_id", None):  # a multi-process run: only process 0 prints results
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of this process)


def quiet_if_distributed(args: argparse.Namespace):
    """In a multi-process run, native code's stdout lines go to stderr (stdout stays JSON)."""
    from contextlib import nullcontext

    from remat_lab.program.distributed import native_stdout_to_stderr

    return native_stdout_to_stderr() if getattr(args, "coordinator", None) else nullcontext()
