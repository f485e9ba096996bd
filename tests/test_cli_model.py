"""edge.cli.model (`edge model add`): its error lines say `edge model add`, and its flags are ModelAddOptions'
declarations. (What it records: test_user_model.py.)"""

import pytest

from edge.cli.main import build_parser, main
from edge.fields import leaves
from edge.model.model_add_options import ModelAddOptions


def test_a_refusal_is_one_line_of_edge_model_add(tmp_path, capsys):
    assert main(["model", "add", str(tmp_path / "m.pt")]) == 2
    assert capsys.readouterr().err == "edge model add: error: {}: not an .onnx file\n".format(tmp_path / "m.pt")


def test_every_declared_option_is_a_flag_and_an_action_is_required(capsys):
    add = build_parser().parse_args(["model", "add", "m.onnx"])
    assert add.model == "m.onnx" and add.command == "model add"
    assert {dotted for dotted, _, _ in leaves(ModelAddOptions)} <= set(vars(add))
    with pytest.raises(SystemExit) as err:
        build_parser().parse_args(["model"])
    assert err.value.code == 2 and "ACTION" in capsys.readouterr().err
