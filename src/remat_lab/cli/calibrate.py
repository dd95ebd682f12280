"""The calibrate subcommand: this machine's roofs (peak FLOP/s, copy bandwidth) measured again."""

from __future__ import annotations

import argparse
import json


def add_parsers(sub) -> None:
    """``calibrate`` under the subcommands ``sub``."""
    cal = sub.add_parser("calibrate", help="measure this machine's roofs again (peak FLOP/s, copy "
                                           "bandwidth); keeps the higher of the old and new figures")
    cal.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    """Measure the roofs again (best of the old and new: load only ever makes them read low)."""
    from remat_lab.analysis import roofline

    roofs = roofline.recalibrate()
    if args.json:
        print(json.dumps(roofs, indent=2))
    else:
        print(f"peak {roofs['peak_flops_per_s'] / 1e9:.0f} GFLOP/s, copy bandwidth "
              f"{roofs['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s ({roofs['peak_source']}; "
              f"{roofs.get('peak_note', '')}); stored in {roofline.calibration_path()}")
    return 0
