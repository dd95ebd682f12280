"""The policies subcommand: the checkpoint-policy registry (and a model's checkpoint names)."""

from __future__ import annotations

import argparse

from remat_lab.model.models import MODELS, names_of
from remat_lab.model.policies import GROUPS, POLICIES


def add_parsers(sub) -> None:
    """``policies`` under the subcommands ``sub``."""
    pol = sub.add_parser("policies", help="list the policy registry (and a model's checkpoint names)")
    pol.add_argument("--model", choices=MODELS, default=None,
                     help="also list this model's checkpoint names and which of them each recipe keeps")


def main(args: argparse.Namespace) -> int:
    """Print the registry (no JAX, no devices)."""
    print(policies_text(args.model))
    return 0


def policies_text(model: str | None = None) -> str:
    """The registry by group; with ``model``, its checkpoint names and what each recipe keeps."""
    width = max(map(len, POLICIES))
    pad = " " * (width + 2)
    lines = []
    if model is not None:
        lines += [f"Checkpoint names of {model}: {', '.join(names_of(model))}", ""]
    for group, title in GROUPS.items():
        lines.append(f"{title}:")
        for p in (p for p in POLICIES.values() if p.group == group):
            lines.append(f"{p.id.ljust(width)}  {p.description}")
            lines += [pad + line for line in p.code.splitlines()]
            if model is not None and (p.saves or p.offloads):
                keep = lambda names: ", ".join(n for n in names_of(model) if n in names) or "-"
                lacks = [n for n in (*p.saves, *p.offloads) if n not in names_of(model)]
                lines.append(f"{pad}in {model}: saves {keep(p.saves)}; offloads {keep(p.offloads)}"
                             + (f"; not in {model}: {', '.join(lacks)}" if lacks else ""))
        lines.append("")
    return "\n".join(lines).rstrip()
