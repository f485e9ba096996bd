"""One YAML file -> typed, validated configuration objects.

Each key is declared once below (type, default, range, choices, help, reload policy, flag: edge/fields.py);
validation, the command-line flags, configs/example.yaml and what a SIGHUP applies are derived from it.
Every error names the file and the dotted key and says what was expected; the CLI turns it into
one line and exit code 2. Defaults make an empty file (or no file) a working configuration.
"""

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import yaml

from edge.errors import EdgeError
from edge.fields import APPLY, OFFLINE, build, example, section, setting, show, validate
from edge.inputs import read_text
from edge.uri import parse_source, redact

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class ModelConfig:
    path: str = setting("engines/mobilenet_v3_large.onnx", ".onnx runs in ONNX Runtime, .engine in TensorRT; "
                        "a build's FP32 source is this path without .int8/.fp16, as .onnx", flag="--model")
    labels: str = setting("", "default: <model stem>.labels.txt beside the model")


@dataclass
class SourceConfig:
    uri: str = setting("synthetic", "synthetic | FILE | FOLDER | /dev/videoN | v4l2://N | csi://N | rtsp://...",
                       check=parse_source, flag="--source")
    width: int = setting(1280, "synthetic frames, and the size asked of cameras", low=1, high=16384)
    height: int = setting(720, "synthetic frames, and the size asked of cameras", low=1, high=16384)
    fps: float = setting(30.0, "pacing of synthetic/file/folder frames, and the camera frame rate", low=0.01,
                         high=1000.0)
    loop: bool = setting(True, "restart files and folders at the end")
    timeout_s: float = setting(2.0, "no new frame for this long is a source fault", low=0.01, high=3600.0)
    start_timeout_s: float = setting(10.0, "no first frame this long after start (or timeout_s if longer): the "
                                     "source is dead, exit 2 (a camera slow to stream wants more); also how long "
                                     "an open may take before it counts as hung", low=0.1, high=3600.0)
    rtsp_codec: str = setting("auto", "rtsp:// decoder (auto: any codec the stream has)",
                              choices=("auto", "h264", "h265", "mjpeg"))
    rtsp_tcp: bool = setting(False, "rtsp:// over TCP instead of UDP (sites that block UDP)")


CAMERA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MAX_CAMERAS = 16  # one engine's cameras; also bounds the `camera` label of every metric


def check_camera_name(value: str, name: str) -> None:
    if not CAMERA_NAME.match(value):
        raise EdgeError("{} must be 1-32 letters, digits, _ or -, got {}".format(name, show(value)))


@dataclass
class CameraConfig(SourceConfig):
    """One camera of `sources`: a name, and any `source` key (those left out are the `source` section's)."""

    name: str = setting("", "the camera in logs, reports and metrics", check=check_camera_name)
    key: str = dataclasses.field(default="source", compare=False)  # its place in the file, for errors: sources[1]


@dataclass
class PreprocessConfig:
    device: str = setting("auto", "auto: cuda when the backend is TensorRT", choices=("auto", "cpu", "cuda"),
                          flag="--preprocess")
    resize: int = setting(256, "torchvision Resize(256) ...", low=1, high=4096)
    crop: int = setting(224, "... + CenterCrop(224): what MobileNetV3 was trained with", low=1, high=4096)
    # pixels are scaled to 0-1 first; std divides
    mean: List[float] = setting(list(IMAGENET_MEAN), "R, G, B, of pixels scaled to 0-1", low=0.0, high=1.0,
                                length=3)
    std: List[float] = setting(list(IMAGENET_STD), "R, G, B (divides)", low=0.001, high=1.0, length=3)
    cpu: str = setting("fast", "CPU preprocessing: fast (OpenCV, within ~0.014 mean abs. of the exact filter, "
                               "several times quicker: benchmarks/preprocess_speed.py) | exact (the filter the CUDA "
                               "kernel, calibration and the gate compute)", choices=("fast", "exact"))


@dataclass
class BackendConfig:
    kind: str = setting("auto", "auto: tensorrt for .engine with a GPU present",
                        choices=("auto", "onnxruntime", "tensorrt"), flag="--backend")
    intra_op_threads: int = setting(0, "ONNX Runtime threads, 0 = its default (fastest on 2 cores: "
                                       "benchmarks/ort_threads.py)", low=0, high=256)
    intra_op_spinning: bool = setting(True, "false: ORT's idle threads stop spinning - steadier p99/p50, ~1.5x "
                                            "slower p50 on 2 cores")
    cuda_graph: bool = setting(False, "TensorRT: capture inference in a CUDA graph (kept only if measurably "
                                      "faster)")


