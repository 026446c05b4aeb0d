"""Dataset generation: synthetic logical benchmarks built from real text."""
