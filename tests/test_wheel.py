"""A wheel is a product: built from the sources (as a container or Ansible would ship it) and installed into a clean
venv, it carries the calibration and regression sets, the example config, the unit and the constraints, and
`edge init` writes them out in an unrelated folder; there export -> build -> run work (slow: the whole chain).

Offline and fast: the wheel is built without build isolation, installed with --no-deps, and the clean venv reads
this venv's site-packages (numpy, onnx, onnxruntime, OpenCV, torch) through a .pth file, after its own."""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Dict

import pytest

from conftest import REPO

# `edge init` is registered by edge/cli/main.py (COMMANDS).
needs_init = pytest.mark.skipif("init" not in __import__("edge.cli.main", fromlist=["COMMANDS"]).COMMANDS,
                                reason="edge/cli/main.py does not list `init` in COMMANDS yet")
COPIED = ("setup.py", "MANIFEST.in", "edge", "calibration/default", "calibration/regression", "configs", "systemd",
          "constraints")


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    """{"wheel": path, "bin": the clean venv's bin folder}."""
    src, out, venv = (tmp_path_factory.mktemp(name) for name in ("src", "wheel", "venv"))
    for rel in COPIED:  # a copy: the build writes build/ and egg-info beside the sources
        source, target = os.path.join(REPO, rel), src / rel
        if os.path.isdir(source):
            shutil.copytree(source, str(target), ignore=shutil.ignore_patterns("__pycache__", "cache", "imagenet"))
        else:
            shutil.copy(source, str(target))
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out), str(src)],
                   check=True, capture_output=True, timeout=300)
    wheel = glob.glob(str(out / "jetson_edge-*.whl"))[0]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run(pip + ["--python", python, "install", "--no-deps", "--no-index", "-q", wheel], check=True,
                   capture_output=True, timeout=300)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, encoding="utf-8", errors="replace", check=True).stdout.strip()
    Path(site, "dependencies-from-the-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n",
                                                                 encoding="utf-8")
    return {"wheel": wheel, "bin": str(venv / "bin")}


def edge(wheel_venv: Dict[str, str], cwd: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([os.path.join(wheel_venv["bin"], "edge")] + list(args), cwd=str(cwd), capture_output=True,
                          encoding="utf-8", errors="replace", timeout=timeout, env=env)


def test_the_wheel_carries_what_the_product_needs(wheel_venv: Dict[str, str]) -> None:
    names = set(zipfile.ZipFile(wheel_venv["wheel"]).namelist())
    for rel in ("calibration/default/manifest.json", "calibration/regression/manifest.json", "configs/example.yaml",
                "systemd/jetson-edge.service", "systemd/config.yaml", "constraints/jetpack6.txt"):
        assert "edge/shipped/" + rel in names, rel
    shipped = [n for n in names if n.startswith("edge/shipped/calibration/default/") and n.endswith(".jpg")]
    assert len(shipped) == len(glob.glob(os.path.join(REPO, "calibration", "default", "*.jpg")))
    from edge.infer.cuda_kernel import prebuilt

    for kernel in ["prebuilt.json"] + [k["file"] for k in prebuilt()]:  # every prebuilt binary: cubin, PTX, fatbin
        assert "edge/cuda/" + kernel in names, kernel


@needs_init
def test_edge_init_writes_them_out_from_the_wheel_and_never_over_a_file(wheel_venv: Dict[str, str],
                                                                        tmp_path: Path) -> None:
    proc = edge(wheel_venv, tmp_path, "init")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.path.join("edge", "shipped") in proc.stdout and REPO not in proc.stdout  # the wheel's, not the checkout
    for rel in ("calibration/default", "calibration/regression"):
        assert sorted(os.listdir(str(tmp_path / rel))) == sorted(os.listdir(os.path.join(REPO, rel)))
    assert (tmp_path / "configs" / "example.yaml").read_bytes() == Path(REPO, "configs", "example.yaml").read_bytes()
    other = tmp_path / "other"
    (other / "configs").mkdir(parents=True)
    (other / "configs" / "example.yaml").write_text("mine", encoding="utf-8")
    refused = edge(wheel_venv, other, "init")
    assert refused.returncode == 2 and "has 1 of these files (configs/example.yaml)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "nothing written" in refused.stderr
    assert sorted(os.listdir(str(other))) == ["configs"]
    assert (other / "configs" / "example.yaml").read_text(encoding="utf-8") == "mine"


@pytest.mark.slow
@needs_init
def test_export_build_run_from_an_unrelated_folder(wheel_venv: Dict[str, str], tmp_path: Path) -> None:
    assert edge(wheel_venv, tmp_path, "init").returncode == 0
    steps = [("export", "--arch", "mobilenet_v3_small", "--weights", "random", "--out", "engines/m.onnx"),
             # the default calibration set; the shipped regression set (the default, made by `edge calibrate
             # imagenet`, needs its source packages)
             ("build", "--model", "engines/m.onnx", "--regression", "calibration/regression", "--no-progress"),
             ("run", "--model", "engines/m.int8.onnx", "--source", "synthetic", "--frames", "3")]
    said = ""
    for step in steps:
        proc = edge(wheel_venv, tmp_path, *step, timeout=600)
        assert proc.returncode == 0, " ".join(step) + "\n" + proc.stdout[-2000:] + proc.stderr[-2000:]
        said += proc.stdout + proc.stderr
    shipped = len([n for n in os.listdir(os.path.join(REPO, "calibration", "default")) if n.endswith(".jpg")])
    assert "calibration: {} images".format(shipped) in said and (tmp_path / "engines" / "m.int8.onnx").is_file()
