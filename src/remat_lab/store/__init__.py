"""Storage beside the studies: the run history, results files and byte-bounded caches."""
