"""libtpu's own cost model held against MaxText's measured TPU runs (not in the test run; minutes a run).

    python benchmarks/libtpu_model.py llama3.1-8b-v6e-256 [NAME ...]

For each catalogued TPU run (``python -m remat_lab published``): the lab's configuration of it
(``published --check``'s), libtpu's ``optimal_seconds`` read at one and two unrolled layers and
extrapolated by layer (``studies/tpu_cost_model.py``), the measured step and their ratio.
"""

from __future__ import annotations

import json
import sys

from remat_lab.config import published as pub
from remat_lab.program.backend import enable_compilation_cache
from remat_lab.studies.published import config_for
from remat_lab.studies.tpu_cost_model import layered_optimal_seconds


def main(names: list[str]) -> int:
    enable_compilation_cache()
    for name in names:
        config, _ = config_for(name)
        found = layered_optimal_seconds(config)
        measured = pub.measured_step_s(pub.run_named(name))
        step = measured["step_s"] if measured else None
        ratio = found["optimal_seconds"] / step if found.get("optimal_seconds") and step else None
        print(json.dumps({"name": name, **found, "measured_step_s": step,
                          "libtpu_over_measured": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
