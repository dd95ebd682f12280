"""The compiled program's schedule on a GPU: kernels in order, asynchronous collectives beside them.

XLA's latency-hiding scheduler writes a collective as a ``*-start`` / ``*-done`` pair with kernels
between them: the collective runs on its own stream from its start (once the previous collective
is done: NCCL's collectives share one stream) while those kernels run, and the kernel stream waits
at the ``done`` only for what is left of it. A collective without a start (synchronous) holds the
kernel stream for its whole time. ``walk`` replays each computation that runs (the entry, loop
bodies times their trip counts, as ``kernels.kernels_of``) in its scheduled order:
``step_s`` is the kernels plus the waits; ``exposed_s`` the waits alone (the collectives' time the
schedule does not hide); ``collectives_s`` every collective's own time.

A collective's time: its ring bytes (``estimate``'s factors for its kind and group) over the
interconnect within a host, and for a group spanning S hosts of P devices the hierarchical split
``traffic.HIERARCHY`` prices (a ring over P on the bytes, a ring over S on a P-th of them at the
cross-host figure).
"""

from __future__ import annotations

from remat_lab.analysis import collectives, hlo, hlotext, traffic
from remat_lab.analysis.estimate import ring_bytes
from remat_lab.config import Target


def collective_seconds(row: dict, target: Target) -> float:
    """One run of the collective ``row`` (``collectives.rows``) on ``target``'s links."""
    ici, dcn = target.interconnect_bytes_per_s, target.dcn_bytes_per_s
    kind, size, group, spans = row["kind"], float(row["bytes"]), int(row["group"]), int(row["spans"])
    if row["link"] == "ici" or spans <= 1:
        return ring_bytes(kind, size, group) / ici if ici else 0.0
    if spans == group:  # one device a slice or host: all of it crosses
        return ring_bytes(kind, size, spans) / dcn if dcn else 0.0
    per_host = group // spans
    inside = ring_bytes(kind, size, per_host) / ici if ici else 0.0
    across = ring_bytes(kind, size / per_host, spans) / dcn if dcn else 0.0
    return inside + across


def events(text: str, granules: list[int] | None = None) -> dict:
    """The schedule to replay, JSON-ready: ``computations``, each ``[runs, [[tag, name], ...]]``
    in scheduled order (tags: ``k`` a kernel by ``kernels_of``'s row name, ``s`` a collective's
    start, ``d`` its done by the start's name, ``c`` a synchronous collective), and
    ``collectives``: ``collectives.rows`` by name (what prices each)."""
    text = hlotext.joined(text)
    module = traffic.Module(text)
    runs, _ = hlo.executions(text)
    devices = hlotext.devices_of(text)
    found = {r["name"]: {k: r[k] for k in ("kind", "bytes", "group", "spans", "link")}
             for r in collectives.rows(text, granules=granules or [0] * devices)}
    out = []
    for comp in module.running():
        seq = []
        for op in module.comps[comp]:
            if op.name in found:
                seq.append(["s" if op.opcode.endswith("-start") else "c", op.name])
            elif op.opcode.endswith("-done") and op.operands and op.operands[0] in found:
                seq.append(["d", op.operands[0]])
            elif op.opcode not in traffic.FREE and not op.opcode.endswith(traffic.ASYNC_OPEN):
                seq.append(["k", op.name])
        out.append([max(runs.get(comp, 1), 1), seq])
    return {"computations": out, "collectives": found}


def walk(found: dict, kernel_s: dict[str, float], target: Target, beside: tuple[str, ...] = ()) -> dict:
    """``{"step_s", "kernels_s", "exposed_s", "collectives_s"}`` of one step (see the module's
    docstring) from ``events``' answer. ``kernel_s``: each kernel's seconds for one run, by the
    name ``kernels_of`` gives its row (a ``*-done``'s name for an asynchronous kernel).
    ``beside``: collective kinds left out of the kernels' way whatever the schedule writes (a TPU
    run whose libtpu flags overlap them: ``COLLECTIVE_OVERLAPS``): their time is ``beside_s``, not
    in ``collectives_s``."""
    comm = {name: collective_seconds(r, target) for name, r in found["collectives"].items()
            if r["kind"] not in beside}
    aside = {name: collective_seconds(r, target) for name, r in found["collectives"].items()
             if r["kind"] in beside}
    apart = 0.0  # the collectives beside: their own stream, as long as the kernels or longer
    total = kernels = exposed = moved = 0.0
    for times, seq in found["computations"]:
        clock = stream = own = 0.0  # kernel stream, collective stream, kernels alone
        pending: dict[str, float] = {}
        for tag, name in seq:
            if tag in ("s", "c", "d") and name not in comm:
                apart += times * aside.get(name, 0.0) * (tag != "d")
                continue  # beside the kernels
            if tag in ("s", "c"):
                stream = max(clock, stream) + comm[name]
                moved += times * comm[name]
                if tag == "s":
                    pending[name] = stream
                else:  # synchronous: the kernel stream waits for all of it
                    clock = stream
            elif tag == "d":
                clock = max(clock, pending.pop(name, clock))
            else:
                clock += kernel_s.get(name, 0.0)
                own += kernel_s.get(name, 0.0)
        clock = max(clock, *pending.values()) if pending else clock
        total += times * clock
        kernels += times * own
        exposed += times * (clock - own)
    return {"step_s": total, "kernels_s": kernels, "exposed_s": exposed, "collectives_s": moved,
            "beside_s": apart}
