"""One YAML file -> typed, validated configuration objects.

Every error names the file and the dotted key and says what was expected; the CLI turns it into
one line and exit code 2. Defaults make an empty file (or no file) a working configuration.
"""

import dataclasses
import math
import os
import reprlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import yaml

from edge.errors import EdgeError
from edge.fileio import read_text

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class ModelConfig:
    path: str = "engines/mobilenet_v3_large.onnx"  # .onnx (ONNX Runtime) or .engine (TensorRT)
    labels: str = ""  # empty: <model stem>.labels.txt beside the model


@dataclass
class SourceConfig:
    uri: str = "synthetic"  # synthetic | file | image folder | /dev/videoN | v4l2://N | csi://N | rtsp://...
    width: int = 1280
    height: int = 720
    fps: float = 30.0
    loop: bool = True  # files and image folders restart at the end
    timeout_s: float = 2.0  # no frame for this long counts as a source fault
    rtsp_codec: str = "auto"  # auto (any codec the stream has) | h264 | h265 | mjpeg
    rtsp_tcp: bool = False  # RTP inside the RTSP connection (sites that block UDP)


@dataclass
class PreprocessConfig:
    device: str = "auto"  # auto | cpu | cuda
    resize: int = 256
    crop: int = 224
    mean: List[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: List[float] = field(default_factory=lambda: list(IMAGENET_STD))


@dataclass
class BackendConfig:
    kind: str = "auto"  # auto | onnxruntime | tensorrt
    intra_op_threads: int = 0  # 0: ONNX Runtime's default (measured fastest, benchmarks/ort_threads.py)
    intra_op_spinning: bool = True  # false: steadier tail, slower median (measured, benchmarks/ort_threads.py)
    cuda_graph: bool = False


@dataclass
class RuntimeConfig:
    budget_ms: float = 30.0
    frames: int = 0  # 0: run until stopped or the source ends
    warmup: int = 10  # frames run before timing starts
    top_k: int = 5
    report_every: int = 300  # frames between JSON summary lines
    latency_window: int = 4096  # frames kept for percentiles (bounded memory)
    max_consecutive_errors: int = 50  # beyond this the process exits non-zero


@dataclass
class GateConfig:
    min_agreement: float = 0.98
    min_mean_cosine: float = 0.99
    max_top1_drop_pp: float = 1.0


@dataclass
class BuildConfig:
    calibration_dir: str = "calibration/default"
    regression_dir: str = "calibration/regression"
    method: str = "minmax"  # minmax | entropy | percentile
    quantizer: str = "onnxruntime"  # onnxruntime | modelopt (opset 19: TensorRT >= 10 only; docs/build.md)
    exclude_sensitive: bool = True
    min_images: int = 32
    precision: str = "int8"  # int8 | fp16 | fp32
    engines_dir: str = "engines"
    workspace_mb: int = 1024
    gate: GateConfig = field(default_factory=GateConfig)


@dataclass
class MetricsConfig:
    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 9108


@dataclass
class TelemetryConfig:
    enabled: bool = True
    interval_s: float = 1.0


@dataclass
class ServiceConfig:
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 30.0


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    build: BuildConfig = field(default_factory=BuildConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    path: Optional[str] = None  # where it was loaded from (not a YAML key)


_CHOICES = {
    "source.rtsp_codec": ("auto", "h264", "h265", "mjpeg"),
    "preprocess.device": ("auto", "cpu", "cuda"),
    "backend.kind": ("auto", "onnxruntime", "tensorrt"),
    "build.method": ("minmax", "entropy", "percentile"),
    "build.quantizer": ("onnxruntime", "modelopt"),
    "build.precision": ("int8", "fp16", "fp32"),
}

# Every numeric key's sane range (inclusive; "> 0" is written as the smallest useful value): beyond
# these a value allocates gigabytes, busy-loops or switches a check off. NaN and inf are refused everywhere.
_RANGES = {
    "source.width": (1, 16384), "source.height": (1, 16384), "source.fps": (0.01, 1000.0),
    "source.timeout_s": (0.01, 3600.0),
    "preprocess.resize": (1, 4096), "preprocess.crop": (1, 4096),
    "backend.intra_op_threads": (0, 256),
    "runtime.budget_ms": (0.001, 3600000.0), "runtime.frames": (0, 10 ** 10), "runtime.warmup": (0, 100000),
    "runtime.top_k": (1, 1000), "runtime.report_every": (1, 10 ** 9), "runtime.latency_window": (1, 1000000),
    "runtime.max_consecutive_errors": (1, 1000000),
    "build.min_images": (1, 1000000), "build.workspace_mb": (1, 1 << 20),
    "build.gate.min_agreement": (0.0, 1.0), "build.gate.min_mean_cosine": (0.0, 1.0),
    "build.gate.max_top1_drop_pp": (0.0, 100.0),
    "service.metrics.port": (1, 65535), "service.telemetry.interval_s": (0.01, 3600.0),
    "service.reconnect_initial_s": (0.001, 3600.0), "service.reconnect_max_s": (0.001, 86400.0),
}
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_NODES = 10000  # a config has ~60; an alias bomb expands to billions


def _show(value: Any) -> str:
    """A value for an error line: bounded however large or deeply nested (an alias bomb) it is."""
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 50, 50
_REPR.maxlong = 30


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, where: str, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, key)
    if getattr(tp, "__origin__", None) in (list, List):
        (item_tp,) = tp.__args__
        if not isinstance(value, list):
            raise EdgeError("{}: '{}' must be a list, got {}".format(where, key, _show(value)))
        return [_coerce(v, item_tp, where, "{}[{}]".format(key, i)) for i, v in enumerate(value)]
    ok = (
        isinstance(value, bool) if tp is bool
        else isinstance(value, (int, float)) and not isinstance(value, bool) if tp is float
        else isinstance(value, int) and not isinstance(value, bool) if tp is int
        else isinstance(value, tp)
    )
    if not ok:
        raise EdgeError("{}: '{}' must be {}, got {}".format(where, key, _type_name(tp), _show(value)))
    if tp is float:
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise EdgeError("{}: '{}' must be a finite number, got {}".format(where, key, _show(value)))
    return value


def _build(cls: Any, data: Any, where: str, prefix: str = "") -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise EdgeError("{}: '{}' must be a mapping, got {}".format(where, prefix or "<top level>", _show(data)))
    fields = {f.name: f for f in dataclasses.fields(cls) if not (cls is Config and f.name == "path")}
    values = {}
    for key, value in data.items():
        dotted = prefix + "." + str(key)[:60] if prefix else str(key)[:60]
        if key not in fields:
            raise EdgeError("{}: unknown key '{}' (expected one of: {})".format(where, dotted, ", ".join(fields)))
        values[key] = _coerce(value, fields[key].type, where, dotted)
    return cls(**values)


def _check_values(cfg: Config, where: str) -> None:
    def get(dotted: str) -> Any:
        obj: Any = cfg
        for part in dotted.split("."):
            obj = getattr(obj, part)
        return obj

    for key, choices in _CHOICES.items():
        if get(key) not in choices:
            raise EdgeError("{}: '{}' must be one of {}, got {}".format(where, key, "|".join(choices), _show(get(key))))
    for key, (low, high) in _RANGES.items():
        if not low <= get(key) <= high:
            raise EdgeError("{}: '{}' must be between {} and {}, got {}".format(where, key, low, high,
                                                                                 _show(get(key))))
    pre = cfg.preprocess
    if pre.crop > pre.resize:
        raise EdgeError("{}: 'preprocess.crop' ({}) must not exceed 'preprocess.resize' ({})".format(
            where, pre.crop, pre.resize))
    for key in ("mean", "std"):
        values = getattr(pre, key)
        if len(values) != 3:
            raise EdgeError("{}: 'preprocess.{}' must list 3 numbers (R, G, B), got {}".format(
                where, key, _show(values)))
    for key, low in (("mean", 0.0), ("std", 0.001)):  # pixels are scaled to 0-1 first; std divides
        if not all(low <= v <= 1.0 for v in getattr(pre, key)):
            raise EdgeError("{}: 'preprocess.{}' values must be between {} and 1.0, got {}".format(
                where, key, low, _show(getattr(pre, key))))


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
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None and _expanded_size(node) > MAX_YAML_NODES:
                raise EdgeError("{}: more than {} values once aliases are expanded (a YAML alias bomb?)".format(
                    path, MAX_YAML_NODES))
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
        raise EdgeError("{}: top level must be a mapping of sections, got {}".format(path, _show(data)))
    return data


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the document has with every alias expanded; stops counting past MAX_YAML_NODES."""
    count, stack = 0, [root]
    while stack and count <= MAX_YAML_NODES:
        node = stack.pop()
        count += 1
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.extend((key, value))
    return count


def with_overrides(cfg: Config, overrides: Dict[str, Any]) -> Config:
    """A new, validated Config: `cfg` with dotted overrides applied. `cfg` itself is never changed."""
    data = dataclasses.asdict(cfg)
    data.pop("path", None)
    return _from_data(data, overrides, cfg.path or "<defaults>", cfg.path)


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
                                                                              _show(node)))
        node[parts[-1]] = value
    cfg = _build(Config, data, where)
    _check_values(cfg, where)
    cfg.path = path
    return cfg


def labels_path(model_path: str, labels: str = "") -> str:
    return labels or os.path.splitext(model_path)[0] + ".labels.txt"


def as_dict(cfg: Config) -> Dict[str, Any]:
    out = dataclasses.asdict(cfg)
    out.pop("path", None)
    return out

