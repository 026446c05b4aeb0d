"""Markdown tables written one way (pipelines/markdown.py, through tabulate)."""

from __future__ import annotations

import pytest

from logicrank.pipelines.markdown import table


def test_a_table_is_a_header_a_separator_and_a_line_per_row_padded_to_its_columns():
    assert table(["run", "nDCG@10", ""], [["bm25", "0.6851", "reproduced"], ["dense", "0.6451", ""]], "lrl") == [
        "| run   |   nDCG@10 |            |",
        "|:------|----------:|:-----------|",
        "| bm25  |    0.6851 | reproduced |",
        "| dense |    0.6451 |            |"]
    assert table(["a"], []) == ["| a   |", "|-----|"]  # tabulate aligns no column of an empty table


def test_cells_are_written_as_they_are():
    """No number is re-formatted: 0.6850 keeps its zero, 1e-05 its spelling, an id its zeros."""
    assert table(["n", "x", "id"], [(1, "0.6850", "007"), (10, 1e-05, "x")], "rrl")[2:] == [
        "|   1 | 0.6850 | 007  |", "|  10 |  1e-05 | x    |"]


@pytest.mark.parametrize("align", ["lrr", "l", "lx"])
def test_a_table_refuses_alignments_that_do_not_match_its_columns(align):
    with pytest.raises(ValueError, match="2 columns need as many alignments"):
        table(["a", "b"], [], align)


def test_a_pipe_or_a_line_break_in_a_cell_stays_in_its_cell():
    """A group value holding ``|`` (a template "A|B") ended its cell and moved every figure after
    it one column to the right; a line break ended the row."""
    lines = table(["run", "template", "n"], [["b10", "A|B", 5], ["b3", "two\nlines", 1]], "llr")
    assert lines[2] == "| b10   | A\\|B       |   5 |" and lines[3] == "| b3    | two lines  |   1 |"
