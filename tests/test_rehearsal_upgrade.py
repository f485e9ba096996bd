"""A JetPack upgrade, rehearsed on the simulated GPU: the service ends serving (issue 42 HIGH 1).

The booted rehearsal (tests/test_rehearsal.py) has no GPU, so an engine there is one it cannot serve whatever its
TensorRT: the upgrade is rehearsed here instead, through the real `edge build --needed` (jetson-edge-engine.service's
ExecCondition) and the real `edge run` (the service's start), with the GPU path of tests/device/test_simulated.py
(pycuda's stand-in and the stub TensorRT of tests/fake_tensorrt.py, whose engine is a linear map). JetPack 6.0 ->
6.1 moves TensorRT 8.6 -> 10.3 and the driver's CUDA 12.2 -> 12.6: the stub's version and the driver's are changed
under an engine built before, as apt would.
"""

import json
import shutil
import sys
from typing import Any, Dict, List, Tuple

import pytest
from device import sim_gpu, test_simulated
from service_helpers import write_config

from edge.cli.main import main
from edge.infer.select import ENGINE_UNIT

from fake_tensorrt import ENGINE_MAGIC, fake_tensorrt

STEM = "mobilenet_v3_large"
host_lib, sim = test_simulated.host_lib, test_simulated.sim  # the simulated GPU's fixtures


def jetpack(monkeypatch: pytest.MonkeyPatch, gpu: sim_gpu.Sim, tensorrt: str, cuda: int) -> None:
    """This board's TensorRT and CUDA driver, as a JetPack installs them."""
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(tensorrt))
    monkeypatch.setattr(gpu.driver, "get_driver_version", lambda: cuda)


def installed(engines: Any, name: str, content: bytes, fmt: str) -> None:
    """What a build installs as engines/<name> on this board, TensorRT and CUDA (edge.store's install: a numbered
    set with its model info and labels). The stub builder's engine bytes do not deserialize: the runtime's are
    installed for the engine unit's build."""
    from edge.board import current_system
    from edge.store.artifact import install, make_model_info, read_model_info

    source = str(engines / (STEM + ".onnx"))
    staged = str(engines.parent / name)
    with open(staged, "wb") as fh:
        fh.write(content)
    info = make_model_info(staged, read_model_info(source), source, fmt=fmt, precision="int8", calibration=None,
                           gate=None, system=current_system(), build={})
    install(str(engines / name), artifact=staged, info=info, labels=source[:-len(".onnx")] + ".labels.txt",
            log=lambda line: None)


def served(capsys: pytest.CaptureFixture, config: str) -> Dict[str, Any]:
    """`edge run` of the service's config for a few frames: its start line, with the frames it served."""
    assert main(["run", "--config", config, "--frames", "3", "--budget-ms", "1000"]) == 0
    lines: List[Dict[str, Any]] = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    start = next(ln for ln in lines if ln.get("event") == "start")
    report = next(ln for ln in lines if ln.get("event") == "report")
    return dict(start, frames=report["frames"])


def needed(capsys: pytest.CaptureFixture, config: str) -> Tuple[int, str]:
    code = main(["build", "--engine", "--needed", "--config", config])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("sim", [True], indirect=["sim"], ids=["integrated"])
def test_a_jetpack_upgrade_ends_with_the_service_serving(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Any, tiny_classifiers: List[str],
                                                         capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr("edge.infer.tensorrt_backend._GraphApi", lambda: None)
    engines = tmp_path / "engines"
    engines.mkdir()
    for suffix in (".onnx", ".labels.txt", ".json"):  # the PC's export
        shutil.copy(tiny_classifiers[0][:-len(".onnx")] + suffix, str(engines / (STEM + suffix)))
    config = write_config(tmp_path / "config.yaml", {"model": {"path": str(engines / (STEM + ".int8.engine"))},
                                                     "backend": {"kind": "auto"}, "preprocess": {"device": "cpu"}})
    jetpack(monkeypatch, sim, "8.6.2", 12020)  # JetPack 6.0
    # the docs' CPU block first (the INT8 Q/DQ ONNX), then the engine block: each in its own sets
    with open(tiny_classifiers[1], "rb") as fh:
        installed(engines, STEM + ".int8.onnx", fh.read(), "onnx-qdq")
    installed(engines, STEM + ".int8.engine", ENGINE_MAGIC, "tensorrt-engine")
    code, said = needed(capsys, config)
    assert code == 1 and "fits this board, TensorRT and CUDA: nothing to build" in said
    before = served(capsys, config)
    assert before["backend"] == "tensorrt" and "degraded" not in before and before["frames"] == 3

    jetpack(monkeypatch, sim, "10.3.0", 12060)  # apt moved it to JetPack 6.1
    code, said = needed(capsys, config)
    assert code == 0 and "build: needed:" in said and "system.cuda '12.2', expected '12.6'" in said
    degraded = served(capsys, config)  # the service's start while the engine unit builds (or after it failed)
    assert degraded["backend"] == "onnxruntime" and degraded["frames"] == 3
    assert degraded["model"] == str(engines / (STEM + ".int8.onnx"))  # the INT8 Q/DQ ONNX the gate judged
    assert degraded["degraded"].startswith("serving {}.int8.onnx on the CPU: ".format(STEM))
    assert "expected '12.6'" in degraded["degraded"] and ENGINE_UNIT in degraded["degraded"]

    installed(engines, STEM + ".int8.engine", ENGINE_MAGIC, "tensorrt-engine")  # the engine unit's build, done
    code, said = needed(capsys, config)
    assert code == 1 and "nothing to build" in said
    after = served(capsys, config)
    assert after["backend"] == "tensorrt" and "degraded" not in after and after["frames"] == 3
