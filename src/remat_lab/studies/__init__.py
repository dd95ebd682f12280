"""The studies layer: one run, comparisons, the advisor, sweeps and the benchmark, composed from below."""
