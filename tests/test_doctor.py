"""`edge doctor` through the real CLI on this machine (no GPU): the CPU path can run (exit 0), a config that
asks for TensorRT or CUDA preprocessing cannot (exit 1, FAIL lines with the reason and what to do)."""

import re
from typing import Dict

from conftest import run_edge


def status(stdout: str) -> Dict[str, str]:
    """{what: status} from the `status what detail` lines."""
    return {m.group(2): m.group(1) for m in re.finditer(r"^(ok|warn|FAIL|--)\s+(\S+)\s", stdout, re.M)}


def test_cpu_path_can_run(small_model: str) -> None:
    proc = run_edge("doctor", "--model", small_model, "--source", "synthetic")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = status(proc.stdout)
    assert list(lines) == ["python", "tensorrt", "gpu", "kernel", "opencv", "argus", "jtop", "power", "model",
                           "pipeline"]
    assert lines["python"] == lines["model"] == lines["pipeline"] == "ok"
    assert "FAIL" not in lines.values()
    assert re.search(r"^ok\s+pipeline\s+loads: backend onnxruntime, preprocess cpu \(model is not a \.engine",
                     proc.stdout, re.M)
    assert re.search(r"^--\s+kernel\s+not loaded \(no CUDA device\); shipped edge/cuda/preprocess.fatbin .* matches",
                     proc.stdout, re.M)
    assert proc.stdout.rstrip().endswith("edge doctor: the configured path can run")


def test_gpu_config_cannot_run_here(tmp_path) -> None:
    engine = str(tmp_path / "model.int8.engine")
    proc = run_edge("doctor", "--model", engine, "--backend", "tensorrt", "--preprocess", "cuda")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = status(proc.stdout)
    assert {k: lines[k] for k in ("tensorrt", "gpu", "kernel", "model", "pipeline")} == dict.fromkeys(
        ("tensorrt", "gpu", "kernel", "model", "pipeline"), "FAIL")
    assert re.search(r"^FAIL\s+tensorrt\s+tensorrt not importable: .*sudo apt install python3-libnvinfer",
                     proc.stdout, re.M)
    assert re.search(r"^FAIL\s+pipeline\s+backend.kind tensorrt is not available: ", proc.stdout, re.M)
    assert "edge doctor: the configured path cannot run (FAIL: tensorrt, gpu, kernel, model, pipeline)" in proc.stdout


def test_bad_config_is_exit_2(tmp_path) -> None:
    proc = run_edge("doctor", "--config", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
