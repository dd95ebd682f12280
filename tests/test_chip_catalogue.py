"""The chip's catalogue (benchmarks/chip/tpu-v5e.jsonl) against the chip's own programs, kept beside it.

The measured lines' programs (``benchmarks/chip/hlo``) are what libtpu compiled on a lent v5e chip;
the deviceless lines are this machine's compiles for ``--target tpu-v5e``. Both are read here with
the lab's counting, so a change to it that moves one and not the other fails."""

import gzip
import importlib.util
import shlex
from collections import Counter
from pathlib import Path

import pytest

from remat_lab.analysis.costs import step_flops
from remat_lab.analysis.kernels import kernels_of

_SPEC = importlib.util.spec_from_file_location(
    "chip_catalogue", Path(__file__).resolve().parents[1] / "benchmarks" / "chip_catalogue.py")
catalogue = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(catalogue)
ROWS = catalogue._read(catalogue.CATALOGUE)
MEASURED = [r for r in ROWS if "error" not in r["measured"]
            and (catalogue.HLO / f"{r['name']}.hlo.txt.gz").exists()]


def _chip_text(name: str) -> str:
    with gzip.open(catalogue.HLO / f"{name}.hlo.txt.gz", "rt") as f:
        return f.read()


def test_every_measured_line_keeps_its_chip_program():
    assert len(MEASURED) == len([r for r in ROWS if "error" not in r["measured"]]) >= 18


@pytest.mark.parametrize("row", MEASURED, ids=lambda r: r["name"])
def test_the_chips_flops_are_its_program_counted_now_and_the_devicelesss(row):
    """The stored chip flops are the chip's program and XLA's cost there counted by the current
    ``step_flops``; the deviceless count is within 1 % of it (issue 63; 0.01 % on all twelve)."""
    m = row["measured"]
    chip = step_flops(m["xla_cost"]["flops"], _chip_text(row["name"]))
    assert chip == pytest.approx(m["flops"], rel=1e-9)
    assert row["deviceless"]["flops"] == pytest.approx(chip, rel=0.01)


@pytest.mark.parametrize("row", MEASURED, ids=lambda r: r["name"])
def test_the_deviceless_products_are_the_chips(row):
    """The matrix products of the deviceless compile (the kernels the step model prices) are the
    chip program's, kind by kind, within 0.1 % of their flops."""
    stored = [dict(zip(catalogue._ROW, k)) for k in catalogue._kernels()[row["name"]]["kernels"]]

    def flops(kernels) -> Counter:
        out = Counter()
        for k in kernels:
            if k["flops"]:
                out[(k["kind"], k["dtype"])] += k["flops"] * k.get("runs", 1)
        return out

    chip, deviceless = flops(kernels_of(_chip_text(row["name"]))), flops(stored)
    assert set(chip) == set(deviceless), (chip, deviceless)
    for key, value in chip.items():
        assert deviceless[key] == pytest.approx(value, rel=1e-3), key


@pytest.mark.parametrize("row", [r for r in MEASURED if r["args"].startswith("--model mlp")],
                         ids=lambda r: r["name"])
def test_the_chips_mlp_products_are_the_hand_count(row):
    """An MLP block is two ``width x width`` products: a step's products are ``2 x batch x width^2``
    each, twice a layer, three times (forward, and the backward's two) or four with the forward
    recomputed (nothing_saveable). The chip's program holds exactly that, and the deviceless step's
    flops (its element-wise work too) are within 0.2 % over it."""
    args = shlex.split(row["args"])
    flag = {k: args[i + 1] for i, k in enumerate(args) if k.startswith("--") and i + 1 < len(args)}
    b, w, layers = int(flag["--batch"]), int(flag["--width"]), int(flag["--depth"])
    passes = 4 if flag["--policy"] == "nothing_saveable" else 3
    hand = passes * 2 * (2 * b * w * w) * layers
    chip = sum(k["flops"] * k["runs"] for k in kernels_of(_chip_text(row["name"])) if k["kind"] == "gemm")
    assert chip == hand
    assert hand <= row["deviceless"]["flops"] <= 1.002 * hand


def test_the_chips_command_list_is_what_the_cli_takes():
    """benchmarks/chip_commands.py (every command and page on a lent chip) names commands the CLI
    parses and pages that exist: a renamed flag or page fails here, not on the chip."""
    from remat_lab.cli import build_parser

    spec = importlib.util.spec_from_file_location(
        "chip_commands", Path(__file__).resolve().parents[1] / "benchmarks" / "chip_commands.py")
    commands = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(commands)
    parser = build_parser()
    run = commands.ADVISE.replace("advise", "run", 1).split(" --policies")[0] + " --policy full --batch 2"
    for argv in [c.format(out="/tmp/x") for _, c in commands.COMMANDS] + [commands.ADVISE, run]:
        parser.parse_args(shlex.split(argv))  # exits (SystemExit) on a flag the CLI does not take
    for page, _ in commands.PAGES:
        assert (commands.ROOT / page).is_file(), page
