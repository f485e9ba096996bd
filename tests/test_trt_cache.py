"""edge.model.trt_cache: a TensorRT calibration cache is read back as written (version, algorithm, each tensor's
scale), including TensorRT's own layer names; anything else is refused."""

import struct

import numpy as np
import pytest

from edge.model.trt_cache import read_trt_calibration_cache


def write_trt_calibration_cache(path, amax, trt_version, algorithm="EntropyCalibration2"):
    """`{tensor: amax}` as TensorRT writes its cache: scale = amax / 127 as big-endian float32 hex."""
    lines = ["TRT-{}-{}".format(int(trt_version), algorithm)]
    lines += ["{}: {}".format(name, struct.pack(">f", float(amax[name]) / 127.0).hex()) for name in sorted(amax)]
    with open(path, "w", encoding="ascii") as fh:
        fh.write("\n".join(lines) + "\n")


def test_trt_calibration_cache_round_trip(tmp_path):
    amax = {"input": 2.64, "/features/features.0/features.0.0/Conv_output_0": 11.5, "logits": 0.001}
    path = str(tmp_path / "model.cache")
    write_trt_calibration_cache(path, amax, 8601)
    text = open(path, encoding="utf-8").read().splitlines()
    assert text[0] == "TRT-8601-EntropyCalibration2"
    assert "input: " + struct.pack(">f", 2.64 / 127).hex() in text
    version, algorithm, scales = read_trt_calibration_cache(open(path, "rb").read())
    assert (version, algorithm) == (8601, "EntropyCalibration2")
    for name, value in amax.items():
        assert scales[name] == np.float32(value / 127)
    # A cache as TensorRT writes it (layer names with spaces and colons, unpadded lowercase hex).
    native = b"TRT-100300-EntropyCalibration2\ninput: 3c010a14\n(Unnamed Layer* 3) [Activation]_output: 3d7ba1e2\n"
    version, _, scales = read_trt_calibration_cache(native)
    assert version == 100300
    assert scales["input"] == struct.unpack(">f", bytes.fromhex("3c010a14"))[0]
    assert scales["(Unnamed Layer* 3) [Activation]_output"] == struct.unpack(">f", bytes.fromhex("3d7ba1e2"))[0]
    with pytest.raises(ValueError, match="not a TensorRT calibration cache"):
        read_trt_calibration_cache(b'{"input": [0, 1]}\n')
