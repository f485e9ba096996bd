"""constraints/jetpackN.txt: pip's resolver, asked for a Jetson's Python and aarch64, keeps NumPy 1.x (JetPack's
OpenCV and TensorRT are built against it) and refuses PyPI's OpenCV. Runs pip for real against PyPI
(`pip install --dry-run --report`); skipped when PyPI cannot be reached.

The resolved set is what setup.py's device extras need that has wheels: pycuda, jetson-stats and sdnotify are
source-only on PyPI (pip cannot resolve them for another platform), and none of them brings NumPy 2."""

import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ONLY = ("pycuda", "jetson-stats", "sdnotify")
# JetPack -> (Python, glibc minor of its Ubuntu)
JETPACKS = {"jetpack5": ("3.8", 31), "jetpack6": ("3.10", 35), "jetpack7": ("3.12", 39)}


def device_requirements() -> List[str]:
    """install_requires + the jetson, service and check extras from setup.py, without the source-only ones."""
    call = next(node for node in ast.walk(ast.parse((ROOT / "setup.py").read_text(encoding="utf-8")))
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup")
    kwargs = {k.arg: k.value for k in call.keywords}
    extras = ast.literal_eval(kwargs["extras_require"])
    wanted = ast.literal_eval(kwargs["install_requires"]) + extras["jetson"] + extras["service"] + extras["check"]
    return [r for r in wanted if not r.startswith(SOURCE_ONLY)]


def resolve(jetpack: str, requirements: List[str], tmp_path: Path) -> subprocess.CompletedProcess:
    python, glibc = JETPACKS[jetpack]
    platforms = ["manylinux2014_aarch64"] + ["manylinux_2_{}_aarch64".format(m) for m in range(17, glibc + 1)]
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
           "--report", str(tmp_path / "report.json"), "--python-version", python, "--only-binary=:all:",
           "-c", str(ROOT / "constraints" / (jetpack + ".txt"))]
    for platform in platforms:
        cmd += ["--platform", platform]
    # PyPI only: no local wheel folders or constraints from this machine's pip configuration
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    for key in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX"):
        env.pop(key, None)
    return subprocess.run(cmd + requirements, capture_output=True,
                          encoding="utf-8", errors="replace", env=env, timeout=600)


@pytest.fixture(scope="module", autouse=True)
def pypi() -> None:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError as exc:
        pytest.skip("PyPI not reachable ({}): the resolver needs it".format(exc))


@pytest.mark.parametrize("jetpack", ["jetpack5", "jetpack6"])
def test_the_resolver_keeps_numpy_1_for_the_device_extras(jetpack: str, tmp_path: Path) -> None:
    proc = resolve(jetpack, device_requirements(), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    chosen: Dict[str, str] = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    print(jetpack, sorted(chosen.items()))  # the resolver's choice, for the record (-s)
    assert int(chosen["numpy"].split(".")[0]) == 1, chosen
    assert "onnxruntime" in chosen and "onnx" in chosen  # `edge build --engine` calibrates and gates on the device
    assert not any(name.startswith("opencv") for name in chosen)


def test_pypi_opencv_cannot_be_installed_under_the_constraints(tmp_path: Path) -> None:
    proc = resolve("jetpack6", ["opencv-python-headless>=4.5"], tmp_path)
    assert proc.returncode != 0 and "opencv-python-headless" in proc.stderr, proc.stdout + proc.stderr
