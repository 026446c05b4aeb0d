"""The LAG benchmark's oracle verdict and report (the runs themselves: tests/integration/test_lag.py)."""

from pathlib import Path

from jobs import lag_bench


def test_the_oracle_table_says_whether_each_reference_is_reproduced():
    oracle = {"question": 0.6975, "gold-chain": 0.9100, "gold-no-answer": 0.6775, "gold-random-order": 0.84}
    report = lag_bench._report("musique", {"queries": 100, "docs": 1890}, oracle, None, None, Path("."), None, 0, None, 0, {"all": 1.0})
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines() if line.startswith("| ")}
    assert rows["whole question, top 5 x hops"].endswith("| 0.6975 | 0.697 | reproduced |")
    assert "NOT reproduced (tolerance 0.01)" in rows["gold chain, previous answer in the retrieval text (LAG)"]  # 0.016 off
    assert rows["gold chain in random order"].endswith("| 0.8400 |  |  |")  # no reference for it
    assert lag_bench._verdict(0.6875, 0.697) == "reproduced" and lag_bench._verdict(0.6865, 0.697).startswith("NOT")
