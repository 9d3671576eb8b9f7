"""The Markdown table helper every report, benchmark and command table goes through."""

import pytest

from rpc_attention.markdown import format_seconds, markdown_cell, markdown_table


def test_table_lines_escape_and_alignment():
    lines = markdown_table(["name", "value"], [["a|b", 1.5], ["two\nlines", None]], align="lr")
    assert lines == ["| name | value |", "|---|---:|", "| a\\|b | 1.5 |", "| two lines |  |"]


def test_default_alignment_and_centre():
    assert markdown_table(["x"], [])[1] == "|---|"
    assert markdown_table(["x", "y"], [], align="cl")[1] == "|:---:|---|"


def test_cell_formatting():
    assert markdown_cell(None) == "" and markdown_cell(0) == "0" and markdown_cell("a\r\nb") == "a b"


def test_bad_shapes_name_the_fix():
    with pytest.raises(ValueError, match="row 1 has 1 cells, the header 2"):
        markdown_table(["a", "b"], [[1, 2], [3]])
    with pytest.raises(ValueError, match="one of l/r/c for each of the 2 columns"):
        markdown_table(["a", "b"], [], align="l")
    with pytest.raises(ValueError, match="at least one column"):
        markdown_table([], [])


def test_format_seconds_is_the_one_duration_format():
    assert [format_seconds(s) for s in (None, 0, 42.4, 59.7, 185, 3599.6, 7620)] == [
        "-", "0s", "42s", "1m00s", "3m05s", "1h00m", "2h07m"]
