"""edge.model.model_add_options: `edge model add`'s R,G,B values are three finite numbers, refused in one line naming
the flag otherwise, before any model is read."""

import pytest

from edge.errors import EdgeError
from edge.fields import check_options
from edge.model.model_add_options import ModelAddOptions, parse_triple


def test_three_numbers_by_commas_or_spaces_and_nothing_else():
    assert parse_triple("0.485,0.456,0.406", "--mean") == [0.485, 0.456, 0.406]
    assert parse_triple("0.5 0.5  0.5", "--std") == [0.5, 0.5, 0.5]
    for bad in ("0.5,0.5", "0.5,0.5,0.5,0.5", "0.5,nan,0.5", "inf,1,1", "red,green,blue", ""):
        with pytest.raises(EdgeError, match=r"^--mean must be three numbers R,G,B \(of pixels scaled to 0-1"):
            parse_triple(bad, "--mean")


def test_the_declared_checks_name_the_flag():
    check_options(ModelAddOptions())  # "": ImageNet's values
    for options, flag in ((ModelAddOptions(std="1,2"), "--std"), (ModelAddOptions(colour="grey"), "--colour"),
                          (ModelAddOptions(expected_top1=96.0), "--expected-top1")):
        with pytest.raises(EdgeError, match="^" + flag + " must "):
            check_options(options)
