"""`edge model add`: a user's own ONNX classifier made a set every command reads: its labels, the preprocessing it
was trained with and its provenance recorded in its model info (edge/store/model_info.py), written with the set's
one writer (edge.store.artifact.install, three plain files, the model info last).

The pipeline feeds NCHW RGB, (x/255 - mean)/std. A model trained on BGR or NHWC input is adapted once, here: a
Gather (B,G,R order) and a Transpose (to NHWC) go in front of its graph, so every backend, the build and the gate
feed it as any other model; the model info records what was adapted (`trained_input`). Every value is checked
against the model before anything is written: bad ones are one line, exit 2.
"""

import os
import time
from typing import Any, Dict, List, Optional

import numpy as np

from edge.config import IMAGENET_MEAN, IMAGENET_STD, PreprocessConfig
from edge.errors import EdgeError, first_line, require
from edge.fields import check_options, declared_range
from edge.infer.preprocess import model_preprocess
from edge.model.model_add_options import ModelAddOptions, parse_triple
from edge.store.artifact import install, labels_file, remove_quietly, staging_path
from edge.store.model_info import info_path, read_model_info

CROP_RATIO = 224 / 256  # torchvision's and timm's eval transform: Resize(size / 0.875) + CenterCrop(size)


def _dims(value_info: Any) -> List[Any]:
    """A graph input/output's dims: an int, or its name (dynamic)."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in value_info.type.tensor_type.shape.dim]


def _graph_io(model: Any, path: str) -> Any:
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1 or not model.graph.output:
        raise EdgeError("{}: a classifier takes one input image (this model takes {})".format(path, len(inputs)))
    return inputs[0], model.graph.output[0]


def _channels_first(dims: List[Any], layout: str, path: str) -> List[Any]:
    """The input dims as NCHW, or one line saying why they are not an image of `layout`."""
    nchw = list(dims) if layout == "nchw" else [dims[0], dims[3], dims[1], dims[2]] if len(dims) == 4 else []
    if len(nchw) != 4 or nchw[1] != 3:
        raise EdgeError("{}: its input is {} but --layout {} means [N, {}] with 3 colour channels".format(
            path, dims, layout, "3, H, W" if layout == "nchw" else "H, W, 3"))
    return nchw


def adapt_input(model: Any, colour: str, layout: str) -> Any:
    """`model` taking NCHW RGB: a Gather (BGR order) and a Transpose (NCHW -> NHWC) in front of its graph."""
    onnx = require("onnx")
    helper = onnx.helper
    graph = model.graph
    outer, _ = _graph_io(model, "")
    name = outer.name
    inner = name + "_as_trained"
    for node in graph.node:
        node.input[:] = [inner if x == name else x for x in node.input]
    steps, current = [], name
    if colour == "bgr":
        graph.initializer.append(helper.make_tensor(name + "_bgr_order", onnx.TensorProto.INT64, [3], [2, 1, 0]))
        out = inner if layout == "nchw" else name + "_bgr"
        steps.append(helper.make_node("Gather", [current, name + "_bgr_order"], [out], axis=1, name="edge_bgr"))
        current = out
    if layout == "nhwc":
        steps.append(helper.make_node("Transpose", [current], [inner], perm=[0, 2, 3, 1], name="edge_nhwc"))
        dims = list(outer.type.tensor_type.shape.dim)
        reordered = [dims[0], dims[3], dims[1], dims[2]]
        copies = [type(d)() for d in reordered]
        for copy, d in zip(copies, reordered):
            copy.CopyFrom(d)
        del outer.type.tensor_type.shape.dim[:]
        outer.type.tensor_type.shape.dim.extend(copies)
    nodes = steps + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    return model


def _check_adapted(original: str, adapted: str, colour: str, layout: str, size: int) -> None:
    """The adapted model on an NCHW RGB image gives what the original gives on that image as it was trained."""
    ort = require("onnxruntime")
    image = np.random.default_rng(0).standard_normal((1, 3, size, size), dtype=np.float32)
    trained = image[:, ::-1] if colour == "bgr" else image
    trained = np.ascontiguousarray(trained.transpose(0, 2, 3, 1) if layout == "nhwc" else trained)
    runs = []
    for path, fed in ((original, trained), (adapted, image)):
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        runs.append(session.run(None, {session.get_inputs()[0].name: fed})[0])
    if not np.allclose(runs[0], runs[1], rtol=1e-4, atol=1e-5):
        raise EdgeError("{}: the adapted model differs from the original; not recorded".format(original))


def _preprocess(options: ModelAddOptions, size: int, path: str) -> Dict[str, Any]:
    resize = options.resize or int(round(size / CROP_RATIO))
    declared = {"resize": resize, "crop": size,
                "mean": parse_triple(options.mean, "--mean") if options.mean else list(IMAGENET_MEAN),
                "std": parse_triple(options.std, "--std") if options.std else list(IMAGENET_STD)}
    for key in ("mean", "std"):
        low, high = declared_range(PreprocessConfig, key)
        if not all(low <= v <= high for v in declared[key]):
            raise EdgeError("--{} must be three numbers between {} and {} (of pixels scaled to 0-1), got {}".format(
                key, low, high, declared[key]))
    if resize < size:
        raise EdgeError("--resize {} must not be smaller than the input size {}".format(resize, size))
    # the runtime's own check of a model info's preprocessing (ranges, crop <= resize), naming the flags' values
    model_preprocess(PreprocessConfig(), {"preprocess": declared}, path, "edge model add")
    return declared


def _labels(options: ModelAddOptions, path: str, classes: Any) -> str:
    from edge.infer.postprocess import load_labels

    chosen = options.labels or labels_file(path)
    labels = load_labels(chosen)
    if isinstance(classes, int) and classes and len(labels) != classes:
        raise EdgeError("{}: {} labels, but {} gives {} scores; one label per output, in order".format(
            chosen, len(labels), path, classes))
    return chosen


def add_model(path: str, options: ModelAddOptions, log: Any = print) -> Dict[str, Any]:
    """Record `path`'s model info (and adapt its input, see the module doc); returns the model info installed."""
    onnx = require("onnx")
    check_options(options)
    if not path.endswith(".onnx") or not os.path.isfile(path):
        raise EdgeError("{}: not an .onnx file".format(path))
    before = read_model_info(path)
    if "format" in before:
        raise EdgeError("{}: a built artifact ({}); add the FP32 .onnx it was built from".format(path,
                                                                                              info_path(path)))
    if "trained_input" in before and (options.colour, options.layout) != ("rgb", "nchw"):
        raise EdgeError("{}: its input was adapted already ({}); add it again without --colour/--layout".format(
            path, before["trained_input"]))
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf DecodeError
        raise EdgeError("{}: not a valid ONNX model: {}".format(path, first_line(exc))) from None
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        raise EdgeError("{}: its weights are in an external data file ({}.data); export one file: "
                        "torch.onnx.export(..., external_data=False), or dynamo=False (docs/own-model.md)".format(
                            path, os.path.basename(path)))
    inp, out = _graph_io(model, path)
    nchw = _channels_first(_dims(inp), options.layout, path)
    size = options.size or (nchw[2] if isinstance(nchw[2], int) and nchw[2] else 224)
    if any(isinstance(d, int) and d and d != size for d in nchw[2:]):
        raise EdgeError("{}: its input is {} pixels, --size {}".format(path, nchw[2:], size))
    labels = _labels(options, path, (_dims(out) or [0])[-1])
    kept = ("arch", "opset", "batch", "exported_at", "torch", "trained_input")  # an export's, an earlier add's
    info = {key: before[key] for key in kept if key in before}
    info.update(weights=options.weights, trained=True, added_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                input={"name": inp.name, "shape": nchw, "dtype": "float32",
                       "layout": "NCHW RGB, (x/255 - mean)/std"},
                output={"name": out.name, "shape": _dims(out)}, preprocess=_preprocess(options, size, path))
    if options.expected_top1:
        info["expected_top1"] = options.expected_top1
    return _write(path, model, info, labels, options, log)


def _write(path: str, model: Any, info: Dict[str, Any], labels: str, options: ModelAddOptions, log: Any) -> \
        Dict[str, Any]:
    onnx = require("onnx")
    adapted: Optional[str] = None
    try:
        if (options.colour, options.layout) != ("rgb", "nchw"):
            info["trained_input"] = {"colour": options.colour, "layout": options.layout}
            adapted = staging_path(path)  # named before it is written: removed below, or by the next writer's sweep
            onnx.save(adapt_input(model, options.colour, options.layout), adapted)
            _check_adapted(path, adapted, options.colour, options.layout, info["preprocess"]["crop"])
        installed = install(path, artifact=adapted or path, info=info, labels=labels, files=True,
                            log=lambda *a: None)
    finally:
        remove_quietly([adapted])
    pre = info["preprocess"]
    log("model add: {} recorded: weights {!r}, labels {}, input {}x{} (resize {}), mean {} std {}{}".format(
        info_path(path), options.weights, labels, pre["crop"], pre["crop"], pre["resize"], pre["mean"], pre["std"],
        "; input adapted from {} {} to NCHW RGB".format(options.colour.upper(), options.layout.upper())
        if adapted else ""))
    return installed
