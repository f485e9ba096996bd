"""edge.model.class_labels: a class folder is an index (ASCII digits only) or a line of the labels file; a name that
several lines carry is refused naming them."""

import pytest

from edge.errors import EdgeError
from edge.model.class_labels import index_of_name, is_index, label_lines


def test_an_index_is_ascii_digits_only():
    assert is_index("7") and is_index("0123")
    assert not any(is_index(name) for name in ("\u00b2", "\u2460", "\u0661", "7a", "", "-1"))


def test_a_name_is_its_line_and_a_name_two_lines_carry_is_refused_naming_both():
    lines = label_lines(["tench", "crane", "goldfish", "crane"])
    assert index_of_name("goldfish", lines, "set") == 2 and index_of_name("owl", lines, "set") is None
    with pytest.raises(EdgeError, match=r"^regression: folder 'crane' is ambiguous: lines 2 and 4 of the labels "
                                        r"file all say it \(class indices 1 and 3\)"):
        index_of_name("crane", lines, "regression")
    assert label_lines(None) == {}
