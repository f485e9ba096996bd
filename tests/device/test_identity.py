"""Engine identity on the device: this board's keys are all known, an engine built here is accepted, one that
claims another SM count is refused, and an L4T difference alone is only a warning."""

from typing import Callable

import pytest

from edge.errors import EdgeError

pytestmark = pytest.mark.jetson


def test_engine_identity_on_this_board(engine: Callable[[str], str]) -> None:
    import pycuda.driver as cuda

    from edge.board import current_system, is_jetson
    from edge.store.artifact import ENGINE_SYSTEM_KEYS, check_engine

    system = current_system()
    print({key: system[key] for key in ENGINE_SYSTEM_KEYS + ("gpu", "l4t")})
    cuda.init()
    assert system["compute_capability"] == "{}.{}".format(*cuda.Device(0).compute_capability())
    assert system["sm_count"] > 0 and system["tensorrt"] and system["cuda"]
    assert system["board"] or not is_jetson()
    path = engine("fp32")
    check_engine(path)
    with pytest.raises(EdgeError, match="system.sm_count"):
        check_engine(path, dict(system, sm_count=system["sm_count"] + 1))
    warnings: list = []
    check_engine(path, dict(system, l4t="R0.0.0"), warnings.append)
    assert len(warnings) == 1 and "R0.0.0" in warnings[0]
