"""The synthesized plan as text: paste-ready JAX code, the custom flags, MaxText's custom YAML, the method."""

from __future__ import annotations

from remat_lab.config import RunConfig
from remat_lab.config.catalog import USER_MODEL
from remat_lab.config.cli_flags import shape_flags, target_flags
from remat_lab.model.policies import POLICIES
from remat_lab.studies.synthesize.solve import Plan


def _quoted(names) -> str:
    return ", ".join(f'"{n}"' for n in names)


def jax_code(plan: Plan) -> str:
    """The policy call to paste (``jax.checkpoint``/``nnx.remat``'s ``policy=``)."""
    return ("jax.checkpoint_policies.save_and_offload_only_these_names(\n"
            f"    names_which_can_be_saved=[{_quoted(plan.save)}],\n"
            f"    names_which_can_be_offloaded=[{_quoted(plan.offload)}],\n"
            '    offload_src="device", offload_dst="pinned_host")')


def custom_flags(plan: Plan, depth: int) -> str:
    """The ``run``/``advise`` flags of ``plan`` (policy custom; no_remat when no layer is remat'd)."""
    if plan.remat_layers == 0:
        return "--policy no_remat"
    out = "--policy custom"
    if plan.save:
        out += f" --save-names {','.join(plan.save)}"
    if plan.offload:
        out += f" --offload-names {','.join(plan.offload)}"
    if plan.remat_layers < depth:
        out += f" --remat-layers {plan.remat_layers}"
    return out


def maxtext_yaml(plan: Plan, names: tuple[str, ...], depth: int) -> str:
    """MaxText's ``remat_policy: custom`` lines: each tensor ``device``, ``offload`` or ``remat``
    (the block input stays on the device, as ``nnx.remat`` keeps it)."""
    lines = ["remat_policy: 'custom'", "decoder_layer_input: 'device'"]
    for n in names:
        where = "device" if n in plan.save else "offload" if n in plan.offload else "remat"
        lines.append(f"{n}: '{where}'")
    if 0 < plan.remat_layers < depth:
        lines.append(f"# only the first {plan.remat_layers} of {depth} layers remat'd: MaxText has no "
                     "per-layer count; the rest are saved whole (two scans)")
    return "\n".join(lines)


def named_texts(config: RunConfig, policy: str, batch: int) -> dict:
    """What is handed out when the answer is a named policy: its own flags, code, MaxText YAML (its
    name where MaxText has the recipe, its saved and offloaded names otherwise; None for a JAX
    policy, which MaxText cannot express) and the ``run`` command at the answer's global batch."""
    p = POLICIES[policy]
    if p.group == "maxtext":
        yaml = f"remat_policy: '{policy}'"
    elif p.saves or p.offloads:
        yaml = "\n".join(["remat_policy: 'custom'"] + [f"{n}: 'device'" for n in p.saves]
                         + [f"{n}: 'offload'" for n in p.offloads])
    else:
        yaml = None
    flags = f"--policy {policy}"
    return {"custom": flags, "code": p.code, "maxtext_yaml": yaml,
            "run_command": " ".join([*_model_flags(config, "run", batch), flags,
                                     f"--batch {batch} --compile-only --json"])}


def command(config: RunConfig, budget: int, goal: str, batch: int | None,
            policies: list[str] | None = None) -> str:
    """The ``synthesize`` command line that gives the same document (``policies``: the named
    policies beaten, when not the default list)."""
    parts = _model_flags(config, "synthesize")
    parts.append(f"--budget {budget} --goal {goal}")
    if goal == "min-recompute" and batch:
        parts.append(f"--batch {batch}")
    if policies:
        parts.append(f"--policies {','.join(policies)}")
    return " ".join(parts + ["--json"])


def run_command(config: RunConfig, plan: Plan, batch: int) -> str:
    """The ``run`` command line that compiles ``plan`` at the global ``batch`` (compile-only)."""
    return " ".join([*_model_flags(config, "run", batch), custom_flags(plan, config.depth),
                     f"--batch {batch} --compile-only --json"])


def _model_flags(config: RunConfig, sub: str, batch: int | None = None) -> list[str]:
    """``python -m remat_lab SUB`` and every flag of ``config``'s model, sizes, target and mesh
    (``config.cli_flags``, the flags Explore's and the Advisor's commands use), no batch; the
    user's block's input shape at ``batch`` when given (its first axis, which ``--batch`` must
    equal: the handed-out command once read ``--input-shape 1,... --batch 60``)."""
    c = config.replace(compile_only=False)
    if batch is not None and c.model == USER_MODEL:
        c = c.replace(batch=batch)
    mesh = [f"--mesh {c.mesh}"] if c.mesh else []
    return [f"python -m remat_lab {sub}", *shape_flags(c, batch=False), *target_flags(c), *mesh]


