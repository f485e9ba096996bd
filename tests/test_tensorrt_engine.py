"""edge.model.tensorrt_engine's options, against TensorRT's own names (no GPU): an engine built on TensorRT 8.x leaves
out the cuBLAS and cuDNN tactics (each execution context would load those libraries: hundreds of MB on a Jetson,
twice during a reload) but keeps cuBLASLt (MobileNetV3's Gemm head), and records what it allowed; the workspace is
capped by the board's memory."""

import types
from typing import Any, List

import pytest

from edge.model.tensorrt_engine import build_workspace_mb, limit_tactic_sources

# TensorRT's TacticSource values (8.5 to 10.x: CUBLAS 0, CUBLAS_LT 1, CUDNN 2, EDGE_MASK_CONVOLUTIONS 3, JIT 4)
SOURCES = types.SimpleNamespace(CUBLAS=0, CUBLAS_LT=1, CUDNN=2, EDGE_MASK_CONVOLUTIONS=3, JIT_CONVOLUTIONS=4)


class Config:
    def __init__(self) -> None:
        self.sources: List[int] = []

    def set_tactic_sources(self, mask: int) -> bool:
        self.sources.append(mask)
        return True


@pytest.mark.parametrize("major,expected,named", [
    (8, [(1 << 1) | (1 << 3) | (1 << 4)], ["CUBLAS_LT", "EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS"]),
    (10, [], ["tensorrt-default"]), (11, [], ["tensorrt-default"])])
def test_tensorrt_8_builds_without_cublas_and_cudnn_but_with_cublaslt(major: int, expected: List[int],
                                                                      named: List[str]) -> None:
    config = Config()
    assert limit_tactic_sources(types.SimpleNamespace(TacticSource=SOURCES), config, major) == named
    assert config.sources == expected
    if expected:
        assert not expected[0] & ((1 << SOURCES.CUBLAS) | (1 << SOURCES.CUDNN))
        assert expected[0] & (1 << SOURCES.CUBLAS_LT)


@pytest.mark.parametrize("configured,ram_mb,expected", [(1024, 3964, 495), (1024, 7620, 952), (1024, 31000, 1024),
                                                        (256, 3964, 256), (1024, None, 1024), (1024, 300, 64)])
def test_the_workspace_is_at_most_an_eighth_of_the_boards_memory(configured: int, ram_mb: Any,
                                                                 expected: int) -> None:
    assert build_workspace_mb(configured, ram_mb) == expected
