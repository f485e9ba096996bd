"""A signal in the middle of a command that writes (issue 19 item 7): SIGTERM or SIGHUP while `edge calibrate
import` or `edge build` is working leaves no temporary file or folder, keeps what was there, and ends with one
line and 128 + the signal (the CLI turns both into an exception, so every cleanup runs)."""

import ast
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import cv2
import numpy as np
import pytest
import service_helpers as sh

from edge import interrupts
from edge.model.calibration import load_calibration_set

from conftest import REPO

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def hidden(folder):
    """Every dot-named file or folder under `folder`: where the commands keep their temporary work."""
    return sorted(os.path.join(root, n) for root, dirs, files in os.walk(str(folder)) for n in dirs + files
                  if n.startswith("."))


def signalled_midway(args, cwd, appears, sig):
    """Start `edge ARGS`, wait until `appears()` (its temporary work exists), send `sig`; (returncode, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "edge"] + [str(a) for a in args], cwd=str(cwd),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8", errors="replace")
    try:
        assert sh.wait_until(lambda: appears() or proc.poll() is not None, timeout=300)
        assert proc.poll() is None, "finished before its temporary work was seen: " + proc.stderr.read()[-2000:]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def test_a_signal_during_calibrate_import_leaves_no_temporary_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    cv2.imwrite(str(src / "p0.jpg"), rng.integers(0, 256, (1500, 2000, 3), dtype=np.uint8))
    for i in range(1, 60):  # big images, slow to decode: the import is still working when the signal comes
        os.link(str(src / "p0.jpg"), str(src / "p{}.jpg".format(i)))
    out = tmp_path / "sets" / "set"
    small = tmp_path / "small"
    shutil.copytree(str(src), str(small), ignore=lambda d, names: names[2:])
    held = 0
    for sig in SIGNALS:
        subprocess.run([sys.executable, "-m", "edge", "calibrate", "import", str(small), str(out), "--min-images", "1"],
                       cwd=REPO, check=True, capture_output=True)
        before = load_calibration_set(str(out)).sha256
        rc, err = signalled_midway(["calibrate", "import", src, out, "--min-images", 1], REPO,
                                   lambda: bool(hidden(out.parent)), sig)
        assert rc == 128 + sig and err.strip().splitlines() == [
            "edge calibrate: terminated by {}".format(signal.Signals(sig).name)], err
        assert hidden(out.parent) == [] and load_calibration_set(str(out)).sha256 == before
        held += 1
    assert held == len(SIGNALS)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_during_build_leaves_no_staged_or_quantize_debris(small_model, tmp_path, sig):
    engines = tmp_path / "engines"
    sh.copy_model(small_model, engines, "m")
    config = sh.write_config(tmp_path / "cfg.yaml", {
        "model": {"path": str(engines / "m.int8.onnx")},
        "build": {"engines_dir": str(engines), "calibration_dir": os.path.join(REPO, "calibration", "default"),
                  "regression_dir": os.path.join(REPO, "calibration", "regression"), "method": "minmax"}})
    before = sorted(os.listdir(str(engines)))
    started = time.monotonic()
    rc, err = signalled_midway(["build", "--config", config, "--no-progress"], tmp_path,
                               lambda: bool(hidden(engines)), sig)
    assert rc != 0 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "interrupted" in err or "terminated" in err, err
    assert hidden(engines) == [] and sorted(os.listdir(str(engines))) == before, time.monotonic() - started


CREATED_THEN_SIGNALLED = textwrap.dedent("""
    import os, signal, sys
    from edge.cli.common import execute
    from edge.store.fileio import atomic_dir, atomic_write
    folder, which = sys.argv[1:3]
    woke, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)  # written once the signal has arrived
    def then_signalled(real):  # SIGTERM right after a temporary (dot-named) file or folder is created
        def call(path, *args, **kwargs):
            out = real(path, *args, **kwargs)
            if os.path.basename(path).startswith("."):
                os.kill(os.getpid(), signal.SIGTERM)
                os.read(woke, 1)
            return out
        return call
    def command(args):
        if which == "folder":
            os.mkdir = then_signalled(os.mkdir)
            with atomic_dir(os.path.join(folder, "set"), "manifest.json", "set"):
                pass
        else:
            os.open = then_signalled(os.open)
            atomic_write(os.path.join(folder, "file"), lambda fh: fh.write(b"x"))
        return 0
    sys.exit(execute("write", command, None))
""")


@pytest.mark.parametrize("which", ["folder", "file"])
def test_a_signal_right_after_a_temporary_is_created_leaves_nothing(tmp_path, which):
    """The gap between creating a temporary and recording its name (tempfile's mkdtemp/mkstemp have one)."""
    proc = subprocess.run([sys.executable, "-c", CREATED_THEN_SIGNALLED, str(tmp_path), which],
                          cwd=REPO, capture_output=True, encoding="utf-8", errors="replace", timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and proc.stderr == "write: terminated by SIGTERM\n", proc.stderr
    assert os.listdir(str(tmp_path)) == []


def test_only_edge_interrupts_sets_signal_handlers():
    """One owner of who answers which signal: every other module enters a phase of edge/interrupts.py."""
    calls = {"signal", "getsignal", "pthread_sigmask", "set_wakeup_fd", "siginterrupt"}
    found = []
    for root, _, files in os.walk(os.path.join(REPO, "edge")):
        for name in files:
            path = os.path.join(root, name)
            if not name.endswith(".py") or path == os.path.join(REPO, "edge", "interrupts.py"):
                continue
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                handler_call = (isinstance(node, ast.Attribute) and node.attr in calls
                                and isinstance(node.value, ast.Name) and node.value.id == "signal")
                if handler_call or (isinstance(node, ast.ImportFrom) and node.module == "signal"):
                    found.append("{}:{}".format(os.path.relpath(path, REPO), node.lineno))
    assert found == []


def test_every_phase_says_what_each_signal_does():
    actions = {interrupts.RAISE, interrupts.IGNORE, interrupts.STOP, interrupts.RELOAD, interrupts.HOLD}
    for name, row in interrupts.PHASES.items():
        assert set(row) == set(interrupts.SIGNALS) and set(row.values()) <= actions, name
    with pytest.raises(TypeError, match="stop"):  # the owner of a phase that stops must say how
        interrupts.Phase("serving", reload=lambda signum: None)


def test_a_held_signal_waits_for_the_end_of_its_phase_and_is_handed_to_its_owner():
    before = [signal.getsignal(s) for s in interrupts.SIGNALS]
    with interrupts.Phase("command"):
        with interrupts.Phase("installing") as installing:
            os.kill(os.getpid(), signal.SIGTERM)
            assert sh.wait_until(lambda: installing.held, 30)
        assert installing.held == [signal.SIGTERM]
        with pytest.raises(interrupts.Terminated):  # after the hold, the command's own answer again
            os.kill(os.getpid(), signal.SIGTERM)
            sh.wait_until(lambda: False, 30)
    assert [signal.getsignal(s) for s in interrupts.SIGNALS] == before


def test_a_ctrl_c_the_process_was_started_to_ignore_stays_ignored_in_every_phase():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's
    try:
        for name in interrupts.PHASES:
            owner = {a: (lambda signum: None) for a in (interrupts.STOP, interrupts.RELOAD)
                     if a in interrupts.PHASES[name].values()}
            with interrupts.Phase(name, **owner):
                assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN, name
    finally:
        signal.signal(signal.SIGINT, previous)
