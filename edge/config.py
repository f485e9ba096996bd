"""One YAML file -> typed, validated configuration objects.

Every error names the file and the dotted key and says what was expected; the CLI turns it into
one line and exit code 2. Defaults make an empty file (or no file) a working configuration.
"""

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import yaml

from edge.errors import EdgeError

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
    "build.precision": ("int8", "fp16", "fp32"),
}

_POSITIVE = {
    "source.width", "source.height", "source.fps", "source.timeout_s", "preprocess.resize",
    "preprocess.crop", "runtime.budget_ms", "runtime.top_k", "runtime.report_every",
    "runtime.latency_window", "runtime.max_consecutive_errors", "build.min_images",
    "build.workspace_mb", "service.telemetry.interval_s", "service.reconnect_initial_s",
    "service.reconnect_max_s",
}
_NON_NEGATIVE = {"runtime.frames", "runtime.warmup", "backend.intra_op_threads"}
_FRACTIONS = {"build.gate.min_agreement", "build.gate.min_mean_cosine"}


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, where: str, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, key)
    if getattr(tp, "__origin__", None) in (list, List):
        (item_tp,) = tp.__args__
        if not isinstance(value, list):
            raise EdgeError("{}: '{}' must be a list, got {!r}".format(where, key, value))
        return [_coerce(v, item_tp, where, "{}[{}]".format(key, i)) for i, v in enumerate(value)]
    ok = (
        isinstance(value, bool) if tp is bool
        else isinstance(value, (int, float)) and not isinstance(value, bool) if tp is float
        else isinstance(value, int) and not isinstance(value, bool) if tp is int
        else isinstance(value, tp)
    )
    if not ok:
        raise EdgeError("{}: '{}' must be {}, got {!r}".format(where, key, _type_name(tp), value))
    return float(value) if tp is float else value


def _build(cls: Any, data: Any, where: str, prefix: str = "") -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise EdgeError("{}: '{}' must be a mapping, got {!r}".format(where, prefix or "<top level>", data))
    fields = {f.name: f for f in dataclasses.fields(cls) if not (cls is Config and f.name == "path")}
    values = {}
    for key, value in data.items():
        dotted = prefix + "." + str(key) if prefix else str(key)
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
            raise EdgeError("{}: '{}' must be one of {}, got {!r}".format(where, key, "|".join(choices), get(key)))
    for key in _POSITIVE:
        if not get(key) > 0:
            raise EdgeError("{}: '{}' must be > 0, got {!r}".format(where, key, get(key)))
    for key in _NON_NEGATIVE:
        if get(key) < 0:
            raise EdgeError("{}: '{}' must be >= 0, got {!r}".format(where, key, get(key)))
    for key in _FRACTIONS:
        if not 0.0 <= get(key) <= 1.0:
            raise EdgeError("{}: '{}' must be between 0 and 1, got {!r}".format(where, key, get(key)))
    pre = cfg.preprocess
    if pre.crop > pre.resize:
        raise EdgeError("{}: 'preprocess.crop' ({}) must not exceed 'preprocess.resize' ({})".format(
            where, pre.crop, pre.resize))
    for key in ("mean", "std"):
        values = getattr(pre, key)
        if len(values) != 3:
            raise EdgeError("{}: 'preprocess.{}' must list 3 numbers (R, G, B), got {!r}".format(where, key, values))
    if any(s <= 0 for s in pre.std):
        raise EdgeError("{}: 'preprocess.std' values must be > 0, got {!r}".format(where, pre.std))
    if not 0 < cfg.service.metrics.port < 65536:
        raise EdgeError("{}: 'service.metrics.port' must be 1-65535, got {!r}".format(where, cfg.service.metrics.port))


def load_config(path: Optional[str] = None, overrides: Optional[Dict[str, Any]] = None) -> Config:
    """Load `path` (None: defaults only), apply dotted `overrides` (e.g. {'runtime.budget_ms': 20}), validate."""
    where = path or "<defaults>"
    data: Dict[str, Any] = {}
    if path is not None:
        if not os.path.isfile(path):
            raise EdgeError("{}: config file not found".format(path))
        try:
            with open(path, "r", encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = " (line {})".format(mark.line + 1) if mark is not None else ""
            raise EdgeError("{}: not valid YAML{}: {}".format(path, line, getattr(exc, "problem", exc))) from None
        except OSError as exc:
            raise EdgeError("{}: cannot read config: {}".format(path, exc.strerror)) from None
        if not isinstance(data, dict):
            raise EdgeError("{}: top level must be a mapping of sections, got {!r}".format(path, data))
    return _from_data(data, overrides, where, path)


def with_overrides(cfg: Config, overrides: Dict[str, Any]) -> Config:
    """A new, validated Config: `cfg` with dotted overrides applied. `cfg` itself is never changed."""
    data = dataclasses.asdict(cfg)
    data.pop("path", None)
    return _from_data(data, overrides, cfg.path or "<defaults>", cfg.path)


def _from_data(data: Dict[str, Any], overrides: Optional[Dict[str, Any]], where: str, path: Optional[str]) -> Config:
    for dotted, value in (overrides or {}).items():
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
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

