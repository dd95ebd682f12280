"""One configuration's policies compiled for several targets: the compiled peak per policy per target.

``compare_across_targets`` compiles every (policy, target) pair and runs nothing it does not have
to: named targets compile only (``run_experiment`` on a target), ``local`` is compiled and checked
without timing (``run_experiment(config, timing=False)``), so every row is a compiled-memory figure
of the same kind. The document (``kind: "across_targets"``, schema 1) is JSON-ready.
"""

from __future__ import annotations

from collections.abc import Callable

from remat_lab.config import LOCAL, ConfigError, RunConfig, get_target, mesh_devices
from remat_lab.program.backend import ExecutionError, device_memory_limit, environment
from remat_lab.studies.experiment import run_experiment
from remat_lab.studies.progress import Tracker

METHOD = ("Every policy compiled for every target with the same configuration; named targets are "
          "compiled without the device (nothing runs), local is compiled and checked but not timed. "
          "Peak = XLA's memory analysis of the compiled step (generated code + arguments + outputs "
          "- aliases + temp), per device.")


def _compile_only(cfg: RunConfig) -> dict:
    """The default way to get one pair's document: the engine, in this process, untimed."""
    return run_experiment(cfg, timing=False)


def _target_section(name: str, doc: dict) -> dict:
    """Platform, device kind and memory of ``name`` (local: the attached backend's)."""
    if name != LOCAL:
        t = get_target(name)
        return {"platform": t.platform, "device_kind": t.device_kind, "memory_bytes": t.memory_bytes,
                "usable_bytes": t.usable_bytes()}
    env = doc.get("environment") or {}
    limit = device_memory_limit()
    return {"platform": env.get("backend"), "device_kind": env.get("device_kind"),
            "memory_bytes": limit, "usable_bytes": limit}


def _row(target: str, policy: str, doc: dict) -> dict:
    mem, hlo, timing = doc.get("memory") or {}, doc.get("hlo") or {}, doc.get("timing") or {}
    row = {"target": target, "policy": policy, **_target_section(target, doc),
           "peak_bytes": mem.get("peak_bytes"), "temp_bytes": mem.get("temp_bytes"),
           "argument_bytes": mem.get("argument_bytes"), "output_bytes": mem.get("output_bytes"),
           "host_temp_bytes": mem.get("host_temp_bytes"),
           "excess_dots_vs_no_remat": hlo.get("excess_dots_vs_no_remat"),
           "identical_to": hlo.get("identical_to"), "flops": doc.get("flops"),
           "estimate_s": timing.get("estimate_s"), "estimate_basis": timing.get("estimate_basis"),
           "predicted_s": timing.get("predicted_s"),
           "compile_s": (doc.get("compile") or {}).get("compile_s")}
    usable, peak = row["usable_bytes"], row["peak_bytes"]
    row["fits"] = None if usable is None or peak is None else bool(peak <= usable)
    return row


def rankings(rows: list[dict]) -> dict[str, list[str]]:
    """Per target, its policies from the smallest compiled peak to the largest (ties by name)."""
    out: dict[str, list[tuple[int, str]]] = {}
    for r in rows:
        if r.get("peak_bytes") is not None:
            out.setdefault(r["target"], []).append((r["peak_bytes"], r["policy"]))
    return {t: [p for _, p in sorted(pairs)] for t, pairs in out.items()}


def compare_across_targets(config: RunConfig, policies: list[str], targets: list[str],
                           progress: Callable[[str], None] | None = None,
                           run: Callable[[RunConfig], dict] | None = None,
                           local_mesh: str | None = None) -> dict:
    """Compile ``config`` under each of ``policies`` for each of ``targets``: one row per pair.

    ``run`` gives one pair's run document (default: ``run_experiment(cfg, timing=False)`` here; the
    app passes its worker pool). ``local_mesh``: the local rows' mesh when it is not ``config``'s
    (``""``: one device, for a host without the mesh's devices; kept in the document). A pair XLA
    cannot compile is listed under ``failed``; a bad configuration raises ``ConfigError`` before
    anything compiles.
    """
    if not policies or not targets:
        raise ConfigError("name at least one policy and one target.")
    run = run or _compile_only
    devices = mesh_devices(config.mesh)
    local = config if local_mesh is None else config.replace(mesh=local_mesh)
    pairs = [(t, p, config.replace(policy=p, target=t, target_devices=devices) if t != LOCAL
              else local.replace(policy=p, target_devices=1))
             for t in targets for p in policies]  # every configuration validated before compiling
    # Each step also carries the counts and the rows so far (the page's partial table).
    say = Tracker(progress, planned=len(pairs), unit="compiles", item="compile", phase="compiling")
    rows, failed = [], []
    for i, (target, policy, cfg) in enumerate(pairs, 1):
        say(f"Compiling {policy} for {target} ({i} of {len(pairs)})")
        try:
            doc = run(cfg)
        except ExecutionError as err:
            failed.append({"target": target, "policy": policy, "error": str(err)})
            say.finished({**failed[-1]}, f"{policy} for {target}: failed")
            continue
        rows.append(_row(target, policy, doc))
        say.finished(rows[-1], f"{policy} for {target}: compiled")
    return {"schema": 1, "kind": "across_targets", "config": config.as_dict(),
            "local_mesh": local.mesh, "policies": list(policies), "targets": list(targets), "rows": rows,
            "rankings": rankings(rows),
            "failed": failed, "method": METHOD, "environment": environment()}
