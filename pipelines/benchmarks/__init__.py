"""Method benchmarks that score methods directly (not through runs): ITLR's synthetic logical benchmark."""
