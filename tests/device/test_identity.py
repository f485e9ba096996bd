"""GPU and engine identity on the device. CUDA tier: the board's GPU keys are pycuda's device 0. TensorRT tier:
an engine built here is accepted, one that claims another SM count is refused, and an L4T difference alone is
only a warning."""

from typing import Callable

import pytest

from edge.errors import EdgeError

pytestmark = pytest.mark.jetson


def test_gpu_identity_is_device_0() -> None:
    import pycuda.driver as cuda

    from edge.board import gpu_identity

    cuda.init()
    device = cuda.Device(0)
    identity = gpu_identity()
    print(identity)
    assert identity["gpu"] == device.name() and identity["sm_count"] > 0
    assert identity["compute_capability"] == "{}.{}".format(*device.compute_capability())
    driver = cuda.get_driver_version()
    assert identity["cuda"] == "{}.{}".format(driver // 1000, driver % 1000 // 10)


@pytest.mark.tensorrt
def test_engine_identity_on_this_board(engine: Callable[[str], str]) -> None:
    from edge.board import current_system, is_jetson
    from edge.store.artifact import ENGINE_SYSTEM_KEYS, check_engine

    system = current_system()
    print({key: system[key] for key in ENGINE_SYSTEM_KEYS + ("gpu", "l4t")})
    assert system["sm_count"] > 0 and system["tensorrt"] and system["cuda"]
    assert system["board"] or not is_jetson()
    path = engine("fp32")
    check_engine(path)
    with pytest.raises(EdgeError, match="system.sm_count"):
        check_engine(path, dict(system, sm_count=system["sm_count"] + 1))
    warnings: list = []
    check_engine(path, dict(system, l4t="R0.0.0"), warnings.append)
    assert len(warnings) == 1 and "R0.0.0" in warnings[0]
