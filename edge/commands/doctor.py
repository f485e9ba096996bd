"""`edge doctor`: can the configured path run on this machine? One line per piece, each OK or what to do.

    edge doctor --config /etc/jetson-edge/config.yaml

Python and packages, TensorRT, pycuda and the GPU, the preprocessing kernel, OpenCV's GStreamer,
nvarguscamerasrc, the jtop socket, power mode and clocks, the engine's manifest against this board, and
finally the pipeline itself, loaded as `edge run` would load it. Status per line: `ok`, `warn` (works, but
worse), `FAIL` (the configured path cannot run), `--` (not needed by this config). Exit 0 when the
configured path can run, 1 when it cannot, 2 for a bad config.
"""

import argparse
import os
import platform
import shutil
import socket
import subprocess
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

from edge import __version__
from edge.board import check_engine_manifest, clock_state, gpu_identity, is_jetson, package_version
from edge.commands.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.config import Config
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError
from edge.service.telemetry import JTOP_SOCKET

Line = Tuple[str, str, str]  # (status, what, detail)
RECIPE = "see docs/service.md, 'Installing on a Jetson'"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _version(module: str) -> str:
    return package_version(module) or "absent"


def _not_ok(needed: bool) -> str:
    return "FAIL" if needed else "--"


def check_python() -> Line:
    return "ok", "python", "{} ({}), jetson-edge {}, numpy {}, onnxruntime {}".format(
        platform.python_version(), sys.executable, __version__, _version("numpy"), _version("onnxruntime"))


def check_tensorrt(needed: bool) -> Line:
    from edge.frame.select import tensorrt_unavailable

    problem = tensorrt_unavailable()
    if problem is None:
        return "ok", "tensorrt", _version("tensorrt")
    return _not_ok(needed), "tensorrt", "{}: sudo apt install python3-libnvinfer, and a venv made with " \
        "--system-site-packages ({})".format(problem, RECIPE)


def check_gpu(needed: bool) -> Line:
    from edge.frame.select import cuda_unavailable

    problem = cuda_unavailable()
    if problem is not None:
        return _not_ok(needed), "gpu", "{}: pycuda is built with /usr/local/cuda/bin on PATH ({})".format(
            problem, RECIPE)
    gpu = gpu_identity()
    return "ok", "gpu", "{} (compute capability {}, {} SMs, CUDA driver {}), pycuda {}".format(
        gpu["gpu"], gpu["compute_capability"], gpu["sm_count"], gpu["cuda"], _version("pycuda"))


def check_kernel(needed: bool, gpu_ok: bool) -> Line:
    """Load the kernel as the preprocessor would; without a GPU, say where it would come from."""
    from edge.frame import cuda_kernel

    if not gpu_ok:
        stale = cuda_kernel.fatbin_current()
        where = stale or "shipped edge/cuda/{} (sm_87, sm_110, compute_110 PTX) matches the sources".format(
            os.path.basename(cuda_kernel.FATBIN))
        return _not_ok(needed), "kernel", "not loaded (no CUDA device); {}".format(where)
    from edge.frame.cuda_preprocess import CudaSession

    session = CudaSession()
    try:
        with session:
            _, where = cuda_kernel.load_kernel(session.drv, session.arch)
    except EdgeError as exc:
        fallback = "" if needed else " (preprocess.device auto: CPU preprocessing instead)"
        return "FAIL" if needed else "warn", "kernel", "{}: sudo scripts/build_kernel.py --into " \
            "/var/lib/jetson-edge/kernels{}".format(exc, fallback)
    finally:
        session.release()
    return "ok", "kernel", "loads from {}".format(where)


def check_opencv(needed: bool, csi: bool) -> Line:
    try:
        import cv2
    except Exception as exc:  # ImportError, or a broken binary
        return _not_ok(needed), "opencv", "not importable ({}): on a Jetson sudo apt install python3-opencv " \
            "(never PyPI's opencv-python there)".format(_first_line(exc))
    from edge.frame.gstreamer import _has_gstreamer

    if _has_gstreamer(cv2):
        return "ok", "opencv", "{} ({}), GStreamer: YES".format(cv2.__version__, os.path.dirname(cv2.__file__))
    found = "{} ({}), GStreamer: NO".format(cv2.__version__, os.path.dirname(cv2.__file__))
    if not csi and not is_jetson():
        return "ok", "opencv", found + " (csi:// cameras only need it)"
    return "FAIL" if csi else "warn", "opencv", found + ": use JetPack's python3-opencv (PyPI's has no GStreamer: " \
        "pip uninstall opencv-python opencv-python-headless in the venv)"


