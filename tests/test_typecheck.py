"""mypy on the GPU modules against tensorrt-stubs: the GPU code is checked without a GPU. Every run reads
mypy.ini; edge/model/tensorrt_engine.py is also checked with the explicit `--strict` flags of FLAGS (mypy.ini's
section for the stubs still applies: it keeps the stubs' own strict-mode errors out, which no command-line flag
can). A misspelt TensorRT call, in a probe file or in a copy of a module, fails.

tensorrt-stubs 10.13.0.35.1 has five lines Python cannot parse (a parameter named `in`, a
non-default parameter after defaults); mypy stops at them. A copy with those lines repaired is
put on MYPYPATH, which mypy reads before site-packages. Nothing else in the stubs is changed.

mypy runs incrementally with one cache per set of flags, shared by this module's runs: the stubs are analysed
once per set. mypy re-checks a module whose file differs from the cached one (size, mtime or path, then hash),
so a misspelt copy is checked afresh after a clean run warmed the cache.
"""

import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Dict, NamedTuple, Sequence

import pytest

ROOT = Path(__file__).resolve().parent.parent
STUB_PACKAGES = ("tensorrt", "tensorrt_bindings")
GPU_FILES = ("edge/infer/cuda_kernel.py", "edge/infer/cuda_preprocess.py", "edge/infer/tensorrt_runner.py",
             "edge/infer/tensorrt_backend.py", "edge/infer/select.py", "edge/model/tensorrt_engine.py",
             "edge/infer/cuda_session.py", "edge/infer/tensorrt_batch.py")
FLAGS = ["--strict", "--follow-imports=silent", "--ignore-missing-imports"]


class Stubs(NamedTuple):
    path: Path  # MYPYPATH holding the repaired stubs
    version: str  # of tensorrt-stubs
    caches: Path  # holds one mypy cache per set of flags


def _repair(text: str) -> str:
    text = re.sub(r"\bin: ", "in_: ", text)  # `in` is a keyword
    return text.replace("power: Weights = None, channel_axis: int)", "power: Weights = None, channel_axis: int = ...)")


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Stubs:
    pytest.importorskip("mypy")
    try:
        stub_version = version("tensorrt-stubs")
    except PackageNotFoundError:
        pytest.skip("tensorrt-stubs not installed (pip install tensorrt-stubs; Python >= 3.10)")
    import tensorrt_stubs  # installed with the stubs: locates site-packages

    site = Path(tensorrt_stubs.__file__).resolve().parent.parent
    out = tmp_path_factory.mktemp("typings")
    for package in STUB_PACKAGES:
        for src in (site / package).glob("*.pyi"):
            text = _repair(src.read_text(encoding="utf-8"))
            ast.parse(text)  # every stub parses after the repair
            (out / package).mkdir(exist_ok=True)
            (out / package / src.name).write_text(text, encoding="utf-8")
    return Stubs(out, stub_version, tmp_path_factory.mktemp("mypy_cache"))


def mypy(stubs: Stubs, flags: Sequence[str], *targets: str, cwd: Path = ROOT) -> "subprocess.CompletedProcess[str]":
    """mypy.ini and `flags` on `targets`, in `cwd`."""
    cache = stubs.caches / hashlib.sha256("\0".join(flags).encode()).hexdigest()[:16]
    env: Dict[str, str] = dict(os.environ, MYPYPATH=str(stubs.path))
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "mypy.ini"), *flags,
                           "--cache-dir", str(cache), *targets],
                          cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          encoding="utf-8", errors="replace")


def test_stubs_describe_tensorrt_10(stubs: Stubs) -> None:
    text = (stubs.path / "tensorrt" / "__init__.pyi").read_text(encoding="utf-8")
    match = re.search(r"__version__: str = '([^']+)'", text)
    assert match is not None
    print("tensorrt-stubs", stubs.version, "describes TensorRT", match.group(1))
    assert stubs.version.startswith("10.")


def test_edge_gpu_typechecks(stubs: Stubs) -> None:
    proc = mypy(stubs, (), *GPU_FILES)
    assert proc.returncode == 0, proc.stdout


