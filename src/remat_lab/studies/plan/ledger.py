"""The search's compiles as they land: each program compiled once, said as progress, held to the estimate."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from remat_lab.config import RunConfig
from remat_lab.studies.plan.fanout import Fanout
from remat_lab.studies.progress import Step

Progress = Callable[[str], None]


# The longest the search is silent while compiles run: a line at least this often (issue 64: 30 s).
HEARTBEAT_S = 10.0


class Said:
    """The search's progress as counted steps: compiles done of those planned, one row each, after
    the estimate by hand's rows (``estimates``: labelled so, kept above the compiles as they land,
    each carrying the estimate's error against the compiles so far). ``why``: what the compiles
    now running are for; a heartbeat line while they run (``beat``)."""

    def __init__(self, say: Progress) -> None:
        self.say, self.t0, self.rows, self.planned = say, time.time(), [], 0
        self.estimates: list[dict] = []
        self.programs: dict[RunConfig, tuple] = {}  # each program compiled, to the key it was filed under
        self.instant: dict[tuple, dict] = {}  # the estimate by hand of each candidate
        self.first: float | None = None  # when the first compile started
        self.last, self.why, self.workers = time.time(), "", 1
        self.running: list[tuple] = []  # the keys in flight, in the order they were handed out
        self.lock = threading.Lock()

    def errors(self) -> list[float]:
        """The estimate by hand's peak against each compile that fit so far, relative."""
        return [abs(r["estimate_peak_bytes"] - r["peak_bytes"]) / r["peak_bytes"] for r in self.rows
                if r.get("estimate_peak_bytes") and r.get("peak_bytes")]

    def __call__(self, text: str, row: dict | None = None) -> None:
        with self.lock:
            if row is not None:
                self.rows.append(row)
                errs = sorted(self.errors())
                if errs:
                    note = (f"an estimate: off by up to {errs[-1]:.0%} (median {errs[len(errs) // 2]:.0%}) "
                            f"on the {len(errs)} compile{'s' * (len(errs) != 1)} so far")
                    self.estimates = [{**e, "error": note} for e in self.estimates]
            now = time.time()
            self.last = now
            done = len(self.rows)
            # the pace since the first compile started, so the time left is honest from the first one
            left = ((now - self.first) / done * (self.planned - done)
                    if done and self.first and self.planned > done else None)
            self.say(Step(text, phase="compiling", done=done, planned=self.planned or None,
                          unit="compiles", item="compile", at_most=True, elapsed_s=now - self.t0,
                          phase_s=now - self.t0, left_s=left, left_why="from the pace since the first "
                          "compile; the planned count is at most: the check may end sooner",
                          rows=tuple(self.estimates + self.rows), at=now))

    def beat(self) -> None:
        """A line while compiles run: which, for how long, how many are left and why."""
        now = time.time()
        if now - self.last < HEARTBEAT_S:
            return
        running = self.running[:max(self.workers, 1)]
        since = self.first or self.t0
        names = ", ".join(key_text(k) for k in running[:2]) + (" and more" if len(running) > 2 else "")
        left = max(len(self.running) - len(running), 0)
        self(f"compiling {names or 'the next batch'} ({_clock(now - since)} since the first compile); "
             f"{left} more queued in this phase: {self.why or 'the search'}")


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def collect(pool: Fanout, jobs: list, compiled: dict, extras: dict, say: Said) -> None:
    """Compile ``jobs``, filing each answer as it lands; a program already compiled in this search
    (the published configuration is one of the search's candidates) is filed from it, not again."""
    fresh, again = [], []
    for key, config in jobs:
        same = say.programs.get(_program(config))
        if same is None:
            fresh.append((key, config))
            say.programs[_program(config)] = key
        else:  # filed once its first compile has landed (it may be in this batch)
            again.append((key, same))
    if fresh:
        _compile(pool, fresh, compiled, extras, say)
    for key, same in again:
        _file(key, dict(extras[same[1]] if same[0] == "extra" else compiled[same], same_as=key_text(same)),
              compiled, extras, say)


def _compile(pool: Fanout, fresh: list, compiled: dict, extras: dict, say: Said) -> None:
    """The programs not compiled before, with a heartbeat while they run."""
    say.first = say.first or time.time()
    say.running = [k for k, _ in fresh]
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(HEARTBEAT_S / 4):
            say.beat()

    beating = threading.Thread(target=heartbeat, daemon=True, name="plan-heartbeat")
    beating.start()
    try:
        for key, out in pool.run(fresh):
            if isinstance(out, Exception):
                text = str(out).strip()
                out = {"error": f"{type(out).__name__}: {text.splitlines()[0][:300] if text else ''}"}
            if key in say.running:
                say.running.remove(key)
            _file(key, out, compiled, extras, say)
    finally:
        stop.set()
        beating.join()


def _program(config: RunConfig) -> RunConfig:
    return config.replace(repeats=1, warmup=0, seed=0)  # none of these changes the program


def _file(key: tuple, out: dict, compiled: dict, extras: dict, say: Said) -> None:
    if key[0] == "extra":
        extras[key[1]] = out
    else:
        compiled[key] = out
    said = out.get("error") or ("refused (over HBM)" if out["refused"] else
                                f"peak {out['peak_bytes'] / 2**30:.2f} GiB")
    if out.get("same_as"):
        said += f" (the same program as {out['same_as']}: not compiled again)"
    gap = _gap(say.instant.get(key), out)
    if gap:
        out["estimate_gap"] = gap
    say(f"compiled {key_text(key)}: {said}" + (f". {gap}" if gap else ""),
        {"what": key_text(key), "peak_bytes": None if out.get("error") or out["refused"]
         else out["peak_bytes"], "predicted_s": out.get("predicted_s"), "took_s": out.get("compile_s"),
         "error": said if out.get("error") or out["refused"] else None,
         "estimate_peak_bytes": (say.instant.get(key) or {}).get("instant_peak_bytes"),
         "estimate_s": (say.instant.get(key) or {}).get("instant_step_s"), "note": gap})


def _gap(est: dict | None, out: dict) -> str | None:
    """A sentence when the estimate by hand is more than 2x off a compile, with what it leaves out."""
    if not est or out.get("error") or out["refused"]:
        return None
    parts = []
    p, q = est["instant_peak_bytes"], out["peak_bytes"]
    if p and q and max(p / q, q / p) > 2:
        parts.append(f"the estimate by hand said {p / 2**30:.2f} GiB, {max(p / q, q / p):.1f}x off the "
                     "compile: it counts parameters, optimizer state, saved names, one layer's working "
                     "set and gathered weights, not the buffers XLA adds (collectives' staging, "
                     "copies, padding)")
    e, s = est["instant_step_s"], out.get("predicted_s")
    if e and s and max(e / s, s / e) > 2:
        parts.append(f"the estimate by hand said a {e:.3g} s step, {max(e / s, s / e):.1f}x off the "
                     f"compile's {s:.3g} s, which is limited by {out.get('limited_by') or 'its kernels'}: "
                     "the estimate prices the model's flops, recomputation and its collectives at "
                     "the link's rate, not the kernels' own efficiency or exposed communication")
    return "; ".join(parts) or None


def key_text(key: tuple) -> str:
    if key[0] == "extra":
        return f"the published configuration {key[1]}"
    fam, b, m = key
    return f"{fam.mesh} · {fam.plan}{' · optimizer offload' if fam.optimizer_offload else ''} · b{b}x{m}"
