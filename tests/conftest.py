"""Shared fixtures: a real exported MobileNetV3, tiny exported classifiers, a trained digits model, real video files
written with OpenCV; the run's file order; helpers for refusals, the CLI and images (service helpers:
tests/service_helpers.py)."""

import contextlib
import fcntl
import io
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import shared_models as sm

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# torch's OpenMP threads spin-wait for each other, which on a loaded 2-core machine makes one MobileNetV3 forward
# pass 40x slower (1.3 s against 0.03 s); every worker, CLI subprocess and the models maker inherits this
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def small_model(tmp_path_factory):
    """MobileNetV3-Small with seeded random weights, exported by the real `edge export` code."""
    return os.path.join(once_per_run(tmp_path_factory, sm.SMALL, sm.make_small_model), sm.SMALL_NAME)


@pytest.fixture(scope="session")
def tiny_classifiers(tmp_path_factory):
    """Two 10-class classifiers of two strided convolutions (random weights, seeds 0 and 1), exported by the real
    `edge export` code, for tests whose subject is not the network (shared_models.make_tiny_classifiers)."""
    return sm.tiny_paths(once_per_run(tmp_path_factory, sm.TINY, sm.make_tiny_classifiers))


@pytest.fixture(scope="session")
def dynamic_model(tmp_path_factory):
    """A tiny 10-class classifier exported with a dynamic batch axis (`edge export --batch dynamic`) by the real
    export code: several cameras on one engine."""
    import torch

    from edge.model.export import export_onnx

    torch.manual_seed(0)
    # a middle Conv: the build keeps the first Conv and the classifier in float, and quantises what lies between
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
    path = str(tmp_path_factory.mktemp("dynamic") / "tiny_dynamic.onnx")
    info = export_onnx(net.eval(), path, [str(i) for i in range(10)], "random(seed=0)", False, "tiny",
                       log=lambda *a: None, batch="dynamic")
    assert info["batch"] == "dynamic" and info["input"]["shape"][0] == "batch"
    return path


def run_folder(tmp_path_factory):
    """This test run's temporary folder, shared by its pytest-xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory, name, make):
    """The folder `name` in the run's shared folder, made by `make(folder)` once per run (made_once.make_once)."""
    from made_once import make_once

    return make_once(str(run_folder(tmp_path_factory) / name), make)


# The files that take longest, longest first (the sum of each file's test times in a quiet run on 2 cores; the
# fleet files mostly wait on bakes and servers). pytest-xdist hands each worker a whole file, in this order
# (pytest.ini keeps it from reordering): started first, their waits overlap the others' work and no long file is
# left running alone at the end. Only the order depends on this; a name here that is no test file stops the run
# (pytest_configure).
LONGEST = ("test_rehearsal.py", "test_fleet_releases.py", "test_fleet_deploy.py", "test_fleet_prometheus.py",
           "test_crash_sets.py", "test_hostile.py", "test_real_weights.py", "test_sweep.py", "test_gstreamer.py",
           "test_fleet_statedir.py", "test_export.py", "test_daemon.py", "test_cli_run.py", "test_telemetry.py",
           "test_build.py", "test_check.py", "test_typecheck.py", "test_rebuild.py", "test_notify.py",
           "test_calibration.py", "test_demo.py", "test_static.py", "test_artifact.py", "test_fallback.py",
           "test_auto_method.py", "test_quantize.py", "test_gate.py")


def schedule_problems(names, folder=HERE):
    """What is wrong with a hand-kept list of test files like LONGEST: a name listed twice, or one that is no file
    in `folder` (renamed or removed: it would silently fall out of the schedule)."""
    twice = sorted({name for name in names if names.count(name) > 1})
    return (["{} is listed twice".format(name) for name in twice]
            + ["{} is no file in {}".format(name, folder) for name in names
               if not os.path.isfile(os.path.join(folder, name))])


