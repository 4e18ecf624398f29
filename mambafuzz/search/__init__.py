"""The search: campaign supervisor, worker protocol and runtimes, fuzz targets, scoped instrumentation, minimizer, coverage map and planted bugs (mutants)."""
