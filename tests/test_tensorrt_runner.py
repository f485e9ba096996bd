"""edge.infer.tensorrt_runner without a GPU: the runner takes every I/O type the TensorRT has (TensorRT 10's INT64
and UINT8 included) and refuses the others in one line."""

import sys
import types
from typing import Any

import numpy as np
import pytest

from edge.errors import EdgeError


@pytest.mark.parametrize("names,dtype,expected", [
    (("FLOAT", "HALF", "INT8", "INT32", "BOOL", "UINT8", "INT64"), "INT64", np.int64),  # TensorRT 10
    (("FLOAT", "HALF", "INT8", "INT32", "BOOL", "UINT8", "INT64"), "UINT8", np.uint8),
    (("FLOAT", "HALF", "INT8", "INT32", "BOOL", "UINT8"), "FLOAT", np.float32),  # TensorRT 8.5: no INT64
])
def test_runner_maps_every_io_type_the_tensorrt_has(monkeypatch: pytest.MonkeyPatch, names: Any, dtype: str,
                                                    expected: Any) -> None:
    from edge.infer.tensorrt_runner import np_dtype

    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(
        DataType=types.SimpleNamespace(**{n: "DataType." + n for n in names})))
    assert np_dtype("DataType." + dtype) == np.dtype(expected)
    with pytest.raises(EdgeError, match="unsupported TensorRT I/O data type DataType.FP8"):
        np_dtype("DataType.FP8")
