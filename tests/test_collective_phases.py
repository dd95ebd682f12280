"""Collective phases from the program's structure: the rule on small HLO texts, and compile-only on
8 x H100 (fsdp=8) and 4 x TPU v5e (fsdp=4), each claim checked against the HLO walked here."""

from __future__ import annotations

import re

import pytest

from remat_lab.analysis.collectives import collectives, report, rows
from remat_lab.config import RunConfig
from remat_lab.program.analysis_compile import compile_for_analysis
from remat_lab.program.step import jit_step, problem_for

# --- the rule on small texts ------------------------------------------------------------------------

BWD = 'metadata={op_name="f/transpose(jvp())/x"}'
FWD = 'metadata={op_name="f/jvp()/x"}'
LOOPS = f"""HloModule m, is_scheduled=true

%fwd_body (p: f32[8]) -> f32[8] {{
  %p = f32[8]{{0}} parameter(0)
  %ag = f32[32]{{0}} all-gather(%p), dimensions={{0}}
  ROOT %n = f32[8]{{0}} negate(%p), {FWD}
}}

%bwd_body (q: f32[8]) -> f32[8] {{
  %q = f32[8]{{0}} parameter(0)
  %rs = f32[2]{{0}} reduce-scatter(%q), dimensions={{0}}, to_apply=%add
  ROOT %m = f32[8]{{0}} negate(%q), {BWD}
}}

%bare_body (r: f32[8]) -> f32[8] {{
  %r = f32[8]{{0}} parameter(0)
  ROOT %ar = f32[8]{{0}} all-reduce(%r), to_apply=%add
}}

ENTRY %main (x: f32[8]) -> f32[8] {{
  %x = f32[8]{{0}} parameter(0), {FWD}
  %zero = f32[8]{{0}} constant({{0,0,0,0,0,0,0,0}}), {BWD}
  %cp0 = f32[8]{{0}} collective-permute(%x), source_target_pairs={{{{0,1}}}}
  %w1 = f32[8]{{0}} while(%x), condition=%c, body=%fwd_body, {FWD}
  %w2 = f32[8]{{0}} while(%w1), condition=%c, body=%bwd_body, {BWD}
  %w3 = f32[8]{{0}} while(%w2), condition=%c, body=%bare_body, {BWD}
  ROOT %ar2 = f32[8]{{0}} all-reduce(%w3), to_apply=%add
}}
"""


def test_unnamed_collectives_take_their_region_s_pass():
    """Bodies by their named instructions (none named: the while's pass); the entry is forward up
    to its first backward instruction that reads data (a backward constant does not count)."""
    got = {r["name"]: r["phase"] for r in rows(LOOPS)}
    assert got == {"ag": "forward", "rs": "backward", "ar": "backward", "cp0": "forward",
                   "ar2": "backward"}
    # Without the backward loops the entry's only backward instruction is the constant: no seed.
    fwd_only = "\n".join(line for line in LOOPS.splitlines() if not re.match(r"\s+%w[23] ", line))
    fwd_only = fwd_only.replace("all-reduce(%w3)", "all-reduce(%w1)")
    assert {r["name"]: r["phase"] for r in rows(fwd_only)} == {
        "ag": "forward", "rs": "backward", "ar": "forward", "cp0": "forward", "ar2": "forward"}


def test_a_microbatch_body_holding_both_passes_splits_at_its_seed():
    body = LOOPS.replace("  ROOT %n = f32[8]{0} negate(%p), " + FWD,
                         "  %n = f32[8]{0} negate(%p), " + FWD + "\n"
                         "  %g = f32[8]{0} negate(%n), " + BWD + "\n"
                         "  ROOT %rs2 = f32[2]{0} reduce-scatter(%g), dimensions={0}, to_apply=%add")
    got = {r["name"]: r["phase"] for r in rows(body)}
    assert got["ag"] == "forward" and got["rs2"] == "backward"


# --- compiled for named targets, checked against the HLO walked here ------------------------------