def pytest_configure(config):
    problems = schedule_problems(LONGEST)
    if problems:
        raise pytest.UsageError("tests/conftest.py LONGEST: " + "; ".join(problems))


# fixture -> its folder in the run's shared folder, in the order the background maker makes them
SHARED = (("small_model", sm.SMALL), ("tiny_classifiers", sm.TINY), ("digits", sm.DIGITS),
          ("digits_qdq", sm.DIGITS_QDQ))


def pytest_collection_modifyitems(session, config, items):
    """A background process starts making the shared models the collected tests need now (shared_models), one per
    run (the first worker to get here starts it). Files start longest first (LONGEST), and those that need the
    trained digits model after all the others: under load it is ready about two thirds into the run, about when
    those files start."""
    def file_of(item):
        return item.nodeid.split("::")[0]

    needing = {file_of(item) for item in items if "digits" in getattr(item, "fixturenames", ())}

    def rank(name):
        base = os.path.basename(name)
        return name in needing, LONGEST.index(base) if base in LONGEST else len(LONGEST)

    files = list(dict.fromkeys(file_of(item) for item in items))
    order = {name: i for i, name in enumerate(sorted(files, key=rank))}  # stable: the rest keep their order
    items[:] = sorted(items, key=lambda item: order[file_of(item)])  # each file's tests keep their order
    used = {name for item in items for name in getattr(item, "fixturenames", ())}
    wanted = [folder for fixture, folder in SHARED if fixture in used]
    if not wanted:
        return
    run = run_folder(config._tmp_path_factory)
    try:
        os.close(os.open(str(run / "models.started"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    config.models_maker = subprocess.Popen([sys.executable, os.path.join(HERE, "shared_models.py"), str(run)] + wanted,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_sessionfinish(session):
    maker = getattr(session.config, "models_maker", None)
    if maker is not None and maker.poll() is None:  # not needed after all (a failed or interrupted run)
        maker.kill()
        maker.wait()


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """A MobileNetV3-Small trained on scikit-learn's digits (tests/trained_model.py), exported with its sets."""
    from trained_model import load_digits_model

    return load_digits_model(once_per_run(tmp_path_factory, sm.DIGITS, sm.make_digits))


@pytest.fixture(scope="session")
def digits_qdq(digits, tmp_path_factory):
    """The digits model as a sound TensorRT-style Q/DQ model (minmax, sensitive nodes in float)."""
    folder = once_per_run(tmp_path_factory, sm.DIGITS_QDQ, sm.make_digits_qdq(str(run_folder(tmp_path_factory))))
    return os.path.join(folder, sm.QDQ_NAME)


def write_video(path, frames=30, size=(320, 240), fps=30.0):
    """An MJPG AVI with a moving bright square; returns the frames written (BGR)."""
    import cv2

    w, h = size
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (w, h))
    assert writer.isOpened(), "OpenCV cannot write MJPG here"
    written = []
    for i in range(frames):
        img = np.full((h, w, 3), 40, np.uint8)
        x = (i * 7) % (w - 20)
        img[20:40, x:x + 20] = (0, 200, 255)
        writer.write(img)
        written.append(img)
    writer.release()
    return written


def colour_pixels(image, bgr, tol=30):
    """How many pixels of a BGR image are within `tol` of the colour `bgr` in every channel."""
    return int(np.all(np.abs(image.astype(int) - np.array(bgr)) <= tol, axis=2).sum())


@pytest.fixture
def video_file(tmp_path):
    path = tmp_path / "clip.avi"
    write_video(path)
    return str(path)


def assert_refused(proc, *names, code=2):
    """A refusal as users must see it: exit `code`, one bounded line on stderr naming each of `names`, no
    traceback. Returns that line."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines[0]) < 400, lines[0]  # bounded, whatever the input
    for name in names:
        assert str(name) in lines[0], lines[0]
    return lines[0]


def edge_here(*args):
    """The CLI run in this process (edge.cli.main.main) for a command refused before it starts work: what
    `run_edge` gives, without starting an interpreter (a traceback is an exception here: the test fails)."""
    from edge.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def run_edge(*args, timeout=120, env=None):
    """Run the real CLI in a subprocess (as a user would)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "edge"] + [str(a) for a in args], capture_output=True,
                          encoding="utf-8", errors="replace", timeout=timeout, cwd=REPO, env=full_env)


NOBODY = 65534


def as_nobody(act, warm):
    """`act()`'s JSON-able result, computed in a forked child that dropped to nobody (uid and gid 65534, no groups).

    The interpreter and the checkout may lie in folders nobody cannot enter (a venv under a 0700 home, a clone in a
    `mktemp -d` folder): nothing may be imported after the drop. The child runs `warm()` as root first (the same
    work as `act`, plus what only `act`'s permission errors import) and fails the test naming any module `act` still
    imported after the drop, on any machine, whether or not that import happened to work here."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to the user nobody")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest (no teardown, no second report)
        try:
            os.close(read_fd)
            warm()
            before = set(sys.modules)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            answer = {"result": act(), "late": sorted(set(sys.modules) - before)}
        except BaseException as exc:  # reported to the parent, which fails the test with it
            import traceback

            answer = {"error": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))}
        with os.fdopen(write_fd, "w") as out:
            json.dump(answer, out)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as reply:
        text = reply.read()
    os.waitpid(pid, 0)
    answer = json.loads(text)
    assert "error" not in answer, answer.get("error")
    assert not answer["late"], ("imported after dropping to nobody: {} (import them in warm(): an interpreter or "
                                "checkout nobody cannot read fails there)".format(", ".join(answer["late"])))
    return answer["result"]


@contextlib.contextmanager
def jtop_turn():
    """A machine has one jtop socket (/run/jtop.sock): pytest-xdist workers that start a jtop service, or need none
    running, take turns; each looks for a socket only in its turn (another worker's service is no real one)."""
    with open(os.path.join(tempfile.gettempdir(), "jetson-edge-tests-jtop.lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def no_jtop_service():
    """No jtop service runs while the test does (with a real one on this machine, the test is skipped)."""
    import service_jtop as sj

    with jtop_turn():
        if os.path.exists(sj.SOCKET):
            pytest.skip("{} exists here; the 'no service' path cannot be tested".format(sj.SOCKET))
        yield


@pytest.fixture(scope="module")
def jtop_service():
    """jetson-stats' real jtop service in its testing mode (fake sysfs, private mount namespace, as root)."""
    import service_jtop as sj

    with jtop_turn():
        why = sj.unavailable()
        if why:
            pytest.skip("real jtop service not runnable here: " + why)
        service = sj.JtopService()
        try:
            service.setup()
            service.start()
            yield service
        finally:
            service.cleanup()
    assert not os.path.exists(sj.SOCKET)


NO_DEVICE = "cuInit failed: no CUDA-capable device is detected"


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without a CUDA device, whatever this one has. A subprocess gets `CUDA_VISIBLE_DEVICES=` (empty),
    which hides every device from the real driver (on a Jetson too); in this process `pycuda` and `pycuda.driver`
    are a stand-in whose init fails as the real one's does where the driver sees no device."""
    import importlib.machinery
    import types

    class NoDeviceError(Exception):  # pycuda._driver.Error's place
        pass

    def init(flags=0):
        raise NoDeviceError(NO_DEVICE)

    package, driver = types.ModuleType("pycuda"), types.ModuleType("pycuda.driver")
    for module in (package, driver):
        module.__file__ = os.path.join(HERE, "conftest.py")
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    package.__path__ = []
    driver.init, driver.Error = init, NoDeviceError
    driver.Device = types.SimpleNamespace(count=lambda: init())
    package.driver = driver
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
