"""edge.model.artifacts: the onnx-qdq format's install check parses, checks and runs a staged model once, and refuses
one that does not, or that answers zeros with a non-finite output, in one line naming the file (exit 1)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.errors import EXIT_FAIL, EdgeError
from edge.model.artifacts import verify_onnx


def one_op_model(path, op, constant):
    """input [1, 3] -> `op`(input, constant) -> output."""
    graph = helper.make_graph([helper.make_node(op, ["input", "c"], ["output"])], "one",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 3])],
                              [numpy_helper.from_array(np.asarray(constant, np.float32), "c")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_a_model_that_runs_on_zeros_passes(tmp_path):
    verify_onnx(one_op_model(tmp_path / "add.onnx", "Add", [1.0, 2.0, 3.0]))  # a symbolic batch axis runs as 1


@pytest.mark.parametrize("name,says", [("div.onnx", "non-finite output"), ("bytes.onnx", "verification failed: ")])
def test_a_model_that_does_not_load_or_answers_non_finite_is_refused_naming_it(tmp_path, name, says):
    path = tmp_path / name
    if name == "bytes.onnx":
        path.write_bytes(b"\x00not a model" * 8)
    else:
        one_op_model(path, "Div", [0.0, 0.0, 0.0])  # 0 / 0 is NaN
    with pytest.raises(EdgeError) as err:
        verify_onnx(str(path))
    assert str(err.value).startswith(str(path) + ": verification failed") and says in str(err.value)
    assert err.value.exit_code == EXIT_FAIL and "\n" not in str(err.value)
