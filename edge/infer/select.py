"""Which preprocessor and backend to run: `auto` resolves to the GPU path only when it can work.

Probes without importing tensorrt or pycuda at module level, so it is importable (and testable)
on machines that have neither.
"""

import importlib
import importlib.util
import os
import re
from typing import Optional, Tuple

from edge.board import tensorrt_probe
from edge.config import Config
from edge.errors import EdgeError, first_line
from edge.store.artifact import check_engine


def _importable(module: str) -> Optional[str]:
    """None if `module` imports as real code, else why not."""
    try:
        if importlib.util.find_spec(module) is None:
            return "{} not importable: not installed".format(module)
        imported = importlib.import_module(module)
    except Exception as exc:  # a broken install raises anything from ImportError to OSError
        return "{} not importable: {}".format(module, first_line(exc))
    if getattr(imported, "__file__", None) is None:  # e.g. tensorrt-stubs' .pyi files alone
        return "{} not importable: only a namespace package (type stubs?) is installed".format(module)
    return None


def cuda_unavailable() -> Optional[str]:
    """None if pycuda sees at least one CUDA device, else why not."""
    problem = _importable("pycuda") or _importable("pycuda.driver")
    if problem is not None:
        return problem
    drv = importlib.import_module("pycuda.driver")
    try:
        drv.init()
        count = drv.Device.count()
    except Exception as exc:  # pycuda._driver.Error when there is no driver or device
        return "no CUDA device ({})".format(str(exc).strip() or type(exc).__name__)
    return None if count > 0 else "no CUDA device"


def gpu_unavailable() -> Optional[str]:
    """None if TensorRT, pycuda and a CUDA device are all present, else the first thing missing."""
    return tensorrt_probe().problem or cuda_unavailable()


def select_devices(cfg: Config) -> Tuple[str, str, str]:
    """(preprocess device, backend kind, reason). Explicit GPU choices that cannot work raise EdgeError."""
    pre, kind = cfg.preprocess.device, cfg.backend.kind
    is_engine = cfg.model.path.endswith(".engine")
    if kind == "tensorrt" and not is_engine:
        raise EdgeError("backend.kind tensorrt needs a TensorRT .engine model, got '{}'".format(cfg.model.path))
    problem = None if kind == "onnxruntime" or (kind == "auto" and not is_engine) else gpu_unavailable()
    if kind == "tensorrt" and problem is not None:
        raise EdgeError("backend.kind tensorrt is not available: " + problem)
    if kind == "auto":
        if not is_engine:
            kind, reason = "onnxruntime", "model is not a .engine file"
        elif problem is not None:
            raise EdgeError("model.path {} is a TensorRT engine, but the GPU path is unavailable: {} "
                            "(use the .onnx model on this machine)".format(cfg.model.path, problem))
        else:
            kind, reason = "tensorrt", "TensorRT, pycuda and a CUDA device are present and the model is a .engine"
    else:
        reason = "backend.kind {} configured".format(kind)
    if pre == "auto":
        pre = "cuda" if kind == "tensorrt" else "cpu"
    elif pre == "cuda" and kind != "tensorrt":
        problem = cuda_unavailable()
        if problem is not None:
            raise EdgeError("preprocess.device cuda beside backend onnxruntime ({}) needs pycuda and a CUDA device: "
                            "{}".format(reason, problem))
        reason += "; preprocess.device cuda: its tensor is copied back to the host for ONNX Runtime"
    return pre, kind, reason


ENGINE_UNIT = "jetson-edge-engine.service"  # builds the engine a board lacks (systemd/), before the service starts


def cpu_siblings(engine_path: str) -> Tuple[str, ...]:
    """The ONNX models of an engine's folder it was built from, best first: the INT8 Q/DQ ONNX the gate judged
    (<stem>.int8.onnx), then the FP32 source (<stem>.onnx)."""
    base = re.sub(r"\.engine$", "", engine_path)
    stem = re.sub(r"\.(int8|fp16|fp32)$", "", base)
    return (stem + ".int8.onnx", stem + ".onnx")


def engine_fallback(cfg: Config) -> Optional[Tuple[str, str]]:
    """(ONNX path, why) when `backend.kind: auto` names a TensorRT engine this machine cannot serve — missing, built
    for another board, TensorRT or CUDA (a JetPack upgrade), or no GPU path — and an ONNX of its folder can be
    served on the CPU instead: the service serves that, degraded, rather than not at all, while ENGINE_UNIT builds
    the engine. None when the engine can be served, or when nothing could replace it (the engine's own error then
    stands)."""
    path = cfg.model.path
    if cfg.backend.kind != "auto" or not path.endswith(".engine"):
        return None
    why = None if os.path.exists(path) else "engine {} not built yet".format(os.path.basename(path))
    why = why or gpu_unavailable()
    if why is None:
        try:
            check_engine(path)
        except EdgeError as exc:
            why = first_line(exc).split("; rebuild with:")[0]
    found = next((onnx for onnx in cpu_siblings(path) if os.path.isfile(onnx)), None)
    if why is None or found is None:
        return None
    return found, "serving {} on the CPU: {} ({} builds it)".format(os.path.basename(found), why, ENGINE_UNIT)
