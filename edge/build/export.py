"""`edge export`: torchvision MobileNetV3 -> ONNX (opset 17, static 1x3x224x224) + labels + model info.

Weights, in the order `auto` tries them: torchvision's ImageNet weights (needs the network once; torch
caches them), else seeded random weights, loudly marked untrained. `--weights PATH` loads a local
checkpoint (a state_dict, or a dict holding one under 'state_dict' or 'model').
The export is checked against torch on the same input: max |ORT - torch| / max |torch| < 1e-4.
"""

import os
import socket
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from edge.frame.backend import INPUT_NAME, OUTPUT_NAME
from edge.errors import EdgeError, require
from edge.modelinfo import info_path, sha256_file, write_json_atomic

ARCHES = ("mobilenet_v3_large", "mobilenet_v3_small")
OPSET = 17
MAX_RELATIVE_ERROR = 1e-4
_DOWNLOAD_TIMEOUT_S = 20


def _imagenet_weights(arch: str) -> Any:
    models = require("torchvision.models")
    enum = {"mobilenet_v3_large": models.MobileNet_V3_Large_Weights,
            "mobilenet_v3_small": models.MobileNet_V3_Small_Weights}[arch]
    return enum.IMAGENET1K_V1


def build_model(arch: str, weights: str, seed: int = 0, log=print):
    """Returns (model, labels, weights_description, trained)."""
    torch = require("torch")
    models = require("torchvision.models")
    if arch not in ARCHES:
        raise EdgeError("--arch: expected one of {}, got {!r}".format("|".join(ARCHES), arch))
    imagenet = _imagenet_weights(arch)
    categories: List[str] = list(imagenet.meta["categories"])
    factory = getattr(models, arch)
    if weights in ("auto", "imagenet"):
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(_DOWNLOAD_TIMEOUT_S)
        try:
            model = factory(weights=imagenet)
            return model.eval(), categories, "torchvision:" + str(imagenet), True
        except Exception as exc:  # no network, proxy, corrupt cache: all mean "not available here"
            if weights == "imagenet":
                raise EdgeError("--weights imagenet: could not fetch torchvision weights ({})".format(
                    str(exc).splitlines()[0])) from None
            log("export: ImageNet weights unavailable ({}); using seeded random weights (seed {}) - "
                "UNTRAINED".format(type(exc).__name__, seed))
        finally:
            socket.setdefaulttimeout(previous)
    if weights in ("auto", "random"):
        torch.manual_seed(seed)
        return factory(weights=None).eval(), categories, "random(seed={})".format(seed), False
    if not os.path.isfile(weights):
        raise EdgeError("--weights: {}: checkpoint not found (or use auto|imagenet|random)".format(weights))
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise EdgeError("{}: not a readable torch checkpoint: {}".format(weights, str(exc).splitlines()[0])) from None
    if isinstance(state, dict):
        state = state.get("state_dict", state.get("model", state))
    classifier = state.get("classifier.3.weight") if isinstance(state, dict) else None
    if classifier is None:
        raise EdgeError("{}: no 'classifier.3.weight' - not a {} state_dict".format(weights, arch))
    num_classes = int(classifier.shape[0])
    model = factory(weights=None, num_classes=num_classes)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise EdgeError("{}: does not fit {}: {}".format(weights, arch, str(exc).splitlines()[0])) from None
    labels = categories if num_classes == 1000 else ["class_{}".format(i) for i in range(num_classes)]
    return model.eval(), labels, "checkpoint:" + os.path.abspath(weights), True


def export_onnx(model: Any, out_path: str, labels: Sequence[str], weights_desc: str, trained: bool,
                arch: str, input_size: int = 224, log=print) -> Dict[str, Any]:
    """Export `model` to `out_path` atomically, check it against torch, write labels and model info."""
    torch = require("torch")
    ort = require("onnxruntime")
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx.tmp", dir=out_dir)
    os.close(fd)
    try:
        sample = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, input_size, input_size),
                                                                          dtype=np.float32))
        started = time.monotonic()
        with torch.no_grad(), warnings.catch_warnings():
            # The TorchScript exporter is chosen on purpose: it needs no onnxscript and matches torch to ~1e-6.
            warnings.simplefilter("ignore", DeprecationWarning)
            reference = model(sample).numpy()
            torch.onnx.export(model, (sample,), tmp, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              opset_version=OPSET, do_constant_folding=True, dynamo=False)
        session = ort.InferenceSession(tmp, providers=["CPUExecutionProvider"])
        produced = session.run(None, {INPUT_NAME: sample.numpy()})[0]
        scale = float(np.abs(reference).max()) or 1.0
        rel_error = float(np.abs(produced - reference).max()) / scale
        if not rel_error < MAX_RELATIVE_ERROR:
            raise EdgeError("{}: ONNX Runtime differs from torch by {:.2e} (relative), limit {:.0e}".format(
                out_path, rel_error, MAX_RELATIVE_ERROR), exit_code=1)
        labels_file = os.path.splitext(out_path)[0] + ".labels.txt"
        with open(labels_file + ".tmp", "w", encoding="utf-8") as fh:
            fh.write("\n".join(labels) + "\n")
        os.replace(labels_file + ".tmp", labels_file)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    info = {
        "arch": arch, "weights": weights_desc, "trained": trained, "opset": OPSET,
        "input": {"name": INPUT_NAME, "shape": [1, 3, input_size, input_size], "dtype": "float32",
                  "layout": "NCHW RGB, (x/255 - mean)/std"},
        "output": {"name": OUTPUT_NAME, "shape": [1, len(labels)], "dtype": "float32"},
        "precision": "fp32", "sha256": sha256_file(out_path), "labels": os.path.basename(labels_file),
        "max_relative_error_vs_torch": rel_error, "torch": torch.__version__,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(info_path(out_path), info)
    log("export: {} ({:.1f} MB, {}, max relative error vs torch {:.2e}) in {:.1f} s{}".format(
        out_path, os.path.getsize(out_path) / 1e6, weights_desc, rel_error, time.monotonic() - started,
        "" if trained else " - UNTRAINED WEIGHTS"))
    return info


def export_mobilenet(arch: str = "mobilenet_v3_large", weights: str = "auto", out: Optional[str] = None,
                     seed: int = 0, log=print) -> Dict[str, Any]:
    require("torch").set_num_threads(os.cpu_count() or 1)
    model, labels, desc, trained = build_model(arch, weights, seed, log)
    return export_onnx(model, out or os.path.join("engines", arch + ".onnx"), labels, desc, trained, arch, log=log)
