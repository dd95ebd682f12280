"""The search's compiles as they land: each program compiled once, said as progress, held to the estimate."""

from __future__ import annotations

import time
from collections.abc import Callable

from remat_lab.config import RunConfig
from remat_lab.studies.plan.fanout import Fanout
from remat_lab.studies.progress import Step

Progress = Callable[[str], None]


class Said:
    """The search's progress as counted steps: compiles done of those planned, one row each, after
    the estimate by hand's rows (``estimates``: labelled so, kept above the compiles as they land)."""

    def __init__(self, say: Progress) -> None:
        self.say, self.t0, self.rows, self.planned = say, time.time(), [], 0
        self.estimates: list[dict] = []
        self.programs: dict[RunConfig, tuple] = {}  # each program compiled, to the key it was filed under
        self.instant: dict[tuple, dict] = {}  # the estimate by hand of each candidate

    def __call__(self, text: str, row: dict | None = None) -> None:
        if row is not None:
            self.rows.append(row)
        now = time.time()
        done = len(self.rows)
        left = (now - self.t0) / done * (self.planned - done) if done and self.planned > done else None
        self.say(Step(text, phase="compiling", done=done, planned=self.planned or None,
                      unit="compiles", item="compile", at_most=True, elapsed_s=now - self.t0,
                      phase_s=now - self.t0, left_s=left, left_why="from the pace so far; the "
                      "compiles that check the best plans may end the search sooner",
                      rows=tuple(self.estimates + self.rows), at=now))


def collect(pool: Fanout, jobs: list, compiled: dict, extras: dict, say: Said) -> None:
    """Compile ``jobs``, filing each answer as it lands; a program already compiled in this search
    (the published configuration is one of the search's candidates) is filed from it, not again."""
    fresh = []
    for key, config in jobs:
        same = say.programs.get(_program(config))
        if same is None:
            fresh.append((key, config))
            say.programs[_program(config)] = key
            continue
        _file(key, dict(extras[same[1]] if same[0] == "extra" else compiled[same], same_as=key_text(same)),
              compiled, extras, say)
    for key, out in pool.run(fresh):
        if isinstance(out, Exception):
            text = str(out).strip()
            out = {"error": f"{type(out).__name__}: {text.splitlines()[0][:300] if text else ''}"}
        _file(key, out, compiled, extras, say)


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
