"""The plain-text tables kubectl-inspect-cgpu, gpushare-smi and the simulator print."""

import pytest

from gpushare.table import render


def test_columns_are_padded_to_their_widest_cell_and_lines_end_without_spaces():
    rows = [["a", 0, "x"], ["longer", 12, ""]]
    assert render(["NAME", "GPU", "POD"], rows) == "NAME    GPU  POD\na       0    x\nlonger  12"


def test_the_gap_between_columns_is_a_parameter():
    assert render(["A", "B"], [["1", "2"]], gap=1) == "A B\n1 2"


def test_a_row_with_more_cells_than_the_header_is_an_error_not_a_dropped_column():
    with pytest.raises(ValueError, match="zip"):
        render(["NAME"], [["a", "extra"]])
