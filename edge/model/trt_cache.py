"""TensorRT's native calibration cache format, read without TensorRT: a `TRT-<ver>-EntropyCalibration2` header,
then `tensor: <hex of the big-endian float32 scale>` lines, scale = amax / 127."""

import re
import struct
from typing import Dict, Tuple

_CACHE_HEADER = re.compile(r"^TRT-(\d+)-(\w+)$")


def read_trt_calibration_cache(data: bytes) -> Tuple[int, str, Dict[str, float]]:
    """Parse a native cache -> (TensorRT version number, algorithm, {tensor: scale})."""
    text = data.decode("ascii", errors="strict").splitlines()
    if not text:
        raise ValueError("empty calibration cache")
    match = _CACHE_HEADER.match(text[0].strip())
    if not match:
        raise ValueError("not a TensorRT calibration cache (header {!r})".format(text[0][:40]))
    scales = {}
    for line in text[1:]:
        if not line.strip():
            continue
        name, sep, value = line.rpartition(": ")
        if not sep:
            raise ValueError("bad calibration cache line {!r}".format(line[:60]))
        scales[name] = struct.unpack(">f", int(value.strip(), 16).to_bytes(4, "big"))[0]
    return int(match.group(1)), match.group(2), scales