def check_argus(csi: bool) -> Line:
    tool = shutil.which("gst-inspect-1.0")
    if tool is None:
        return _not_ok(csi), "argus", "gst-inspect-1.0 not found: sudo apt install gstreamer1.0-tools"
    found = subprocess.run([tool, "nvarguscamerasrc"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=20).returncode == 0
    if found:
        return "ok", "argus", "nvarguscamerasrc present"
    return _not_ok(csi), "argus", "nvarguscamerasrc absent: csi:// cameras need JetPack's " \
        "nvidia-l4t-gstreamer (sudo apt install nvidia-l4t-gstreamer)"


def check_jtop(path: str = JTOP_SOCKET) -> Line:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(path)
    except OSError as exc:
        status = "warn" if is_jetson() else "--"
        return status, "jtop", "{} not reachable ({}): telemetry degrades to Linux counters; sudo systemctl start " \
            "jtop, and add the user to group jtop".format(path, exc.strerror or type(exc).__name__)
    finally:
        sock.close()
    return "ok", "jtop", "{} reachable".format(path)


def check_power(root: str = "/") -> Line:
    state, warnings = clock_state(root)
    if not state["jetson"]:
        return "--", "power", "not a Jetson: no nvpmodel or jetson_clocks"
    detail = "nvpmodel {}, jetson_clocks {}".format(state["nvpmodel"], state["jetson_clocks"])
    return ("warn" if warnings else "ok"), "power", "; ".join([detail] + warnings)


def check_model(cfg: Config, needed_engine: bool) -> Line:
    path = cfg.model.path
    if not os.path.isfile(path):
        return "FAIL", "model", "{} not found (model.path): make it with edge export, then edge build{}".format(
            path, " --engine" if needed_engine else "")
    if not path.endswith(".engine"):
        return "ok", "model", "{} (ONNX, no engine to match to this board)".format(path)
    warnings: List[str] = []
    try:
        check_engine_manifest(path, warn=warnings.append)
    except EdgeError as exc:
        return "FAIL", "engine", str(exc)
    return ("warn" if warnings else "ok"), "engine", "; ".join(["{} matches this board".format(path)] + warnings)


def check_pipeline(cfg: Config) -> Line:
    """The stages loaded exactly as `edge run` loads them, then closed."""
    from edge.frame.stages import build_stages

    try:
        stages = build_stages(cfg)
    except EdgeError as exc:
        return "FAIL", "pipeline", str(exc)
    stages.close()
    return "ok", "pipeline", "loads: backend {}, preprocess {} ({})".format(
        stages.description.get("backend"), stages.preprocess_name, stages.reason)


def diagnose(cfg: Config, root: str = "/") -> List[Line]:
    engine = cfg.backend.kind == "tensorrt" or cfg.model.path.endswith(".engine")
    cuda_pre = cfg.preprocess.device == "cuda"
    csi = cfg.source.uri.startswith("csi://")
    lines = [check_python(), check_tensorrt(engine), check_gpu(engine or cuda_pre)]
    lines.append(check_kernel(cuda_pre, lines[-1][0] == "ok"))
    lines += [check_opencv(cfg.source.uri != "synthetic", csi), check_argus(csi), check_jtop(), check_power(root),
              check_model(cfg, engine), check_pipeline(cfg)]
    return lines


def cmd_doctor(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    cfg = config_from_args(args)
    out("edge doctor: {} (model {}, backend {}, preprocess {}, source {})".format(
        cfg.path or "<defaults>", cfg.model.path, cfg.backend.kind, cfg.preprocess.device, cfg.source.uri))
    lines = diagnose(cfg)
    for status, what, detail in lines:
        out("{:<5} {:<9} {}".format(status, what, detail))
    failed = [what for status, what, _ in lines if status == "FAIL"]
    out("edge doctor: " + ("the configured path cannot run (FAIL: {})".format(", ".join(failed)) if failed
                           else "the configured path can run"))
    return EXIT_FAIL if failed else EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)


def register(subparsers: Any) -> None:
    add_command(subparsers, "doctor", "check that the configured path can run here, and say what to fix", __doc__,
                add_arguments, cmd_doctor)


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge doctor") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_doctor, argv)


if __name__ == "__main__":
    sys.exit(main())
