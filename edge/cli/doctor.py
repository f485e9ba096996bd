"""`edge doctor`: can the configured path run on this machine? One line per piece, each OK or what to do.

    edge doctor --config /etc/jetson-edge/config.yaml
    sudo edge doctor --config /etc/jetson-edge/config.yaml --as-service   # as the unit's user, groups, sandbox

Python, NumPy (JetPack's OpenCV and TensorRT need 1.x), onnxruntime, TensorRT, nvcc, pycuda and the GPU (a
cuInit the user may not make is told apart from a pycuda build), the preprocessing kernel (which one would load,
from where, and why), OpenCV's GStreamer, nvarguscamerasrc and nvargus-daemon's socket, the jtop socket, power
mode and clocks, each camera (`sources`, else `source`: a missing file fails), the engine's manifest against this
board, and finally the pipeline itself, loaded as `edge run` would load it. Each check runs as the current user:
`--as-service` runs them all as the service would. Status per line: `ok`, `warn` (works, but worse), `FAIL` (the
configured path cannot run), `--` (not needed by this config). Exit 0 when the configured path can run, 1 when it
cannot, 2 for a bad config.
"""

import argparse
import os
import platform
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from edge import __version__
from edge.board import clock_state, gpu_identity, is_jetson, package_version, tensorrt_probe
from edge.cli.common import add_command, add_config_flags, config_from_args
from edge.config import Config, cameras
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError, first_line
from edge.fields import add_flags, options_from, setting
from edge.service.telemetry import JTOP_SOCKET
from edge.store.artifact import check_engine
from edge.uri import redact

Line = Tuple[str, str, str]  # (status, what, detail)
RECIPE = "see docs/service.md, 'Installing on a Jetson'"
ARGUS_SOCKET = "/tmp/argus_socket"  # nvargus-daemon's, fixed in libargus
GST_INSPECT_TIMEOUT_S = 120
# What importing a module built against NumPy 1.x says under NumPy 2 (dusty-nv/jetson-containers#561).
NUMPY_ABI_SIGNS = ("compiled using NumPy 1.x", "_ARRAY_API not found", "numpy.core.multiarray failed to import")
def _account() -> str:
    """The user these checks run as, with its groups: what the device nodes and sockets are checked for."""
    import grp
    import pwd

    def group(gid: int) -> str:
        try:
            return grp.getgrgid(gid).gr_name
        except KeyError:
            return str(gid)

    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    return "user {} (groups {})".format(user, ",".join(sorted({group(g) for g in os.getgroups() + [os.getgid()]})))


def _version(module: str) -> str:
    """Its __version__; else pycuda's own VERSION_TEXT (a pycuda built here has no __version__), else absent."""
    found = package_version(module)
    if found is None and module in sys.modules:
        found = getattr(sys.modules[module], "VERSION_TEXT", None)
    return str(found or "absent")


def _not_ok(needed: bool) -> str:
    return "FAIL" if needed else "--"


def check_python() -> Line:
    return "ok", "python", "{} ({}), jetson-edge {}, numpy {}, onnxruntime {}".format(
        platform.python_version(), sys.executable, __version__, _version("numpy"), _version("onnxruntime"))


def check_tensorrt(needed: bool) -> Line:
    problem = tensorrt_probe().problem
    if problem is None:
        return "ok", "tensorrt", _version("tensorrt")
    return _not_ok(needed), "tensorrt", "{}: sudo apt install python3-libnvinfer, and a venv made with " \
        "--system-site-packages ({})".format(problem, RECIPE)


def check_numpy() -> Line:
    """JetPack's OpenCV and TensorRT are built against NumPy 1.x: a NumPy 2 in the venv breaks them."""
    import numpy

    found = "{} ({})".format(numpy.__version__, os.path.dirname(numpy.__file__))
    if int(numpy.__version__.split(".")[0]) < 2 or not is_jetson():
        return "ok", "numpy", found
    return "FAIL", "numpy", "{}: NumPy 2 breaks JetPack's NumPy 1.x builds of OpenCV and TensorRT; .venv/bin/pip " \
        "install -c constraints/jetpackN.txt 'numpy<2' ({})".format(found, RECIPE)


def check_onnxruntime(needed: bool) -> Line:
    """ONNX models run on it, and `edge build --engine` calibrates and gates with it."""
    version = package_version("onnxruntime")
    if version is not None:
        return "ok", "onnxrt", version
    return ("FAIL" if needed else "warn"), "onnxrt", "absent (edge build needs it): on a Jetson .venv/bin/pip " \
        "install -c constraints/jetpackN.txt -e '.[jetson]', elsewhere pip install 'jetson-edge[cpu]'"