@dataclass
class BatchingConfig:
    policy: str = setting("deadline", "several cameras (sources) on one engine: deadline batches frames under each "
                                      "one's deadline (docs/throughput.md), off serves one frame at a time; one "
                                      "camera is always batch 1", choices=("deadline", "off"))
    max_batch: int = setting(4, "most frames in one batch (at most one per camera); needs a model with a batch "
                                "axis (edge export --batch dynamic), else 1", low=1, high=MAX_CAMERAS)
    max_wait_ms: float = setting(10.0, "longest wait for one more camera's frame, never past what the waiting "
                                       "frames' deadlines allow", low=0.0, high=10000.0)
    margin_ms: float = setting(1.0, "kept free between a batch's expected end (its p99) and the earliest deadline",
                               low=0.0, high=10000.0)


@dataclass
class RuntimeConfig:
    budget_ms: float = setting(30.0, "a frame whose capture -> result time exceeds this is a miss", low=0.001,
                               high=3600000.0, flag="--budget-ms")
    frames: int = setting(0, "stop after N timed frames; 0 = until stopped or the source ends", low=0,
                          high=10 ** 10, flag="--frames")
    warmup: int = setting(10, "frames run (not timed) before timing starts", low=0, high=100000)
    top_k: int = setting(5, "classes reported per frame", low=1, high=1000, reload=APPLY, flag="--top-k")
    report_every: int = setting(300, "frames between JSON summary lines", low=1, high=10 ** 9)
    latency_window: int = setting(4096, "frames kept for percentiles (memory stays bounded)", low=1, high=1000000)
    max_consecutive_errors: int = setting(50, "more failed frames in a row than this: exit non-zero (systemd "
                                              "restarts)", low=1, high=1000000, reload=APPLY)
    batching: BatchingConfig = section(BatchingConfig)


@dataclass
class GateConfig:
    min_agreement: float = setting(0.98, "top-1 agreement of INT8 with FP32 on the unlabelled regression images",
                                   low=0.0, high=1.0)
    min_mean_cosine: float = setting(0.975, "mean cosine similarity of the logits", low=0.0, high=1.0)
    min_p5_cosine: float = setting(0.95, "5th percentile of the logits' cosine similarity (the tail)", low=-1.0,
                                   high=1.0)
    max_confident_flip_pct: float = setting(10.0, "changed top-1 answers among the images FP32 is confident about "
                                                  "(top-1 probability >= 0.5), percent, judged with its 95 % "
                                                  "interval", low=0.0, high=100.0)
    max_top1_drop_pp: float = setting(3.0, "top-1 accuracy drop on the labelled images, percentage points: passes "
                                           "when its 95 % upper bound is within it", low=0.0, high=100.0)


@dataclass
class BuildConfig:
    calibration_dir: str = setting("calibration/default", "images INT8 calibration reads", flag="--calibration")
    regression_dir: str = setting("calibration/imagenet", "images the accuracy gate compares on (labelled: "
                                                          "<label>/<image>)",
                                  flag="--regression")
    method: str = setting("auto", "calibration method; auto: each, keeping the closest to FP32 on calibration "
                                  "images", choices=("auto", "minmax", "entropy", "percentile"), flag="--method")
    quantizer: str = setting("onnxruntime", "modelopt: NVIDIA ModelOpt, extra [modelopt]; opset 19: TensorRT >= 10 "
                                            "only (docs/build.md)", choices=("onnxruntime", "modelopt"))
    exclude_sensitive: bool = setting(True, "keep MobileNetV3's squeeze-excite/hard-sigmoid, first conv, "
                                            "classifier in float")
    min_images: int = setting(32, "fewer calibration images is an error", low=1, high=1000000, flag="--min-images")
    precision: str = setting("int8", "fp16/fp32: TensorRT engines only", choices=("int8", "fp16", "fp32"),
                             flag="--precision")
    engines_dir: str = setting("engines", "where built artifacts are installed")
    workspace_mb: int = setting(1024, "TensorRT builder workspace", low=1, high=1 << 20)
    max_float_layers: int = setting(8, "when the gate fails, leave up to this many of the layers INT8 hurts most "
                                       "in float (FP16 on the engine) and judge again; 0 = off", low=0, high=1000)
    target_tensorrt: str = setting("", "TensorRT version the Q/DQ model is for (e.g. 8.5 for JetPack 5), which "
                                       "limits its opset; empty = this machine's TensorRT, if any")
    gate: GateConfig = section(GateConfig)


