"""edge/build/tensorrt_engine.py type-checks under `mypy --strict` against tensorrt-stubs, with explicit flags
(independent of mypy.ini). A misspelt TensorRT call in a copy of the module fails, so the stubs are really read.

tensorrt-stubs 10.13 has a few lines Python cannot parse (a parameter named `in`, a non-default parameter
after defaults); a repaired copy of the stubs goes on MYPYPATH, which mypy reads before site-packages.
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULE = ROOT / "edge" / "build" / "tensorrt_engine.py"
FLAGS = ["--strict", "--follow-imports=silent", "--ignore-missing-imports", "--no-incremental"]


@pytest.fixture(scope="module")
def stub_path(tmp_path_factory):
    pytest.importorskip("mypy")
    try:
        from importlib.metadata import PackageNotFoundError, version
        version("tensorrt-stubs")
    except PackageNotFoundError:
        pytest.skip("tensorrt-stubs not installed (pip install tensorrt-stubs; Python >= 3.10)")
    import tensorrt_stubs

    site = Path(tensorrt_stubs.__file__).resolve().parent.parent
    out = tmp_path_factory.mktemp("stubs")
    for package in ("tensorrt", "tensorrt_bindings"):
        (out / package).mkdir()
        for src in (site / package).glob("*.pyi"):
            text = re.sub(r"\bin: ", "in_: ", src.read_text(encoding="utf-8"))
            text = text.replace("power: Weights = None, channel_axis: int)",
                                "power: Weights = None, channel_axis: int = ...)")
            ast.parse(text)
            (out / package / src.name).write_text(text, encoding="utf-8")
    return out


def run_mypy(stub_path, cwd, target, cache):
    env = dict(os.environ, MYPYPATH=str(stub_path))
    return subprocess.run([sys.executable, "-m", "mypy", *FLAGS, "--cache-dir", str(cache), target], cwd=str(cwd),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)


def test_tensorrt_build_passes_strict_mypy(stub_path, tmp_path):
    proc = run_mypy(stub_path, ROOT, "edge/build/tensorrt_engine.py", tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout
    assert "Success: no issues found in 1 source file" in proc.stdout


def test_a_misspelt_tensorrt_call_is_caught(stub_path, tmp_path):
    pkg = tmp_path / "edge" / "build"
    pkg.mkdir(parents=True)
    (tmp_path / "edge" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    text = MODULE.read_text(encoding="utf-8")
    assert "config.set_memory_pool_limit(" in text
    misspelt = text.replace("config.set_memory_pool_limit(", "config.set_memory_pool_limt(")
    (pkg / "tensorrt_engine.py").write_text(misspelt)
    proc = run_mypy(stub_path, tmp_path, "edge/build/tensorrt_engine.py", tmp_path / "cache")
    assert proc.returncode != 0
    assert '"IBuilderConfig" has no attribute "set_memory_pool_limt"' in proc.stdout, proc.stdout