def check_nvcc(jetson: bool) -> Line:
    """Needed once, at install: pycuda's build and the preprocessing kernel's."""
    from edge.infer.cuda_kernel import find_nvcc, nvcc_version

    try:
        nvcc = find_nvcc()
        return "ok", "nvcc", "{} (CUDA {})".format(nvcc, nvcc_version(nvcc))
    except EdgeError as exc:
        return ("warn" if jetson else "--"), "nvcc", str(exc)


def check_gpu(needed: bool) -> Line:
    from edge.infer.select import cuda_unavailable

    problem = cuda_unavailable()
    if problem is not None and problem.startswith("pycuda"):
        return _not_ok(needed), "gpu", "{}: pycuda is built with /usr/local/cuda/bin on PATH ({})".format(
            problem, RECIPE)
    if problem is not None:  # pycuda is fine; cuInit failed: no driver/device, or this user may not open it
        return _not_ok(needed), "gpu", "{} as {}: the GPU nodes (/dev/nvhost-*, /dev/nvmap, /dev/nvgpu/*) need " \
            "group video/render; check as the service: edge doctor --as-service".format(problem, _account())
    gpu = gpu_identity()
    return "ok", "gpu", "{} (compute capability {}, {} SMs, CUDA driver {}), pycuda {}".format(
        gpu["gpu"], gpu["compute_capability"], gpu["sm_count"], gpu["cuda"], _version("pycuda"))


def check_kernel(needed: bool, gpu_ok: bool) -> Line:
    """Load the kernel as the preprocessor would; without a GPU, say where it would come from."""
    from edge.infer import cuda_kernel

    folder, why = cuda_kernel.kernel_dir_and_why()
    try:
        built = sorted(n for n in os.listdir(folder) if n.endswith(".cubin"))
        seen = "{} ({}, {}): {}".format(folder, why, _account(), ", ".join(built) or "no kernel built")
    except OSError as exc:
        seen = "{} ({}): not readable as {} ({})".format(folder, why, _account(), exc.strerror)
    if not gpu_ok:
        return _not_ok(needed), "kernel", "not loaded (no CUDA device); would try {}, then the one prebuilt for the " \
            "driver's CUDA major version: {}".format(seen, cuda_kernel.prebuilt_summary())
    from edge.infer.cuda_session import CudaSession

    session = CudaSession()
    try:
        with session:
            _, where = cuda_kernel.load_kernel(session.drv, session.arch)
    except EdgeError as exc:
        fallback = "" if needed else " (preprocess.device auto: CPU preprocessing instead)"
        return "FAIL" if needed else "warn", "kernel", "{}: sudo .venv/bin/python scripts/build_kernel.py --into " \
            "{}{}".format(exc, cuda_kernel.SERVICE_KERNEL_DIR, fallback)
    finally:
        session.release()
    return "ok", "kernel", "loads from {} (kernel dir {})".format(where, seen)


def check_opencv(needed: bool, csi: bool) -> Line:
    try:
        import cv2
    except Exception as exc:  # ImportError, or a broken binary
        if any(sign in str(exc) for sign in NUMPY_ABI_SIGNS):
            return _not_ok(needed), "opencv", "built for NumPy 1.x, this venv has NumPy {} ({}): .venv/bin/pip " \
                "install -c constraints/jetpackN.txt 'numpy<2'".format(_version("numpy"), first_line(exc))
        return _not_ok(needed), "opencv", "not importable ({}): on a Jetson sudo apt install python3-opencv " \
            "(never PyPI's opencv-python there)".format(first_line(exc))
    from edge.sources.gstreamer import _has_gstreamer

    where = "{} ({}: {})".format(cv2.__version__, os.path.dirname(cv2.__file__), opencv_origin(cv2.__file__))
    if _has_gstreamer(cv2):
        return "ok", "opencv", where + ", GStreamer: YES"
    found = where + ", GStreamer: NO"
    if not csi and not is_jetson():
        return "ok", "opencv", found + " (csi:// cameras only need it)"
    return "FAIL" if csi else "warn", "opencv", found + ": use JetPack's python3-opencv (PyPI's has no GStreamer: " \
        "pip uninstall opencv-python opencv-python-headless in the venv)"


