import json
import os

import numpy as np
import pytest

from edge.build.export import export_mobilenet
from edge.errors import EdgeError
from edge.modelinfo import read_model_info

from conftest import run_edge


def test_export_writes_model_labels_and_info(small_model):
    import onnx

    model = onnx.load(small_model)
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["logits"]
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 224, 224]
    assert model.opset_import[0].version == 17
    info = read_model_info(small_model)
    assert info["trained"] is False and info["weights"] == "random(seed=0)"
    assert info["max_relative_error_vs_torch"] < 1e-4
    labels = open(os.path.splitext(small_model)[0] + ".labels.txt").read().splitlines()
    assert len(labels) == 1000 and labels[0] == "tench"


def test_local_checkpoint_is_trained_and_reproduces_torch(tmp_path):
    import torch
    import torchvision

    torch.manual_seed(3)
    net = torchvision.models.mobilenet_v3_small(num_classes=7).eval()
    torch.save(net.state_dict(), str(tmp_path / "ckpt.pth"))
    out = str(tmp_path / "m.onnx")
    info = export_mobilenet("mobilenet_v3_small", str(tmp_path / "ckpt.pth"), out, log=lambda *a: None)
    assert info["trained"] is True and info["output"]["shape"] == [1, 7]
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_bad_checkpoints_are_one_line_errors(tmp_path):
    with pytest.raises(EdgeError, match="checkpoint not found"):
        export_mobilenet("mobilenet_v3_small", str(tmp_path / "nope.pth"), str(tmp_path / "m.onnx"))
    (tmp_path / "junk.pth").write_bytes(b"junk")
    with pytest.raises(EdgeError, match="not a readable torch checkpoint"):
        export_mobilenet("mobilenet_v3_small", str(tmp_path / "junk.pth"), str(tmp_path / "m.onnx"))
    assert not os.path.exists(tmp_path / "m.onnx")


def test_cli_export_without_network_falls_back_to_untrained(tmp_path):
    out = tmp_path / "m.onnx"
    # an unroutable proxy makes the weight download fail fast, as on a machine without network
    proc = run_edge("export", "--arch", "mobilenet_v3_small", "--out", out, timeout=300,
                    env={"HTTPS_PROXY": "http://127.0.0.1:9", "TORCH_HOME": str(tmp_path / "torch")})
    assert proc.returncode == 0, proc.stderr
    assert "UNTRAINED" in proc.stdout
    assert json.load(open(tmp_path / "m.json"))["trained"] is False


def test_model_info_records_the_preprocessing_it_was_trained_with(small_model):
    from edge.config import IMAGENET_MEAN, IMAGENET_STD

    assert read_model_info(small_model)["preprocess"] == {"resize": 256, "crop": 224, "mean": list(IMAGENET_MEAN),
                                                          "std": list(IMAGENET_STD)}


def test_unknown_arch_is_one_line():
    with pytest.raises(EdgeError, match="--arch: expected one of mobilenet_v3_large|"):
        export_mobilenet("resnet50", "random", "/nonexistent/m.onnx")
