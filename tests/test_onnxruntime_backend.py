"""edge.infer.onnxruntime_backend: ONNX Runtime runs the exported model. A model the pipeline cannot feed is refused
at load, in one line naming it (exit 2, so systemd does not restart into the same failure), and what the service
reports serving is the bytes it loaded."""

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.errors import EdgeError
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend

from conftest import assert_refused, run_edge


def tiny_model(path, elem=TensorProto.FLOAT, shape=(1, 3, 8, 8), external=False):
    """input -> Conv (3 -> 3, 1x1) -> GlobalAveragePool -> Flatten: 3 logits; labels a, b, c beside it."""
    weight = numpy_helper.from_array(np.eye(3, dtype=np.float32).reshape(3, 3, 1, 1), "w")
    nodes = [helper.make_node("Cast", ["input"], ["x"], to=TensorProto.FLOAT),
             helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Flatten", ["p"], ["logits"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input", elem, list(shape))],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    else:
        onnx.save(model, str(path))
    path.with_suffix(".labels.txt").write_text("a\nb\nc\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("elem,shape,named", [
    (TensorProto.INT8, (1, 3, 8, 8), "int8 [1, 3, 8, 8]"),
    (TensorProto.FLOAT16, (1, 3, 8, 8), "float16 [1, 3, 8, 8]"),
    (TensorProto.UINT8, (1, 3, 8, 8), "uint8 [1, 3, 8, 8]"),
    (TensorProto.FLOAT, (0, 3, 8, 8), "float [0, 3, 8, 8]"),
    (TensorProto.FLOAT, (4, 3, 8, 8), "float [4, 3, 8, 8]"),
    (TensorProto.FLOAT, (1, 1, 8, 8, 1), "float [1, 1, 8, 8, 1]"),
])
def test_an_input_the_pipeline_cannot_feed_is_refused_at_load(tmp_path, elem, shape, named):
    model = tiny_model(tmp_path / "m.onnx", elem, shape)
    with pytest.raises(EdgeError, match="m.onnx: input 'input' is {}".format(named.replace("[", r"\["))):
        OnnxRuntimeBackend(model).load()


def test_edge_run_refuses_it_in_one_line_before_any_frame(tmp_path):
    model = tiny_model(tmp_path / "m.onnx", TensorProto.UINT8)
    line = assert_refused(run_edge("run", "--model", model, "--frames", "5"), "m.onnx", "uint8")
    assert "float32 [1, 3, H, W]" in line


def test_external_weights_are_refused_whatever_the_working_folder(tmp_path):
    """Weights in a side file would be read relative to the working folder: another folder, other weights."""
    model = tiny_model(tmp_path / "m.onnx", external=True)
    assert (tmp_path / "weights.bin").exists()
    with pytest.raises(EdgeError, match="m.onnx: weights in external data files are not supported"):
        OnnxRuntimeBackend(model).load()
    assert_refused(run_edge("run", "--model", model, "--frames", "5"), "m.onnx", "external data")


def test_the_reported_sha256_is_of_the_bytes_loaded(tmp_path):
    model = tiny_model(tmp_path / "m.onnx")
    loaded = hashlib.sha256((tmp_path / "m.onnx").read_bytes()).hexdigest()
    with OnnxRuntimeBackend(model) as backend:
        tiny_model(tmp_path / "m.onnx", shape=(1, 3, 16, 16))  # replaced after the load
        assert backend.sha256 == loaded
        assert backend.sha256 != hashlib.sha256((tmp_path / "m.onnx").read_bytes()).hexdigest()
        assert backend.infer(np.ones((1, 3, 8, 8), np.float32)).shape == (1, 3)


def test_onnxruntime_backend_runs_the_exported_model(small_model):
    with OnnxRuntimeBackend(small_model) as backend:
        assert backend.input_shape == (1, 3, 224, 224)
        logits = backend.infer(np.zeros((1, 3, 224, 224), np.float32))
        assert logits.shape == (1, 1000) and np.isfinite(logits).all()
        assert backend.describe()["precision"] == "fp32"
