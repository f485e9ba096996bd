"""scripts/gpu_check.sh's parts that need no GPU: on a machine without one, `run` exits 3 with one line naming what
is missing (and still leaves its record); a dry run writes the one JSON record with every step in order; `prepare`
refuses a kit folder git would carry as a change."""

import json
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = os.path.join(REPO, "scripts", "gpu_check.sh")
STEPS = ["nvidia_smi", "kernel_build", "doctor", "device_cuda_tier", "device_tensorrt_tier", "suite_with_a_gpu",
         "benchmark", "edge_run"]


def gpu_check(*args, **env):
    return subprocess.run([SCRIPT] + [str(a) for a in args], capture_output=True, encoding="utf-8",
                          errors="replace", timeout=120, env=dict(os.environ, GPU_CHECK_PYTHON=sys.executable, **env))


def record(folder):
    with open(os.path.join(str(folder), "gpu_check.json"), encoding="utf-8") as fh:
        found = json.load(fh)
    assert set(found) == {"check", "status", "missing", "when", "host", "commit", "python", "gpu", "steps",
                          "benchmark", "edge_run", "log"}
    assert os.path.isfile(os.path.join(str(folder), found["log"]))
    return found


def test_without_a_gpu_run_is_one_line_naming_what_is_missing(tmp_path, no_gpu):
    proc = gpu_check("run", tmp_path, GPU_KIT=str(tmp_path / "no-kit"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpu_check: no GPU to check: ") and "Traceback" not in proc.stdout + proc.stderr
    assert "pycuda not importable" in line or "no CUDA device" in line, line
    found = record(tmp_path)
    assert (found["status"], found["steps"]) == ("no gpu", []) and found["missing"] in line


def test_a_dry_run_writes_the_record_with_every_step(tmp_path):
    proc = gpu_check("run", tmp_path / "out", "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = record(tmp_path / "out")
    assert found["status"] == "dry run" and found["missing"] is None
    assert [s["name"] for s in found["steps"]] == STEPS
    assert all(s["status"] == "dry run" and set(s) == {"name", "status", "seconds", "detail"} for s in found["steps"])
    steps = {s["name"]: s["detail"] for s in found["steps"]}
    kernels = steps["kernel_build"].split("scripts/build_kernel.py --into ", 1)[1].strip()
    assert kernels.endswith("/kernels") and not os.path.exists(kernels)  # a temporary kernel dir, gone after
    assert '-m jetson and not tensorrt' in steps["device_cuda_tier"]
    assert "benchmarks/gpu_preprocess.py --frames 300" in steps["benchmark"]
    assert proc.stdout.strip().endswith("gpu_check.json")


def test_bad_usage_and_an_unignored_kit_are_one_line(tmp_path):
    for args in (["run"], ["run", tmp_path, "--fast"], ["frobnicate"]):
        proc = gpu_check(*args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "usage" in proc.stderr or "unknown option --fast" in proc.stderr
    proc = gpu_check("prepare", os.path.join(REPO, "docs"))
    assert proc.returncode == 2 and "not ignored by git" in proc.stderr, proc.stderr
    proc = gpu_check("prepare", tmp_path)
    assert proc.returncode == 2 and "must lie inside the checkout" in proc.stderr, proc.stderr
