"""User-facing errors: one line, naming the file or field, and an exit code."""

import importlib
from types import ModuleType

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_BAD_INPUT = 2


class EdgeError(Exception):
    """An error the CLI prints as one line and turns into an exit code (2: bad input)."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.exit_code = exit_code


# Optional dependency -> how to get it.
_INSTALL_HINTS = {
    "onnxruntime": "pip install 'jetson-edge[cpu]'",
    "cv2": "pip install 'jetson-edge[cpu]' (on a Jetson: apt install python3-opencv, which has GStreamer)",
    "torch": "pip install 'jetson-edge[export]'",
    "torchvision": "pip install 'jetson-edge[export]'",
    "tensorrt": "apt install python3-libnvinfer (JetPack ships TensorRT)",
    "pycuda": "pip install 'jetson-edge[jetson]'",
    "jtop": "pip install 'jetson-edge[jetson]' (jetson-stats)",
    "prometheus_client": "pip install 'jetson-edge[service]'",
    "sdnotify": "pip install 'jetson-edge[service]'",
    "psutil": "pip install 'jetson-edge[service]'",
    "matplotlib": "pip install 'jetson-edge[check]'",
    "onnx": "pip install onnx",
}


def require(module: str) -> ModuleType:
    """Import an optional dependency or raise a one-line EdgeError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = _INSTALL_HINTS.get(module.split(".")[0], "pip install " + module)
        raise EdgeError("missing dependency '{}' ({}): {}".format(module, exc, hint)) from None
