"""A model exported with a batch axis through the build chain: calibration, the Q/DQ checks and the accuracy gate
feed it batch 1 as before, the INT8 Q/DQ model keeps the axis, and the manifest says so; the service then serves it
batches on ONNX Runtime."""

import os

import numpy as np
import yaml

from edge.cli.main import main
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend
from edge.store.artifact import read_model_info

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_model_with_a_batch_axis_builds_and_keeps_it(dynamic_model, tmp_path, capsys):
    engines = tmp_path / "engines"
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump({"model": {"path": dynamic_model}, "build": {
        "engines_dir": str(engines), "method": "minmax",
        "regression_dir": os.path.join(REPO, "calibration", "regression")}}), encoding="utf-8")
    assert main(["build", "--config", str(config), "--no-progress"]) == 0, capsys.readouterr()
    built = str(engines / "tiny_dynamic.int8.onnx")
    manifest = read_model_info(built)
    assert manifest["batch"] == "dynamic" and manifest["input"]["shape"][0] == "batch"
    assert manifest["gate"]["samples"] == 100  # the gate ran, batch 1 per image
    with OnnxRuntimeBackend(built) as backend:
        assert backend.max_batch > 1
        batch = np.random.default_rng(0).standard_normal((3, 3, 224, 224)).astype(np.float32)
        together = backend.infer(batch)
        alone = np.concatenate([backend.infer(batch[i:i + 1]) for i in range(3)])
        np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-4)