@dataclass
class MetricsConfig:
    enabled: bool = setting(False, "Prometheus /metrics and /healthz")
    host: str = setting("127.0.0.1", "never all interfaces unless you say so")
    port: int = setting(9108, "metrics port", low=1, high=65535)


@dataclass
class TelemetryConfig:
    enabled: bool = setting(True, "board telemetry (jtop) in reports and metrics")
    interval_s: float = setting(1.0, "telemetry sampling interval", low=0.01, high=3600.0)


@dataclass
class ResultsConfig:
    path: str = setting("", "every frame's result as a JSON line: a file (appended) or a FIFO (mkfifo; lines are "
                            "dropped while no program reads it); empty: off (docs/service.md)")


@dataclass
class ServiceConfig:
    metrics: MetricsConfig = section(MetricsConfig)
    telemetry: TelemetryConfig = section(TelemetryConfig)
    results: ResultsConfig = section(ResultsConfig)
    reconnect_initial_s: float = setting(0.5, "first reconnect delay of a live source (doubles)", low=0.001,
                                         high=3600.0)
    reconnect_max_s: float = setting(30.0, "longest reconnect delay", low=0.001, high=86400.0)


@dataclass
class Config:
    model: ModelConfig = section(ModelConfig, reload=APPLY)
    source: SourceConfig = section(SourceConfig)
    sources: List[CameraConfig] = setting([], "several cameras on one engine: [{name: front, uri: ...}, ...]; a "
                                              "camera's keys left out are source's; empty: the one camera source")
    preprocess: PreprocessConfig = section(PreprocessConfig, reload=APPLY)
    backend: BackendConfig = section(BackendConfig, reload=APPLY)
    runtime: RuntimeConfig = section(RuntimeConfig)
    build: BuildConfig = section(BuildConfig, reload=OFFLINE)
    service: ServiceConfig = section(ServiceConfig)
    path: Optional[str] = None  # where it was loaded from (not a YAML key)


EXAMPLE_HEADER = """# jetson-edge configuration. Every key is optional; the values shown are the defaults.
# Unknown keys, wrong types and impossible values are refused with one line naming the key (exit 2).
# Generated from the declarations in edge/config.py (tests/test_config.py says how to regenerate it)."""
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_NODES = 10000  # a config has ~60; an alias bomb expands to billions


def check_preprocess(pre: PreprocessConfig, where: str) -> None:
    """A preprocessing section's declared checks, and crop <= resize: the config's, or a model info's (made with
    edge.fields.build(PreprocessConfig, ...))."""
    validate(pre, where, "preprocess.")
    if pre.crop > pre.resize:
        raise EdgeError("{}: 'preprocess.crop' ({}) must not exceed 'preprocess.resize' ({})".format(
            where, pre.crop, pre.resize))


def check_sources(cameras: List[CameraConfig], where: str) -> None:
    """Each camera's declared checks; no name twice, and no device, stream or file twice (synthetic may repeat)."""
    if len(cameras) > MAX_CAMERAS:
        raise EdgeError("{}: 'sources' lists {} cameras, at most {}".format(where, len(cameras), MAX_CAMERAS))
    names: Dict[str, int] = {}
    opened: Dict[Any, int] = {}
    for i, camera in enumerate(cameras):
        validate(camera, where, "sources[{}].".format(i))
        if camera.name in names:
            raise EdgeError("{}: 'sources[{}].name' {} names another camera too".format(where, i, show(camera.name)))
        names[camera.name] = i
        same = _opens(camera.uri)
        if same in opened:
            raise EdgeError("{}: 'sources[{}].uri' {} is also 'sources[{}].uri': one camera, opened once".format(
                where, i, show(redact(camera.uri)), opened[same]))
        if same is not None:
            opened[same] = i


def _opens(uri: str) -> Any:
    """What opening `uri` takes hold of (/dev/video0 and v4l2://0 are one device), or None for synthetic frames."""
    resource = parse_source(uri)
    if resource.protocol == "synthetic":
        return None
    if resource.protocol == "file":
        return "file", os.path.normpath(resource.location)
    return resource.protocol, resource.location, resource.port, resource.device, \
        resource.text if resource.protocol == "rtsp" else ""


