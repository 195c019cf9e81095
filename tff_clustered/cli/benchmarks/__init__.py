"""The benchmarks of `binaries/benchmark.py`, one module each.

The benchmarks `binaries/benchmark.py` runs, one module each (its flags and its `BENCHMARK`),
named in `registry`; what several of them share (the workload flags, timing against a reference
in the same run, the rounds they time) is in `common`."""
