"""Every input file is read here: a regular file of bounded size (a FIFO, a device, a link loop is named, never
opened for long), decoded whole, and any failure is one EdgeError naming the file."""

import errno
import json
import os
import stat
from typing import Any, Optional, Tuple

from edge.errors import EdgeError, require
from edge.image_header import image_size

MAX_IMAGE_BYTES = 256 << 20  # an image file larger than this is not a photograph
MAX_IMAGE_PIXELS = 100_000_000  # 100 MP (300 MB decoded BGR); decompression bombs are far larger


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symlink"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def path_kind(path: str) -> str:
    """What is at `path`, in words ("a FIFO", "a device", ...), for a one-line refusal."""
    try:
        return file_kind(os.lstat(path).st_mode)
    except OSError:
        return "missing"


def read_regular(path: str, max_bytes: int = MAX_IMAGE_BYTES) -> Tuple[Optional[bytes], Optional[str]]:
    """(contents, None), or (None, why not) for anything but a readable regular file of at most `max_bytes`.

    Symlinks to regular files are followed; FIFOs, devices, loops and dangling links are named, never opened
    for long: O_NONBLOCK keeps a FIFO from blocking the open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "symlink loop"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return None, "dangling link"
        return None, "unreadable ({})".format(exc.strerror)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # checked before fdopen, which refuses a folder with its own error
        os.close(fd)
        return None, "not a regular file ({})".format(file_kind(st.st_mode))
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > max_bytes:
            return None, "larger than {} MB".format(max_bytes >> 20)
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        return None, "larger than {} MB".format(max_bytes >> 20)
    return data, None


def read_text(path: str, what: str, max_bytes: int) -> str:
    """A UTF-8 text file of at most `max_bytes`; missing, unreadable, too big or not UTF-8 is one EdgeError."""
    if not os.path.lexists(path):
        raise EdgeError("{}: {} not found".format(path, what))
    data, why = read_regular(path, max_bytes)
    if data is None:
        raise EdgeError("{}: cannot read {}: {}".format(path, what, why))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EdgeError("{}: {} is not UTF-8 text (byte {})".format(path, what, exc.start)) from None


def read_image(path: str, flags: Optional[int] = None) -> Tuple[bytes, Any, str]:
    """(file bytes, decoded image, '') or (bytes, None, why not). Only regular files within MAX_IMAGE_BYTES and
    MAX_IMAGE_PIXELS are decoded: FIFOs, devices, link loops, dangling links and pixel bombs are named instead.
    `flags`: cv2.imdecode's (default IMREAD_COLOR, 8-bit BGR)."""
    cv2, np = require("cv2"), require("numpy")  # imported here: registering the commands stays light
    data, why = read_regular(path)
    if data is None:
        return b"", None, why or "unreadable"
    if not data:
        return data, None, "zero-byte"
    size = image_size(data)
    if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
        return data, None, "more than {} megapixels".format(MAX_IMAGE_PIXELS // 1000000)
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR if flags is None else flags)
    except cv2.error:  # e.g. OpenCV's own pixel limit for a format image_size does not read
        image = None
    return (data, image, "") if image is not None else (data, None, "not a readable image")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: Any) -> dict:
    """A JSON object, refusing a repeated key (json's default keeps the last one silently)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(json.dumps(key)[:60])
        out[key] = value
    return out


def load_json(path: str, what: str, max_bytes: int = 64 << 20) -> Any:
    """A JSON file's contents; anything unreadable (too big, not UTF-8, nested too deeply) is one EdgeError."""
    text = read_text(path, "the " + what, max_bytes)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise EdgeError("{}: the {} repeats the key {}".format(path, what, exc)) from None
    except RecursionError:
        raise EdgeError("{}: the {} is nested too deeply".format(path, what)) from None
    except ValueError as exc:
        raise EdgeError("{}: the {} is not JSON: {}".format(path, what, str(exc)[:120])) from None