def opencv_origin(path: str) -> str:
    """Whose cv2 this is, from where it lies: with both installed, Ubuntu's python3-opencv (python3/dist-packages)
    comes before JetPack's libopencv-python (python3.X/dist-packages) on sys.path, and a venv's PyPI one first."""
    if path.startswith(os.path.realpath(sys.prefix) + os.sep) and sys.prefix != sys.base_prefix:
        return "PyPI's, in this venv"
    if "/usr/lib/python3/dist-packages/" in path:
        return "Ubuntu's python3-opencv"
    if path.startswith("/usr/lib/python3.") and "/dist-packages/" in path:
        return "JetPack's libopencv-python"
    return "built or installed locally" if path.startswith("/usr/local/") else "origin unknown"


def check_argus(csi: bool) -> Line:
    tool = shutil.which("gst-inspect-1.0")
    if tool is None:
        return _not_ok(csi), "argus", "gst-inspect-1.0 not found: sudo apt install gstreamer1.0-tools"
    try:
        found = subprocess.run([tool, "nvarguscamerasrc"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=GST_INSPECT_TIMEOUT_S).returncode == 0
    except subprocess.TimeoutExpired:  # the first scan of the plugin registry can take minutes
        return ("warn" if csi else "--"), "argus", "gst-inspect-1.0 nvarguscamerasrc took over {} s (first " \
            "registry scan?): run it once as {}, then edge doctor again".format(GST_INSPECT_TIMEOUT_S, _account())
    if not found:
        return _not_ok(csi), "argus", "nvarguscamerasrc absent: csi:// cameras need JetPack's " \
            "nvidia-l4t-gstreamer (sudo apt install nvidia-l4t-gstreamer)"
    return check_argus_socket(csi)


def check_argus_socket(csi: bool, path: str = ARGUS_SOCKET) -> Line:
    """nvargus-daemon serves csi:// cameras on a Unix socket; a stuck or stopped daemon fails every csi:// open."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(path)
    except OSError as exc:
        return ("FAIL" if csi else "--"), "argus", "nvarguscamerasrc present, {} not reachable as {} ({}): sudo " \
            "systemctl restart nvargus-daemon".format(path, _account(), exc.strerror or type(exc).__name__)
    finally:
        sock.close()
    return "ok", "argus", "nvarguscamerasrc present, nvargus-daemon answers on {}".format(path)


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
    problem = jtop_client_problem()
    if problem is not None:  # e.g. "Mismatch version jtop service: [4.2.12] and client: [7.2.2]"
        return "warn", "jtop", "{} reachable, but {}: jtop.service must run this venv's jtop (sudo " \
            "scripts/install_service.sh installs the drop-in; docs/service.md)".format(path, problem)
    return "ok", "jtop", "{} reachable, jetson-stats {} talks to it".format(path, package_version("jtop"))


def jtop_client_problem() -> Optional[str]:
    """None when this venv's jtop client connects to the service (same major.minor), else jtop's own words."""
    try:
        from jtop import jtop
    except ImportError:
        return None  # no client here: the socket is all that can be checked
    from edge.service.telemetry import jtop_reason

    client = jtop()
    try:
        client.start()
    except Exception as exc:  # JtopException: "Mismatch version", "I can't access jtop.service", ...
        return jtop_reason(exc)
    finally:
        try:
            client.close()
        except Exception:  # closing a client that never connected
            pass
    return None


def check_power(root: str = "/") -> Line:
    state, warnings = clock_state(root)
    if not state["jetson"]:
        return "--", "power", "not a Jetson: no nvpmodel or jetson_clocks"
    detail = "nvpmodel {}, jetson_clocks {}".format(state["nvpmodel"], state["jetson_clocks"])
    return ("warn" if warnings else "ok"), "power", "; ".join([detail] + warnings)


def check_model(cfg: Config, needed_engine: bool) -> Line:
    path = cfg.model.path
    if not os.path.isfile(path):
        from edge.model.plan import source_model

        fp32 = source_model(path)
        todo = "build it from {}: edge build{} --config {}".format(fp32, " --engine" if needed_engine else "",
                                                                cfg.path or "<your config>") \
            if os.path.isfile(fp32) else "no {} to build it from either: export it on a PC and copy it over " \
            "(docs/service.md, 'The first model')".format(fp32)
        return "FAIL", "model", "{} not found (model.path); {}".format(path, todo)
    if not path.endswith(".engine"):
        return "ok", "model", "{} (ONNX, no engine to match to this board)".format(path)
    warnings: List[str] = []
    try:
        check_engine(path, warn=warnings.append, config_path=cfg.path)
    except EdgeError as exc:
        return "FAIL", "engine", str(exc)
    return ("warn" if warnings else "ok"), "engine", "; ".join(["{} matches this board".format(path)] + warnings)


def check_cameras(cfg: Config) -> Line:
    """Each camera the config serves (`sources`, else `source`) mapped as `edge run` maps it: a missing file or
    folder, or a camera kind this machine cannot open, fails, naming the camera's key. Nothing is opened."""
    from edge.sources.source import open_capture

    served = cameras(cfg)
    for camera in served:
        try:
            open_capture(camera)
        except EdgeError as exc:  # names the camera's key
            return "FAIL", "cameras", str(exc) + (" (camera {})".format(camera.name) if cfg.sources else "")
    return "ok", "cameras", ", ".join("{} {}".format(c.name, redact(c.uri)) for c in served) if cfg.sources \
        else redact(cfg.source.uri)


def check_pipeline(cfg: Config) -> Line:
    """The stages loaded exactly as `edge run` loads them, then closed."""
    from edge.infer.stages import build_stages

    try:
        stages = build_stages(cfg)
    except EdgeError as exc:
        return "FAIL", "pipeline", str(exc)
    stages.close()
    return "ok", "pipeline", "loads: backend {}, preprocess {} ({})".format(
        stages.description.get("backend"), stages.preprocess_name, stages.reason)


def _safe(what: str, check: Callable[..., Line], *args: Any) -> Line:
    """One line whatever the check raises: doctor never ends in a traceback."""
    try:
        return check(*args)
    except Exception as exc:  # a broken package can raise anything on import or probe
        return "FAIL", what, "the check itself failed: {}: {}".format(type(exc).__name__, first_line(exc))


def diagnose(cfg: Config, root: str = "/") -> List[Line]:
    engine = cfg.backend.kind == "tensorrt" or cfg.model.path.endswith(".engine")
    cuda_pre = cfg.preprocess.device == "cuda"
    uris = [camera.uri for camera in cameras(cfg)]
    csi = any(uri.startswith("csi://") for uri in uris)
    lines = [_safe("python", check_python), _safe("numpy", check_numpy), _safe("onnxrt", check_onnxruntime, not engine),
             _safe("tensorrt", check_tensorrt, engine), _safe("nvcc", check_nvcc, is_jetson(root)),
             _safe("gpu", check_gpu, engine or cuda_pre)]
    lines.append(_safe("kernel", check_kernel, cuda_pre, lines[-1][0] == "ok"))
    lines += [_safe("opencv", check_opencv, any(uri != "synthetic" for uri in uris), csi),
              _safe("argus", check_argus, csi), _safe("jtop", check_jtop), _safe("power", check_power, root),
              _safe("cameras", check_cameras, cfg), _safe("model", check_model, cfg, engine),
              _safe("pipeline", check_pipeline, cfg)]
    return lines


def cmd_doctor(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    if options_from(args, DoctorOptions).as_service:
        from edge.cli.doctor_service import run_as_service

        return run_as_service(sys.argv[2:] if sys.argv[1:2] == ["doctor"] else sys.argv[1:])
    cfg = config_from_args(args, serves_cameras=True)
    out("edge doctor: {} (model {}, backend {}, preprocess {}, {})".format(
        cfg.path or "<defaults>", cfg.model.path, cfg.backend.kind, cfg.preprocess.device,
        "{} cameras".format(len(cfg.sources)) if cfg.sources else "source " + redact(cfg.source.uri)))
    lines = diagnose(cfg)
    for status, what, detail in lines:
        out("{:<5} {:<9} {}".format(status, what, detail))
    failed = [what for status, what, _ in lines if status == "FAIL"]
    out("edge doctor: " + ("the configured path cannot run (FAIL: {})".format(", ".join(failed)) if failed
                           else "the configured path can run"))
    return EXIT_FAIL if failed else EXIT_OK


@dataclass(frozen=True)
class DoctorOptions:
    """`edge doctor`'s own flag, declared once (edge.fields)."""

    as_service: bool = setting(False, "run the checks as the service runs: its user, groups and sandbox "
                                      "(systemd-run; as root)", flag="--as-service")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)
    add_flags(p, DoctorOptions, "as_service")


def register(subparsers: Any) -> None:
    add_command(subparsers, "doctor", "check that the configured path can run here, and say what to fix", __doc__,
                add_arguments, cmd_doctor)
