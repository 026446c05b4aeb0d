"""Markdown tables written one way (pipelines/markdown.py), byte for byte as the reports write them."""

from __future__ import annotations

import pytest

from logicrank.pipelines.markdown import table


def test_a_table_is_a_header_a_separator_and_a_line_per_row():
    assert table(["run", "nDCG@10", ""], [["bm25", "0.6851", "reproduced"], ["dense", "0.6451", ""]], "lrl") == [
        "| run | nDCG@10 | |", "|---|---:|---|", "| bm25 | 0.6851 | reproduced |", "| dense | 0.6451 |  |"]
    assert table(["a"], []) == ["| a |", "|---|"]
    assert table(["n", "k"], [(1, 2.5)], "rr")[2] == "| 1 | 2.5 |"


def test_a_table_refuses_alignments_that_do_not_match_its_columns():
    with pytest.raises(ValueError, match="2 columns but 3 alignments"):
        table(["a", "b"], [], "lrr")
