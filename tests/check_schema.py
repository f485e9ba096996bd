"""JSON-Schema (draft-07 subset: type, properties, required, items, additionalProperties, enum) of the
`edge check` report, and a validator for it: the contract docs/latency-check.md describes, kept with the tests."""

from typing import Any, Callable, Dict, List

from edge.bench.check_report import TELEMETRY_METRICS
from edge.bench.report import SCHEMA_VERSION
from edge.infer.latency import STAGES

_NUM = {"type": "number"}


_INT = {"type": "integer"}


_STR = {"type": "string"}


_STATS = {"type": "object", "required": ["p50", "p90", "p99", "max", "mean"],
          "properties": {k: _NUM for k in ("p50", "p90", "p99", "max", "mean")}}


_MINMEAN = {"type": ["object", "null"], "required": ["min", "mean", "max"],
            "properties": {"min": _NUM, "mean": _NUM, "max": _NUM}}


_DELTA = {"type": "object", "required": ["previous", "current", "delta_ms", "delta_pct", "regressed"],
          "properties": {"previous": _NUM, "current": _NUM, "delta_ms": _NUM, "delta_pct": {"type": ["number", "null"]},
                         "regressed": {"type": "boolean"}}}


SCHEMA: Dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "edge check report",
    "type": "object",
    "required": ["schema_version", "tool", "created", "verdict", "verdict_reason", "budget_ms", "frames",
                 "frames_requested", "warmup", "ended_by", "duration_s", "fps", "source", "backend", "precision",
                 "model", "stages_ms", "misses", "miss_rate", "errors", "skipped_frames", "warnings", "telemetry",
                 "system", "comparison", "figure"],
    "properties": {
        "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
        "tool": _STR,  # "edge check <version>"
        "created": _STR,  # UTC, ISO 8601
        "verdict": {"type": "string", "enum": ["pass", "fail"]},
        "verdict_reason": _STR,
        "budget_ms": _NUM,
        "frames": _INT,  # timed frames (after warm-up)
        "frames_requested": _INT,
        "warmup": _INT,
        "ended_by": {"type": "string", "enum": ["frames", "end of source"]},
        "duration_s": _NUM,  # wall time of the timed frames
        "fps": _NUM,  # timed frames / duration_s
        "source": _STR,
        "backend": _STR,  # onnxruntime | tensorrt
        "precision": _STR,  # fp32 | int8-qdq | fp16 | int8 ...
        "preprocess": _STR,
        "chosen_because": _STR,
        "model": {"type": "object", "required": ["path", "sha256", "weights", "trained"],
                  "properties": {"path": _STR, "sha256": {"type": ["string", "null"]},
                                 "weights": {"type": ["string", "null"]}, "trained": {"type": "boolean"},
                                 "warning": {"type": ["string", "null"]}}},
        "stages_ms": {"type": "object", "required": list(STAGES), "additionalProperties": _STATS},
        "misses": _INT,
        "miss_rate": _NUM,
        "errors": _INT,  # frames that raised (not timed)
        "skipped_frames": _INT,  # frames the source produced that the pipeline never saw
        "warnings": {"type": "array", "items": _STR},
        "telemetry": {
            "type": "object", "required": ["status", "reason", "samples"] + [m for m, _ in TELEMETRY_METRICS],
            "properties": dict({"status": {"type": "string", "enum": ["ok", "unavailable"]},
                                "reason": {"type": ["string", "null"]}, "samples": _INT, "source": _STR},
                               **{m: _MINMEAN for m, _ in TELEMETRY_METRICS}),
        },
        "system": {
            "type": "object",
            "required": ["hostname", "platform", "machine", "python", "cpu_count", "onnxruntime", "tensorrt",
                         "opencv", "l4t", "jetson", "nvpmodel", "nvpmodel_max", "jetson_clocks"],
            "properties": {
                "hostname": _STR, "platform": _STR, "machine": _STR, "python": _STR, "cpu_count": _INT,
                "onnxruntime": {"type": ["string", "null"]}, "tensorrt": {"type": ["string", "null"]},
                "opencv": {"type": ["string", "null"]}, "l4t": {"type": ["string", "null"]},
                "board": {"type": ["string", "null"]}, "jetson": {"type": "boolean"},
                "nvpmodel": {"type": ["string", "null"]}, "nvpmodel_max": {"type": ["boolean", "null"]},
                "jetson_clocks": {"type": "string", "enum": ["on", "off", "unknown"]},
            },
        },
        "comparison": {
            "type": ["object", "null"], "required": ["previous", "thresholds", "stages", "regressions"],
            "properties": {
                "previous": _STR,
                "thresholds": {"type": "object", "required": ["pct", "ms"], "properties": {"pct": _NUM, "ms": _NUM}},
                "stages": {"type": "object", "additionalProperties": {
                    "type": "object", "required": ["p50", "p99"], "properties": {"p50": _DELTA, "p99": _DELTA}}},
                "regressions": {"type": "array", "items": _STR},
            },
        },
        "figure": {"type": ["object", "null"], "required": ["path", "width_px", "height_px"],
                   "properties": {"path": _STR, "width_px": _INT, "height_px": _INT}},
    },
}


_TYPES: Dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def schema_errors(value: Any, schema: Dict[str, Any] = SCHEMA, where: str = "report") -> List[str]:
    """Everything in `value` that does not match `schema` (the subset of JSON Schema SCHEMA uses)."""
    errors: List[str] = []
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_TYPES[t](value) for t in types):
            return ["{}: expected {}, got {!r}".format(where, "|".join(types), value)]
    if "enum" in schema and value not in schema["enum"]:
        errors.append("{}: {!r} not one of {}".format(where, value, schema["enum"]))
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append("{}: missing '{}'".format(where, key))
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors.extend(schema_errors(item, sub, "{}.{}".format(where, key)))
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], "{}[{}]".format(where, i)))
    return errors
