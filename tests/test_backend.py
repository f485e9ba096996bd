"""edge.infer.backend: a runner's lifecycle, checked once in its base (Polygraphy's runners). What to load is one
type, what was loaded another: the frame path's methods exist only on the loaded one."""

import numpy as np
import pytest
from test_onnxruntime_backend import tiny_model

from edge.errors import EdgeError
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend


def test_a_runner_is_used_only_through_what_its_load_returned(tmp_path):
    """A runner not loaded has nothing to run (Polygraphy's lifecycle, checked once in edge.infer.backend.Runner):
    the frame path's methods and infer exist only on the loaded type (the gate runs `with runner as infer`)."""
    from edge.infer.backend import Backend, LoadedBackend
    from edge.infer.onnxruntime_backend import LoadedOnnxRuntime
    from edge.infer.tensorrt_backend import LoadedTensorRT, TensorRTBackend
    from edge.infer.tensorrt_runner import EngineRunner, LoadedEngine

    frame_path = ("put_row", "infer_rows", "describe", "input_shape", "output_shape", "device_ms")
    for runner in (OnnxRuntimeBackend, TensorRTBackend, Backend, EngineRunner):
        assert not [name for name in frame_path + ("infer", "enqueue", "bind_input") if hasattr(runner, name)], runner
    for loaded_type in (LoadedOnnxRuntime, LoadedTensorRT):
        assert issubclass(loaded_type, LoadedBackend) and all(hasattr(loaded_type, n) for n in frame_path)
    assert all(hasattr(LoadedEngine, n) for n in ("infer", "enqueue", "bind_input", "copy_in", "result"))
    runner = OnnxRuntimeBackend(tiny_model(tmp_path / "m.onnx"))
    loaded = runner.load()
    assert isinstance(loaded, LoadedOnnxRuntime) and runner.load() is loaded  # loaded once
    assert loaded(np.ones((1, 3, 8, 8), np.float32)).shape == (1, 3)  # the gate's callable
    runner.close()
    assert runner.load() is not loaded  # closed: the next load makes a new one
    runner.close()


def test_a_failed_load_leaves_the_runner_unloaded_and_loadable_again(tmp_path):
    broken = tmp_path / "m.onnx"
    broken.write_bytes(b"not a model")
    runner = OnnxRuntimeBackend(str(broken))
    with pytest.raises(EdgeError, match="m.onnx: not a loadable ONNX model"):
        runner.load()
    tiny_model(broken)  # the file is fixed: the same runner loads it now
    with runner as loaded:
        assert loaded.output_shape == (1, 3)
