"""`edge doctor` through the real CLI on this machine, made one without a GPU (the no_gpu fixture): the CPU path
can run (exit 0), a config that asks for TensorRT or CUDA preprocessing cannot (exit 1, FAIL lines with the reason
and what to do)."""

import os
import re
import shutil
import sys
import tempfile
from typing import Any, Dict, List

import pytest

from conftest import NO_DEVICE, REPO, as_nobody, assert_refused, edge_here, run_edge


def status(stdout: str) -> Dict[str, str]:
    """{what: status} from the `status what detail` lines."""
    return {m.group(2): m.group(1) for m in re.finditer(r"^(ok|warn|FAIL|--)\s+(\S+)\s", stdout, re.M)}


def test_no_gpu_is_a_machine_without_a_device_in_this_process_and_in_its_children(no_gpu: None) -> None:
    """What the tests that need "no GPU" stand on, on a machine with one too (a Jetson, a workstation)."""
    from edge.board import gpu_identity
    from edge.errors import EdgeError
    from edge.infer.cuda_kernel import device_arch
    from edge.infer.select import cuda_unavailable

    assert cuda_unavailable() == "no CUDA device ({})".format(NO_DEVICE)
    assert gpu_identity()["gpu"] is None
    try:
        why = device_arch()[1]  # the device tree's SoC, on a Jetson
    except EdgeError as exc:
        why = str(exc)
    assert NO_DEVICE in why
    child = run_edge("doctor", "--model", "absent.onnx")
    assert re.search(r"^(--|FAIL)\s+gpu\s+(no CUDA device|pycuda not importable)", child.stdout, re.M), child.stdout
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_cpu_path_can_run(small_model: str, no_gpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in ("EDGE_KERNEL_DIR", "STATE_DIRECTORY"):  # the default kernel dir, whatever this shell has set
        monkeypatch.delenv(setting, raising=False)
    proc = run_edge("doctor", "--model", small_model, "--source", "synthetic")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = status(proc.stdout)
    assert list(lines) == ["python", "numpy", "onnxrt", "tensorrt", "nvcc", "gpu", "kernel", "opencv", "argus", "jtop",
                           "power", "cameras", "model", "pipeline"]
    assert lines["python"] == lines["model"] == lines["pipeline"] == "ok"
    assert "FAIL" not in lines.values()
    assert re.search(r"^ok\s+pipeline\s+loads: backend onnxruntime, preprocess cpu \(model is not a \.engine",
                     proc.stdout, re.M)
    assert re.search(r"^--\s+kernel\s+not loaded \(no CUDA device\); would try /var/lib/jetson-edge/kernels \(the "
                     r"service's state directory\).*, then the one prebuilt for the driver's CUDA major version: "
                     r"CUDA 11.x: preprocess-cuda11.8-sm_72.cubin .*CUDA 13.x: preprocess.fatbin", proc.stdout, re.M)
    assert proc.stdout.rstrip().endswith("edge doctor: the configured path can run")


def test_gpu_config_cannot_run_here(tmp_path, no_gpu) -> None:
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


def test_every_configured_camera_is_checked(small_model: str, tmp_path) -> None:
    """`sources:` is what `edge run` serves: a camera file that is missing fails doctor, naming its key (it passed
    as "the configured path can run"); so does the one `source`."""
    (tmp_path / "frames").mkdir()
    config = tmp_path / "cameras.yaml"
    config.write_text("sources:\n  - {name: a, uri: synthetic}\n  - {name: b, uri: %s}\n" % (tmp_path / "gone.mp4"),
                      encoding="utf-8")
    out: List[str] = []
    code = _doctor_here(["--config", str(config), "--model", small_model], out)
    assert code == 1 and "edge doctor: the configured path cannot run (FAIL: cameras)" in out[-1]
    assert re.search(r"^FAIL\s+cameras\s+sources\[1\]\.uri .*gone.mp4: video file or image folder not found "
                     r"\(camera b\)", "\n".join(out), re.M)
    code = _doctor_here(["--model", small_model, "--source", str(tmp_path / "gone.mp4")], out)
    assert code == 1 and re.search(r"^FAIL\s+cameras\s+source\.uri .*gone.mp4", "\n".join(out), re.M)


def _doctor_here(argv: List[str], out: List[str]) -> int:
    from edge.cli import doctor
    from edge.cli.main import build_parser

    del out[:]
    return doctor.cmd_doctor(build_parser().parse_args(["doctor"] + argv), out=out.append)


def test_bad_config_is_exit_2(tmp_path) -> None:
    proc = run_edge("doctor", "--config", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_doctor_as_an_unprivileged_user_names_each_cause_in_one_line(small_model: str, tmp_path, monkeypatch,
                                                                    no_gpu) -> None:
    """What the service account would meet (here: nobody, no groups): a model folder and a kernel folder it cannot
    read are named, one line each, with the account; no traceback."""
    kernels = tmp_path / "kernels"  # root's, 0700: like /var/lib/jetson-edge/kernels owned by another account
    kernels.mkdir(mode=0o700)
    shared = tempfile.mkdtemp(prefix="doctor-")  # readable by nobody
    os.chmod(shared, 0o755)
    for name in os.listdir(os.path.dirname(small_model)):
        shutil.copy(os.path.join(os.path.dirname(small_model), name), shared)
    model = os.path.join(shared, os.path.basename(small_model))
    monkeypatch.setenv("EDGE_KERNEL_DIR", str(kernels))
    monkeypatch.setenv("HOME", shared)

    def doctor() -> List[Any]:
        proc = edge_here("doctor", "--model", model, "--source", "synthetic")
        return [proc.returncode, proc.stdout, proc.stderr]

    def warm() -> None:
        import grp  # noqa: F401  what only a permission error's message needs (the account's name and groups)
        import pwd  # noqa: F401

        doctor()

    try:
        code, out, _ = as_nobody(doctor, warm)
        os.chmod(model, 0o600)  # now the model too is unreadable for nobody
        unreadable_code, unreadable, unreadable_err = as_nobody(doctor, warm)
    finally:
        shutil.rmtree(shared)
    assert code == 0, out
    assert re.search(r"^--\s+kernel\s+.*{} \(\$EDGE_KERNEL_DIR\): not readable as user nobody \(groups nogroup\) "
                     r"\(Permission denied\)".format(re.escape(str(kernels))), out, re.M), out
    assert unreadable_code == 1 and "Traceback" not in unreadable + unreadable_err
    assert re.search(r"^FAIL\s+pipeline\s+.*{}".format(re.escape(model)), unreadable, re.M), unreadable
    assert all(re.match(r"^(ok|warn|FAIL|--)\s+\S+\s|^edge doctor: ", line) for line in unreadable.splitlines())


def test_a_check_that_raises_anything_is_one_fail_line() -> None:
    from edge.cli.doctor import _safe

    def broken() -> None:
        raise RuntimeError("driver exploded\nsecond line")

    assert _safe("gpu", broken) == ("FAIL", "gpu", "the check itself failed: RuntimeError: driver exploded")


def test_a_pycuda_without_version_metadata_is_named_by_its_version_text(monkeypatch) -> None:
    """A pycuda built from its sdist (tools/pycuda_kit.sh) has no __version__: the gpu line still names it."""
    import types

    from edge.cli import doctor

    fake = types.ModuleType("pycuda")
    fake.VERSION_TEXT = "2026.1"
    monkeypatch.setitem(sys.modules, "pycuda", fake)
    assert doctor._version("pycuda") == "2026.1"
    monkeypatch.delattr(fake, "VERSION_TEXT")
    assert doctor._version("pycuda") == "absent"


def test_opencv_built_for_numpy_1_is_named_as_an_abi_mismatch(tmp_path, monkeypatch) -> None:
    from edge.cli.doctor import check_opencv

    (tmp_path / "cv2.py").write_text("raise ImportError('numpy.core.multiarray failed to import')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cv2", raising=False)
    status_, what, detail = check_opencv(True, True)
    assert (status_, what) == ("FAIL", "opencv") and "built for NumPy 1.x" in detail and "numpy<2" in detail
    assert "apt install python3-opencv" not in detail


def test_a_slow_gst_inspect_is_a_line_not_a_traceback(tmp_path, monkeypatch) -> None:
    from edge.cli import doctor

    fake = tmp_path / "gst-inspect-1.0"
    fake.write_text("#!/bin/sh\nexec sleep 30\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    monkeypatch.setattr(doctor, "GST_INSPECT_TIMEOUT_S", 1)
    status_, what, detail = doctor.check_argus(True)
    assert (status_, what) == ("warn", "argus") and "took over 1 s (first registry scan?)" in detail


def test_as_service_takes_the_units_user_groups_and_sandbox_and_nothing_else() -> None:
    from edge.cli.doctor_service import sandbox_properties

    props = sandbox_properties(os.path.join(REPO, "systemd", "jetson-edge.service"))
    assert {"--property=User=jetson-edge", "--property=SupplementaryGroups=video render jtop",
            "--property=ProtectSystem=strict", "--property=StateDirectory=jetson-edge jetson-edge/engines",
            "--property=Environment=TMPDIR=/run/jetson-edge-doctor"} <= set(props)
    keys = {p.split("=", 2)[1] for p in props}
    assert not keys & {"ExecStart", "ExecReload", "Type", "WatchdogSec", "Restart", "NotifyAccess"}
    assert not keys & {"Description", "WantedBy", "After"}  # [Unit] and [Install] are not the sandbox


def test_as_service_without_systemd_or_unit_is_one_line() -> None:
    if os.path.isdir("/run/systemd/system"):
        pytest.skip("a running systemd here: --as-service would really run")
    assert_refused(run_edge("doctor", "--as-service"), "--as-service", "systemd-run")
