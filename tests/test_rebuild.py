"""`edge rebuild` end to end on the CPU with a file source: a real capture, INT8 calibration, gate, latency check,
atomic install and SIGHUP to a real `edge run`; a failure injected at each step leaves the installed artifact
and calibration set byte-identical."""

import contextlib
import glob
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys

import numpy as np
import pytest
import service_helpers as sh
import yaml

from edge.cli import rebuild
from edge.cli.main import main as edge_main
from edge.errors import EdgeError
from edge.model.calibration import import_calibration_set

from conftest import REPO, edge_here

ARTIFACT_FILES = ("engines/m.int8.onnx", "engines/m.int8.json", "engines/m.int8.labels.txt")
STEPS = ("capture", "calibrate", "fallback", "build", "gate", "latency", "install", "reload")


def sha(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def tree(root, sub):
    """{relative path: sha256} of every file under root/sub."""
    out = {}
    for path in sorted(glob.glob(os.path.join(str(root), sub, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            out[os.path.relpath(path, str(root))] = sha(path)
    return out


def write_varied_video(path, frames, size=(320, 240), seed=0):
    """Frames that differ from each other (coarse random colour blocks), so capture keeps them."""
    import cv2

    rng = np.random.default_rng(seed)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, size)
    for _ in range(frames):
        writer.write(cv2.resize(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), size))
    writer.release()


@pytest.fixture(scope="module")
def regression_set(tmp_path_factory):
    """Four images of the shipped regression set (a quick gate: each rebuild judges both models on every image)."""
    return sh.first_images(os.path.join(REPO, "calibration", "regression"), 4,
                           str(tmp_path_factory.mktemp("sets") / "regression"))


@pytest.fixture(scope="module")
def workspace(tiny_classifiers, tmp_path_factory):
    """The files every test's folder starts from, written once per module (each test gets its own copy)."""
    root = tmp_path_factory.mktemp("workspace")
    engines = root / "engines"
    engines.mkdir()
    stem = os.path.splitext(tiny_classifiers[0])[0]
    for ext in (".onnx", ".labels.txt", ".json"):
        shutil.copy(stem + ext, str(engines / ("m" + ext)))
        shutil.copy(stem + ext, str(engines / ("m.int8" + ext)))  # the old artifact: here the FP32 bytes
    write_varied_video(root / "camera.avi", 40)
    write_varied_video(root / "old-frames.avi", 30, seed=1)
    frames = root / "old-images"
    frames.mkdir()
    import cv2

    cap = cv2.VideoCapture(str(root / "old-frames.avi"))
    for i in range(8):
        cv2.imwrite(str(frames / "{}.png".format(i)), cap.read()[1])
    import_calibration_set(str(frames), str(root / "cal" / "current"), min_images=1, log=lambda *a: None)
    return root


@pytest.fixture
def ws(workspace, regression_set, tmp_path):
    """A device's folder: FP32 source, an installed (old) artifact, a calibration set, a camera clip, a config."""
    for name in os.listdir(str(workspace)):
        (shutil.copytree if (workspace / name).is_dir() else shutil.copy)(str(workspace / name), str(tmp_path / name))
    config = {"model": {"path": "engines/m.int8.onnx"},
              "source": {"uri": str(tmp_path / "camera.avi"), "width": 320, "height": 240},
              "runtime": {"budget_ms": 1000, "warmup": 2, "report_every": 100000},
              "backend": sh.QUIET_ORT,
              "build": {"calibration_dir": "cal/current", "regression_dir": regression_set, "engines_dir": "engines",
                        "min_images": 8, "method": "minmax"},
              "service": {"telemetry": {"enabled": False}, "metrics": {"enabled": True, "port": sh.free_port()}}}
    sh.write_config(tmp_path / "cfg.yaml", config)
    return tmp_path


def protected(ws):
    """What must survive a failed rebuild unchanged: the installed artifact and the calibration set."""
    state = {name: sha(str(ws / name)) for name in ARTIFACT_FILES}
    state.update(tree(ws, "cal"))
    return state


def leftovers(ws):
    return sorted(glob.glob(str(ws / "cal" / "*.rebuild-*")) + glob.glob(str(ws / "engines" / ".*.staged"))
                  + glob.glob(str(ws / "engines" / ".rebuild-*")) + glob.glob(str(ws / "cal" / "*.previous")))


def rebuild_cli(capsys, *args):
    rc = edge_main(["rebuild"] + [str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


CHEAP = ("--every", 5, "--capture-frames", 40, "--check-frames", 5, "--check-warmup", 1)  # 8 images: build.min_images


def test_dry_run_prints_the_plan_and_changes_nothing(ws, capsys, monkeypatch):
    monkeypatch.chdir(ws)
    before = tree(ws, "")
    rc, out, err = rebuild_cli(capsys, "--config", "cfg.yaml", "--no-reload", "--dry-run", *CHEAP)
    assert rc == 0, err
    lines = out.splitlines()
    assert "dry run" in lines[0]
    for number, name in enumerate(STEPS, 1):
        assert any(line.strip().startswith("{}. {}".format(number, name)) for line in lines), out
    assert str(ws / "cal" / "current.rebuild-") in out and str(ws / "camera.avi") in out
    assert "engines/m.int8.onnx" in out and "edge calibrate capture" in out
    assert "engines/m.int8.gate.json" in out and "engines/m.int8.latency.json" in out
    assert tree(ws, "") == before


def test_the_latency_step_measures_in_this_process(ws, capsys, monkeypatch):
    """The figures the installed model info records are those of edge check's run in the rebuild's own process (no
    `edge check` process whose JSON is read back): the candidate's stages, timed through the Runtime."""
    from edge.model import rebuild as steps

    measured = []

    def spy(cfg, options, **kw):
        report = real(cfg, options, **kw)
        measured.append((os.getpid(), cfg.model.path, report))
        return report

    started = []

    class Recorded(subprocess.Popen):  # what the check's system facts run (uname) is fine; an `edge` is not
        def __init__(self, args, *a, **kw):
            started.append(list(args) if isinstance(args, (list, tuple)) else [args])
            super().__init__(args, *a, **kw)

    real = steps.run_check
    monkeypatch.setattr(steps, "run_check", spy)
    monkeypatch.setattr(subprocess, "Popen", Recorded)
    monkeypatch.chdir(ws)
    rc, out, err = rebuild_cli(capsys, "--config", "cfg.yaml", "--no-reload", *CHEAP)
    assert rc == 0, out[-3000:] + err
    [(pid, model, report)] = measured
    assert pid == os.getpid() and os.path.basename(model) == "candidate.onnx"
    assert not [argv for argv in started if "edge" in " ".join(map(str, argv))], started
    recorded = json.loads((ws / "engines/m.int8.json").read_text(encoding="utf-8"))["latency"]
    end_to_end = report["stages_ms"]["end_to_end"]
    assert (recorded["p50_ms"], recorded["p99_ms"]) == (end_to_end["p50"], end_to_end["p99"])
    assert recorded["frames"] == report["frames"] == 5 and recorded["verdict"] == "pass"
    assert json.loads((ws / "engines/m.int8.latency.json").read_text(encoding="utf-8")) == report


def test_reload_target_is_checked_before_any_work(ws, capsys, monkeypatch):
    monkeypatch.chdir(ws)
    before = tree(ws, "")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        rc, _, err = rebuild_cli(capsys, "--config", "cfg.yaml", "--pid", sleeper.pid, *CHEAP)
        assert rc == 2 and "is not an `edge run` service" in err and "refusing" in err
    finally:
        sleeper.kill()
        sleeper.wait()
    rc, _, err = rebuild_cli(capsys, "--config", "cfg.yaml", "--pid", sleeper.pid, *CHEAP)
    assert rc == 2 and "no running process {}".format(sleeper.pid) in err
    rc, _, err = rebuild_cli(capsys, "--config", "cfg.yaml", *CHEAP)
    assert rc == 2 and "exactly one of --pid PID, --pidfile PATH, --systemd or --no-reload" in err
    assert tree(ws, "") == before


@contextlib.contextmanager
def daemon(ws, **model):
    """A real `edge run` on the workspace's config (`model` keys changed); yields (process, its stdout lines) once it
    serves."""
    cfg = yaml.safe_load((ws / "cfg.yaml").read_text(encoding="utf-8"))
    cfg["model"].update(model)
    # two frames a second (well within source.timeout_s) instead of 30: each costs CPU for as long as the rebuild
    # runs, and nothing asserted depends on the frame rate
    cfg["source"]["fps"] = 2
    sh.write_config(ws / "daemon.yaml", cfg)
    service = subprocess.Popen([sys.executable, "-m", "edge", "run", "--config", "daemon.yaml"], cwd=str(ws),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8", errors="replace")
    try:
        out = sh.JsonLines(service)
        out.wait_for("start", timeout=60)
        yield service, out
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()


def test_rebuild_installs_and_reloads_the_running_service(ws):
    old = {name: sha(str(ws / name)) for name in ARTIFACT_FILES}
    old_set = tree(ws, "cal/current")
    with daemon(ws) as (service, out):
        (ws / "edge.pid").write_text("{}\n".format(service.pid), encoding="utf-8")
        proc = subprocess.run([sys.executable, "-m", "edge", "rebuild", "--config", "cfg.yaml",
                               "--pidfile", "edge.pid"] + [str(a) for a in CHEAP], cwd=str(ws),
                              capture_output=True, encoding="utf-8", errors="replace", timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
        for number, name in enumerate(STEPS, 1):
            assert "rebuild: step {}/8 '{}' done".format(number, name) in proc.stdout
        new_sha = sha(str(ws / "engines/m.int8.onnx"))
        # done only when the service's own metrics counted the reload and named the installed bytes
        assert "reload: kill -HUP {} (from edge.pid) confirmed: the service serves engines/m.int8.onnx (sha256 {})" \
            .format(service.pid, new_sha[:12]) in proc.stdout
        assert new_sha != old["engines/m.int8.onnx"]
        assert sha(str(ws / "engines/previous/m.int8.onnx")) == old["engines/m.int8.onnx"]  # kept for rollback
        manifest = json.loads((ws / "engines/m.int8.json").read_text(encoding="utf-8"))
        assert manifest["sha256"] == new_sha and manifest["precision"] == "int8" and manifest["format"] == "onnx-qdq"
        assert manifest["latency"]["verdict"] == "pass" and manifest["latency"]["p99_ms"] <= 1000
        # no absolute path in the model info: names relative to the engines folder
        assert manifest["gate"]["report"] == "m.int8.gate.json" and manifest["latency"]["report"] == \
            "m.int8.latency.json"
        assert manifest["source"]["path"] == "m.onnx" and manifest["calibration"]["set"] == "../cal/current"
        assert str(ws) not in json.dumps(manifest)
        # the captured set now is build.calibration_dir, the old one kept beside it
        captured = json.loads((ws / "cal/current/manifest.json").read_text(encoding="utf-8"))
        assert captured["source"] == str(ws / "camera.avi") and captured["count"] == 8
        assert manifest["calibration"]["sha256"] == captured["sha256"]
        assert {k.replace("cal/current.previous", "cal/current"): v for k, v in tree(ws, "cal/current.previous")
                .items()} == old_set
        assert not glob.glob(str(ws / "cal" / "*.rebuild-*")) and not glob.glob(str(ws / "engines" / ".*staged"))

        reload = out.wait_for("reload", timeout=30)  # the service's own line agrees
        assert reload["sha256"] == new_sha and reload["precision"] == "int8-qdq"
        service.send_signal(signal.SIGTERM)
        report = out.wait_for("report", timeout=30)
        assert report["reloads"] == {"ok": 1, "failed": 0}
        assert service.wait(30) == 0


def _fake_systemctl(bin_dir):
    bin_dir.mkdir()
    path = bin_dir / "systemctl"
    path.write_text('#!/bin/sh\ncase "$1" in\n  is-active) exit 0 ;;\n'
                    '  reload) echo "Job for $2.service failed because the control process exited." >&2; exit 1 ;;\n'
                    'esac\nexit 3\n', encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("step,why", [
    ("capture", "unreadable source"),
    ("capture", "too few images"),
    ("gate", "impossible thresholds"),
    ("latency", "impossible budget"),
    ("reload", "systemctl reload fails after the install"),
    ("reload", "the service reports its reload failed"),
    ("reload", "the service serves another model"),
])
def test_a_failing_step_keeps_the_old_artifact(step, why, ws, capsys, monkeypatch):
    monkeypatch.chdir(ws)
    args = ["--config", "cfg.yaml", "--no-reload"] + list(CHEAP)
    service = contextlib.ExitStack()
    if why == "unreadable source":
        (ws / "broken.avi").write_text("not a video\n", encoding="utf-8")
        args += ["--source", ws / "broken.avi", "--check-source", "synthetic"]
    elif why == "too few images":
        write_varied_video(ws / "short.avi", 5)
        args += ["--source", ws / "short.avi", "--every", 1, "--check-source", "synthetic"]
    elif why == "impossible thresholds":
        info = json.loads((ws / "engines/m.json").read_text(encoding="utf-8"))
        info["trained"] = True  # the gate is enforced for trained weights only (edge.model.steps)
        (ws / "engines/m.json").write_text(json.dumps(info), encoding="utf-8")
        cfg = yaml.safe_load((ws / "cfg.yaml").read_text(encoding="utf-8"))
        cfg["build"]["gate"] = {"min_agreement": 1.0, "min_mean_cosine": 1.0}
        cfg["build"]["max_float_layers"] = 0  # the float-layer search is tests/test_fallback.py's
        sh.write_config(ws / "cfg.yaml", cfg)
    elif why == "impossible budget":
        args += ["--budget-ms", 0.001]
    elif why == "the service reports its reload failed":  # its labels file is gone when it reloads
        shutil.copy(str(ws / "engines/m.int8.labels.txt"), str(ws / "gone.labels.txt"))
        proc, _ = service.enter_context(daemon(ws, labels="gone.labels.txt"))
        os.unlink(str(ws / "gone.labels.txt"))
        args = [a for a in args if a != "--no-reload"] + ["--pid", proc.pid]
    elif why == "the service serves another model":  # its model.path is not what the rebuild installs
        for ext in (".onnx", ".json", ".labels.txt"):
            shutil.copy(str(ws / ("engines/m.int8" + ext)), str(ws / ("engines/other" + ext)))
        proc, _ = service.enter_context(daemon(ws, path="engines/other.onnx"))
        args = [a for a in args if a != "--no-reload"] + ["--pid", proc.pid]
    else:
        _fake_systemctl(ws / "bin")
        monkeypatch.setenv("PATH", "{}:{}".format(ws / "bin", os.environ["PATH"]))
        args = [a for a in args if a != "--no-reload"] + ["--systemd"]
    before = protected(ws)
    with service:
        rc, out, err = rebuild_cli(capsys, *args)
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edge rebuild: error: rebuild failed at step '{}': ".format(step)), \
        err
    assert lines[0].endswith("engines/m.int8.onnx unchanged"), lines[0]
    assert protected(ws) == before  # byte-identical artifact, manifest, labels and calibration set
    assert leftovers(ws) == []
    if step == "reload":
        assert "previous artifact restored, calibration set restored" in lines[0]
        assert "install: engines/m.int8.onnx" in out  # it had been installed, then rolled back
    if why == "the service reports its reload failed":
        assert "reported its reload failed" in lines[0]
    if why == "the service serves another model":
        assert "the service reloaded but serves sha256" in lines[0]
    if step == "gate":
        assert "accuracy gate failed" in lines[0]
    if step == "latency":
        assert "> budget 0.001 ms" in lines[0]
    later = STEPS[STEPS.index(step) + 1:]
    assert not any("'{}' done".format(name) in out for name in later)


def test_only_a_real_edge_run_process_is_signalled(ws, capsys, monkeypatch):
    """`--pid` of anything but an `edge run` process is refused before any work, the process left alone."""
    monkeypatch.chdir(ws)
    for argv in (["edge", "run"], ["/opt/venv/bin/edge", "run", "--config", "c.yaml"],
                 ["/usr/bin/python3.8", "-m", "edge", "run"], ["python3", "-u", "/v/bin/edge", "run"]):
        assert rebuild.is_edge_run(argv), argv
    impostors = ([sys.executable, "-c", "import time; time.sleep(60)", "edge", "run"],
                 ["sh", "-c", "sleep 60; echo edge run", "edge"],
                 [sys.executable, "-c", "import time; time.sleep(60)", "-m", "edge", "run"],
                 [sys.executable, "-m", "edge", "check", "--source", "synthetic", "--frames", "100000", "--json", "",
                  "--plot", ""])
    before = tree(ws, "")
    held = 0
    for argv in impostors:
        victim = subprocess.Popen(argv, cwd=str(ws), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            rc, out, err = rebuild_cli(capsys, "--config", "cfg.yaml", "--pid", victim.pid, *CHEAP)
            assert rc == 2 and "is not an `edge run` service" in err and len(err.strip().splitlines()) == 1, err
            assert victim.poll() is None  # not signalled
            held += 1
        finally:
            victim.kill()
            victim.wait()
    assert held == len(impostors) and tree(ws, "") == before


def test_a_previous_set_the_rebuild_did_not_write_is_never_removed(ws, capsys, monkeypatch):
    """calibration/<set>.previous holding anything but a set this tool wrote stops the rebuild before any work."""
    monkeypatch.chdir(ws)
    previous = ws / "cal" / "current.previous"
    plants = ("a user's file", "a user's folder", "a symlink to the user's folder", "a file in its place")
    held = 0
    for plant in plants:
        shutil.rmtree(str(previous), ignore_errors=True) if previous.is_dir() and not previous.is_symlink() else \
            os.unlink(str(previous)) if os.path.lexists(str(previous)) else None
        mine = ws / "mine"
        shutil.rmtree(str(mine), ignore_errors=True)
        mine.mkdir()
        (mine / "notes.txt").write_text("keep me", encoding="utf-8")
        if plant == "a symlink to the user's folder":
            os.symlink(str(mine), str(previous))
        elif plant == "a file in its place":
            previous.write_text("keep me", encoding="utf-8")
        else:
            import_calibration_set(str(ws / "old-images"), str(previous), min_images=1, log=lambda *a: None)
            if plant == "a user's file":
                (previous / "notes.txt").write_text("keep me", encoding="utf-8")
            else:
                (previous / "sub").mkdir()
                (previous / "sub" / "notes.txt").write_text("keep me", encoding="utf-8")
        before = tree(ws, "")
        rc, out, err = rebuild_cli(capsys, "--config", "cfg.yaml", "--no-reload", *CHEAP)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "current.previous" in err, (plant, err)
        assert "refusing" in err and "step 1/8" not in out, (plant, err)
        assert tree(ws, "") == before and (mine / "notes.txt").read_text(encoding="utf-8") == "keep me", plant
        held += 1
    assert held == len(plants)


def test_ctrl_c_at_the_very_end_completes_the_install_and_leaves_no_work_folder(ws, capsys, monkeypatch):
    """Ctrl-C during the last step (issue 10 item 14): the install stands, no 'interrupted', nothing left over."""
    monkeypatch.chdir(ws)
    monkeypatch.setattr(rebuild, "step_reload", lambda *a: os.kill(os.getpid(), signal.SIGINT))
    before = sha(str(ws / "engines/m.int8.onnx"))
    rc, out, err = rebuild_cli(capsys, "--config", "cfg.yaml", "--no-reload", *CHEAP)
    assert rc == 0 and "interrupted" not in err, err
    assert "rebuild: step 8/8 'reload' done" in out and "it was completed" in out
    assert sha(str(ws / "engines/m.int8.onnx")) != before
    assert leftovers(ws) == [str(ws / "cal" / "current.previous")]  # the previous set is kept by design


def test_edge_rebuild_is_registered_and_the_script_calls_it(tmp_path):
    proc = edge_here("rebuild", "--help")  # the CLI's registration; the script below starts it as a process
    assert proc.returncode == 0, proc.stderr
    assert "--dry-run" in proc.stdout and "--pidfile" in proc.stdout
    script = subprocess.run([os.path.join(REPO, "scripts", "rebuild_calibration.sh"), "--help"], capture_output=True,
                            encoding="utf-8", errors="replace", timeout=60, cwd=str(tmp_path))
    assert script.returncode == 0 and "--systemd" in script.stdout, script.stderr


def test_a_pidfile_of_non_ascii_digits_is_one_line_not_a_traceback(tmp_path):
    """'²'.isdigit() is true and int('²') fails: a process id is ASCII digits only."""
    pidfile = tmp_path / "edge.pid"
    pidfile.write_text("\u00b2\n", encoding="utf-8")
    with pytest.raises(EdgeError, match="pidfile must hold a process id"):
        rebuild._pid_target(None, str(pidfile))
