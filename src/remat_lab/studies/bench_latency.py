"""One request through the app's run path, timed stage by stage (the ``st.status`` stand-in)."""

from __future__ import annotations

import time

from remat_lab.config import RunConfig


class Status:
    """Stands in for ``st.status``: records when each stage label appears."""

    def __init__(self, labels: dict[str, str]):
        self.labels, self.marks = labels, []

    def update(self, label: str = "", **_):
        stage = next((s for s, text in self.labels.items() if text in label), label)
        self.marks.append((stage, time.perf_counter()))


def timed_run(run, config: RunConfig, labels: dict) -> dict:
    """One request through ``run``: total seconds, seconds per stage and the overhead ratio.

    ``core_s`` = the engine's own lower_s + compile_s + the timing stage; ``build_s`` = model
    initialisation (reported, kept out of the ratio: it is neither dissection nor bookkeeping).
    """
    status = Status(labels)
    t0 = time.perf_counter()
    result = run(config, status)
    t_end = time.perf_counter()
    marks = [("start", t0), *status.marks, ("end", t_end)]
    stages: dict[str, float] = {}
    for (name, t), (_, t_next) in zip(marks, marks[1:]):
        stages[name] = stages.get(name, 0.0) + t_next - t
    total = t_end - t0
    core = (result["compile"]["lower_s"] + result["compile"]["compile_s"]
            + stages.get("timing", 0.0))
    build = stages.get("start", 0.0) + stages.get("building", 0.0)
    return {"total_s": total, "stages_s": stages, "build_s": build, "core_s": core,
            "overhead_ratio": (total - build) / core if core else None,
            "reported_median_s": result["step_time_s"]["median"]}