SMALL = dict(model="mlp", stack="scan", width=128, batch=64, depth=2, dtype="bfloat16")
MESHES = {"h100": (8, "fsdp=8"), "tpu-v5e": (4, "fsdp=4")}
_SIGNATURE = re.compile(r"^(?:ENTRY )?(%[\w.\-]+) .*\{$")
_LINE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*? ([a-z][\w\-]*)\((.*)$")
_REF = re.compile(r"%[\w.\-]+")


def _walk(text: str) -> tuple[dict, str]:
    """``{computation: {instruction: (opcode, rest of line)}}`` in order, and the entry's name."""
    comps: dict[str, dict[str, tuple[str, str]]] = {}
    entry, comp = "", None
    for line in text.splitlines():
        sig = _SIGNATURE.match(line)
        if sig:
            comp = sig.group(1)
            comps[comp] = {}
            entry = comp if line.startswith("ENTRY") else entry
        elif comp and (m := _LINE.match(line)):
            comps[comp][m.group(1)] = (m.group(2), m.group(3))
    return comps, entry


def _operands(rest: str) -> list[str]:
    return [n[1:] for n in _REF.findall(rest.split(")")[0])]


def _reachable(comps: dict, start: str) -> set[str]:
    """``start`` and every computation it calls, directly or not."""
    seen, todo = set(), [start]
    while todo:
        c = todo.pop()
        if c in seen or c not in comps:
            continue
        seen.add(c)
        todo += [r for _, rest in comps[c].values() for r in _REF.findall(rest) if r in comps]
    return seen


def _loops(comps: dict, entry: str) -> tuple[set[str], set[str]]:
    """The computations run by the forward scan's loop and by the backward's: of the entry's two
    loops, the backward one is the one whose input is computed from the other's result."""
    ins = comps[entry]
    whiles = [n for n, (op, _) in ins.items() if op == "while"]
    assert len(whiles) == 2, whiles

    def feeds(src: str, dst: str) -> bool:
        seen, todo = set(), _operands(ins[dst][1])
        while todo:
            n = todo.pop()
            if n == src:
                return True
            if n in ins and n not in seen:
                seen.add(n)
                todo += _operands(ins[n][1])
        return False

    fwd, bwd = whiles if feeds(whiles[0], whiles[1]) else whiles[::-1]
    assert feeds(fwd, bwd) and not feeds(bwd, fwd)
    body = lambda w: re.search(r"body=(%[\w.\-]+)", ins[w][1]).group(1)
    return _reachable(comps, body(fwd)), _reachable(comps, body(bwd))


def _gradient_scatters(comps: dict) -> list[tuple[str, str]]:
    """``(computation, instruction)`` of each gradient reduce-scatter: the ``reduce-scatter``
    instructions (GPU), or the all-reduce inside XLA TPU's all-reduce-scatter fusion."""
    out = [(c, n) for c, ins in comps.items() for n, (op, _) in ins.items()
           if op in ("reduce-scatter", "reduce-scatter-start")]
    out += [(c, n) for c, ins in comps.items() if c.startswith("%all-reduce-scatter")
            for n, (op, _) in ins.items() if op in ("all-reduce", "all-reduce-start")]
    return out


def _producers(comps: dict, comp: str, name: str) -> set[str]:
    """The ``op_name`` of the named instructions whose values feed ``name`` through unnamed ones
    (a TPU fusion's parameters: the fusion instruction's operands in its caller)."""
    caller = next(((c, n) for c, ins in comps.items() for n, (_, rest) in ins.items()
                   if f"calls={comp}," in rest + ","), None)
    if caller is not None:  # inside a fusion: start from the fusion instruction's operands
        comp, name = caller
    ins, names, todo, seen = comps[comp], set(), _operands(comps[comp][name][1]), set()
    while todo:
        n = todo.pop()
        if n in seen or n not in ins:
            continue
        seen.add(n)
        op = re.search(r'op_name="([^"]*)"', ins[n][1])
        if op:
            names.add(op.group(1))
        elif ins[n][0] != "parameter":
            todo += _operands(ins[n][1])
    return names


@pytest.fixture(scope="module", params=list(MESHES))
def compiled(request) -> dict:
    target, (devices, mesh) = request.param, MESHES[request.param]
    out = {"target": target}
    for policy in ("nothing_saveable", "no_remat"):
        cfg = RunConfig(target=target, target_devices=devices, mesh=mesh, policy=policy,
                        compile_only=True, **SMALL)
        problem = problem_for(cfg)
        out[policy] = compile_for_analysis(jit_step(problem).trace(*problem.args).lower()).as_text()
        out[policy + "_problem"] = problem
    return out


@pytest.mark.parametrize("policy", ["nothing_saveable", "no_remat"])
def test_gradient_reduce_scatters_are_backward_and_parameter_gathers_forward(compiled, policy):
    text, witness = compiled[policy], compiled["no_remat"]
    assert "is_scheduled=true" in text.splitlines()[0]
    comps, entry = _walk(text)
    forward, backward = _loops(comps, entry)
    phases = {(r["computation"], r["name"]): r["phase"] for r in rows(text, witness)}
    scatters = _gradient_scatters(comps)
    assert scatters
    for comp, name in scatters:
        assert comp in backward, (comp, name)  # in the loop that runs after the forward's
        made = _producers(comps, comp, name)
        assert made and all("transpose(" in op for op in made), made  # reduces gradients
        assert phases[comp, name] == "backward", (comp, name)
    gathers = [(c, n) for c in forward for n, (op, _) in comps[c].items()
               if op in ("all-gather", "all-gather-start")]
    assert gathers
    assert all(phases[key] == "forward" for key in gathers), {k: phases[k] for k in gathers}
    # Nothing the backward loop runs is called forward.
    assert all(p != "forward" for (c, _), p in phases.items() if c in backward)


def test_the_report_counts_no_forward_reduce_scatter(compiled):
    text, witness = compiled["nothing_saveable"], compiled["no_remat"]
    counts = collectives(text, witness)
    comps, _ = _walk(text)
    per_step = SMALL["depth"] * len(_gradient_scatters(comps))  # each in the scanned body
    kind = "reduce-scatter" if compiled["target"] == "h100" else "all-reduce"
    assert counts[kind]["backward"]["count"] >= per_step
    if kind == "reduce-scatter":
        assert counts[kind]["forward"]["count"] == 0 and counts[kind]["backward"]["count"] == per_step
    doc = report(compiled["nothing_saveable_problem"], text, None, witness)
    assert doc["collectives"] == counts and "while loop body" in doc["method"]
