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
    # Never PyPI's OpenCV on a Jetson: it has no GStreamer and hides JetPack's (csi:// cameras).
    "onnxruntime": "on a Jetson pip install -c constraints/jetpackN.txt 'jetson-edge[jetson]', elsewhere "
                   "pip install 'jetson-edge[cpu]'",
    "cv2": "on a Jetson apt install python3-opencv (GStreamer), elsewhere pip install 'jetson-edge[cpu]'",
    "torch": "pip install 'jetson-edge[export]'",
    "torchvision": "pip install 'jetson-edge[export]'",
    "tensorrt": "apt install python3-libnvinfer (JetPack ships TensorRT)",
    "pycuda": "pip install 'jetson-edge[cuda]' (compiles for minutes on a Jetson; or scripts/install_service.sh "
              "--wheelhouse DIR: docs/service.md)",
    "jtop": "pip install 'jetson-edge[jetson]' (jetson-stats)",
    "prometheus_client": "pip install 'jetson-edge[service]'",
    "sdnotify": "pip install 'jetson-edge[service]'",
    "psutil": "pip install 'jetson-edge[service]'",
    "matplotlib": "pip install 'jetson-edge[check]'",
    "onnx": "pip install onnx",
}


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none): what a one-line error quotes."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


MAX_LINE_CHARS = 300


def one_line(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """`text` safe to print as one line: control characters (newline, NUL, ANSI escape, C1) and undecodable bytes
    of a file name escaped, and at most `limit` characters, cut in the middle (a path's end names the problem)."""
    if len(text) > 2 * limit:  # the middle goes anyway: escape only the ends of a huge text
        text = text[:limit] + text[-limit:]
    out = "".join(c if c.isprintable() else "\\x{:02x}".format(ord(c)) if ord(c) < 256 else
                  "\\u{:04x}".format(ord(c)) for c in text)
    if len(out) <= limit:
        return out
    tail = limit // 3
    head, end = out[:limit - tail - 5], out[-tail:]
    # cut between words ("labelled imag ... ifest" reads as a corrupt line), or at a path's separator
    if " " in head[limit // 3:]:
        head = head[:head.rfind(" ")]
    cuts = [i for i in (end.find(" ", 0, tail // 2), end.find("/", 0, tail // 2)) if i >= 0]
    if cuts:  # from the first word or path component on: a path's end still names the problem
        end = end[min(cuts) + (end[min(cuts)] == " "):]
    return head + " ... " + end


def require(module: str) -> ModuleType:
    """Import an optional dependency or raise a one-line EdgeError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = _INSTALL_HINTS.get(module.split(".")[0], "pip install " + module)
        raise EdgeError("missing dependency '{}' ({}): {}".format(module, exc, hint)) from None