METHOD = {
    "measure": "compiled probes (compile-only, XLA's compiled peak per device): no_remat and "
               "'every name recomputed' at per-device batches 1 and 2 (their peak lines), each name "
               "saved alone (and offloaded alone where the target has host memory) at batch 2; a "
               "name's bytes per example = its program's peak less recompute-everything's, over the "
               "batch; recomputed flops = a program's flops less no_remat's at the same batch, both "
               "as the policy wrote them (a probe XLA's own rematerialization rewrote is compiled "
               "again with its limit lifted, and the model fitted to that); a candidate's and a "
               "named policy's figures are their compiled programs', XLA's recomputation in. On a "
               "TPU (libtpu refuses a program over its HBM: no flop count) the names are probed "
               "where no_remat fits; where no_remat is refused, plans at the same batch are ranked "
               "by their own flops (the same order) and recomputation is reported against the best "
               "named policy (recomputed_baseline), never an estimated no_remat",
    "model": "additive: peak = intercept + batch x slope, the slope the recompute-everything slope "
             "plus each saved or offloaded name's bytes per example; r of L layers remat'd "
             "interpolates intercept and slope between that and no_remat's by r / L, and scales "
             "the recomputed flops and offloaded bytes by r / L",
    "solve": "exact over the model: meet in the middle (the names split in two halves, each half's "
             "3^(k/2) choices listed, one sorted by bytes with a running best, every choice of the "
             "other paired with the best that fits beside it by binary search), for every remat'd "
             "layer count; 2 x 3^(k/2) half-plans instead of 3^k plans, so k = 16 stays under a "
             "second. Ties: fewer recomputed flops, fewer offloaded bytes, smaller peak",
    "compile": "the best candidates compiled: max-batch by the lab's exact batch search (the batch "
               "that fits and the next that does not, both compiled), min-recompute at the batch; "
               "where the model was wrong the budget it solves against is lowered by its largest "
               "under-prediction and the new best compiled too. The answer is always a compiled "
               "program's figures, never the model's",
    "refine": "from the best named policy that is a per-name plan (MaxText's recipes, "
              "nothing_saveable, nnx.remat's default; JAX's dots_* and everything_saveable decide per "
              "primitive and are skipped, said so), at the per-device batch where it fits: a local "
              "search whose moves save or offload one recomputed name, save an offloaded one or remat "
              "one layer fewer; the model, anchored at the last compiled plan's peak, ranks the moves it "
              "predicts fit by the flops (then offload traffic) they spare; the best is compiled at "
              "that batch and kept only when its compiled program fits with a better objective; a move "
              "keeping at least what a plan that did not fit keeps is not compiled. The answer is "
              "therefore never worse than that named policy (the document's refine.outcome says "
              "whether it beats or only equals it); a plan that beats it gets its exact largest batch "
              "searched when the limit leaves room",
    "descend": "max-batch, then: from the best compiled plan, one over the best batch anything "
               "compiled fits, its lighter moves (a saved name offloaded or recomputed, an offloaded "
               "one recomputed, one layer more remat'd) compiled, fewest recomputed flops first, until "
               "one fits; that plan's own largest batch is searched (compiles of its own, outside the "
               "limit), and once more from there. The model prices offloaded names at no device bytes "
               "but the least any of them saves alone (gate on the 3-name SwiGLU block on the H100: "
               "262 KB per example, read back instead of recomputed), while a compiled program keeps "
               "staging buffers that do not add up across names, so keeping less can fit more "
               "(there gate and up offloaded fit 60, gate alone 70)",
    "compiles": "3k + 12 for k names: the measurement, the candidates (each batch search started "
                "only with room for it, k + 2 kept for the refinement) and the refinement's moves; "
                "recompiles forced by XLA's own rematerialization pass (a probe it rewrote, compiled "
                "again with its limit lifted to read the flops as written) are counted in compiles "
                "and apart (xla_forced_compiles), outside that limit; the named policies' apart "
                "(named_compiles)",
    "named": "every named policy (JAX's, and MaxText's recipes where the model has their names) "
             "searched by the same exact batch search on the same budget (the Advisor's sizing); "
             "if none of the synthesized plans beats the best of them, that policy is the answer",
}