PROBE = '''
import tensorrt as trt

def probe(engine: trt.ICudaEngine, context: trt.IExecutionContext, stream: int) -> None:
    name: str = engine.get_tensor_name(engine.num_io_tensors - 1)
    mode: trt.TensorIOMode = engine.get_tensor_mode(name)
    dtype: trt.DataType = engine.get_tensor_dtype(name)
    shape: trt.Dims = engine.get_tensor_shape(name)
    ok: bool = context.set_tensor_address(name, 0) and context.execute_async_v3(stream)
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    again: trt.ICudaEngine = runtime.deserialize_cuda_engine(b"")
    wrong: int = engine.get_tensor_name(0)
    {call}
'''


def test_stubs_cover_the_calls_and_a_misspelling_fails(stubs: Stubs, tmp_path: Path) -> None:
    """The names the backend uses are typed (not Any): a wrong type and a misspelt name are both errors."""
    for i, (call, expected) in enumerate((
            ("engine.get_tensor_name(0)", None),
            ("engine.get_tensor_nam(0)", '"ICudaEngine" has no attribute "get_tensor_nam"'),
            ("context.execute_async_v4(stream)", '"IExecutionContext" has no attribute'))):
        probe = tmp_path / "probe_trt_{}.py".format(i)  # a file per probe: none is mistaken for a cached one
        probe.write_text(PROBE.format(call=call), encoding="utf-8")
        proc = mypy(stubs, (), str(probe))
        assert proc.returncode != 0, proc.stdout
        assert 'Incompatible types in assignment (expression has type "str", variable has type "int")' in proc.stdout
        assert proc.stdout.count("error:") == (1 if expected is None else 2), proc.stdout
        if expected is not None:
            assert expected in proc.stdout, proc.stdout


def test_misspelt_call_in_the_runner_fails(stubs: Stubs, tmp_path: Path) -> None:
    """The engine runner's TensorRT calls are checked: misspell one in a copy of the package."""
    copy = tmp_path / "repo"
    shutil.copytree(str(ROOT / "edge"), str(copy / "edge"), ignore=shutil.ignore_patterns("__pycache__"))
    backend = copy / "edge" / "infer" / "tensorrt_runner.py"
    source = backend.read_text(encoding="utf-8")
    assert "engine.get_tensor_name(" in source
    backend.write_text(source.replace("engine.get_tensor_name(", "engine.get_tensor_nam("), encoding="utf-8")
    proc = mypy(stubs, (), *(str(copy / f) for f in GPU_FILES), cwd=copy)
    assert proc.returncode != 0
    assert '"ICudaEngine" has no attribute "get_tensor_nam"' in proc.stdout, proc.stdout


def test_tensorrt_build_passes_strict_mypy(stubs: Stubs) -> None:
    proc = mypy(stubs, FLAGS, "edge/model/tensorrt_engine.py")
    assert proc.returncode == 0, proc.stdout
    assert "Success: no issues found in 1 source file" in proc.stdout


def test_a_misspelt_tensorrt_call_is_caught(stubs: Stubs, tmp_path: Path) -> None:
    pkg = tmp_path / "edge" / "model"
    pkg.mkdir(parents=True)
    (tmp_path / "edge" / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    text = (ROOT / "edge" / "model" / "tensorrt_engine.py").read_text(encoding="utf-8")
    assert "config.set_memory_pool_limit(" in text
    misspelt = text.replace("config.set_memory_pool_limit(", "config.set_memory_pool_limt(")
    (pkg / "tensorrt_engine.py").write_text(misspelt, encoding="utf-8")
    proc = mypy(stubs, FLAGS, str(pkg / "tensorrt_engine.py"), cwd=tmp_path)
    assert proc.returncode != 0
    assert proc.stdout.count("error:") == text.count("config.set_memory_pool_limit("), proc.stdout  # only those
    assert '"IBuilderConfig" has no attribute "set_memory_pool_limt"' in proc.stdout, proc.stdout