def cameras(cfg: Config) -> List[CameraConfig]:
    """The cameras a run serves: `sources`, or the one `source` (named after its URI's kind)."""
    if cfg.sources:
        return list(cfg.sources)
    return [CameraConfig(**dict(dataclasses.asdict(cfg.source), name="camera"))]


def load_config(path: Optional[str] = None, overrides: Optional[Dict[str, Any]] = None) -> Config:
    """Load `path` (None: defaults only), apply dotted `overrides` (e.g. {'runtime.budget_ms': 20}), validate."""
    where = path or "<defaults>"
    data: Dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(path)
    return _from_data(data, overrides, where, path)


def _read_yaml(path: str) -> Dict[str, Any]:
    """The file's top-level mapping. Not UTF-8, over MAX_CONFIG_BYTES, nested too deeply or expanding (through
    aliases) to more than MAX_YAML_NODES values: one EdgeError, found before any value is built."""
    text = read_text(path, "config file", MAX_CONFIG_BYTES)
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_nodes(node, path)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except RecursionError:
        raise EdgeError("{}: nested too deeply".format(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = " (line {})".format(mark.line + 1) if mark is not None else ""
        raise EdgeError("{}: not valid YAML{}: {}".format(path, line, getattr(exc, "problem", exc))) from None
    data = data or {}
    if not isinstance(data, dict):
        raise EdgeError("{}: top level must be a mapping of sections, got {}".format(path, show(data)))
    return data


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 numbers: `1:30` stays a string (no base 60), `010` is no octal, `1e-9` is a float."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _check_nodes(root: yaml.Node, path: str) -> None:
    """Before any value is built: no mapping repeats a key (no silent last-wins), and the document, with every
    alias expanded, has at most MAX_YAML_NODES nodes (an alias bomb expands to billions)."""
    count, stack = 0, [root]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_YAML_NODES:
            raise EdgeError("{}: more than {} values once aliases are expanded (a YAML alias bomb?)".format(
                path, MAX_YAML_NODES))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            seen = set()
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                if name is not None and name in seen:
                    raise EdgeError("{}: duplicate key '{}' (line {})".format(path, show(name)[1:-1],
                                                                            key.start_mark.line + 1))
                seen.add(name)
                stack.extend((key, value))


def with_overrides(cfg: Config, overrides: Dict[str, Any]) -> Config:
    """A new, validated Config: `cfg` with dotted overrides applied. `cfg` itself is never changed."""
    return _from_data(as_dict(cfg), overrides, cfg.path or "<defaults>", cfg.path)


def _from_data(data: Dict[str, Any], overrides: Optional[Dict[str, Any]], where: str, path: Optional[str]) -> Config:
    for dotted, value in (overrides or {}).items():
        node = data
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:  # `runtime:` with nothing under it
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise EdgeError("{}: '{}' must be a mapping, got {}".format(where, ".".join(parts[:i + 1]),
                                                                              show(node)))
        node[parts[-1]] = value
    data["sources"] = _with_source(data, where)
    cfg = build(Config, data, where)
    for i, camera in enumerate(cfg.sources):
        camera.key = "sources[{}]".format(i)
    validate(cfg, where)
    check_sources(cfg.sources, where)
    check_preprocess(cfg.preprocess, where)
    cfg.path = path
    return cfg


def _with_source(data: Dict[str, Any], where: str) -> Any:
    """`sources` with each camera's left-out keys taken from `source`; a key that is no name (`1:`, `null:`) is
    refused naming its camera."""
    cameras, source = data.get("sources", []), data.get("source") or {}
    if not isinstance(cameras, list) or not isinstance(source, dict):
        return cameras  # build() names the wrong type
    for i, camera in enumerate(cameras):
        bad = [key for key in camera if not isinstance(key, str)] if isinstance(camera, dict) else []
        if bad:
            raise EdgeError("{}: 'sources[{}]' has a key that is not a name: {} (expected: {})".format(
                where, i, "null" if bad[0] is None else show(bad[0]),
                ", ".join(f.name for f in dataclasses.fields(CameraConfig))))
    return [dict(source, **c) if isinstance(c, dict) else c for c in cameras]


def example_yaml() -> str:
    """configs/example.yaml as the declarations give it."""
    return example(Config, EXAMPLE_HEADER)


def as_dict(cfg: Config) -> Dict[str, Any]:
    """The YAML keys of `cfg` (not where it was loaded from, nor each camera's place in the file)."""
    out = dataclasses.asdict(cfg)
    out.pop("path", None)
    for camera in out["sources"]:
        camera.pop("key", None)
    return out

