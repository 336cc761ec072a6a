"""The benchmarks: a module each, run from the repository root as ``python -m benchmarks.NAME``, importing their
shared code (:mod:`.common`) and each other relatively; their tables go to benchmarks/results/."""
