"""A dead live source gives every frame-loop command the same one-line error and exit 2 (the one loop)."""

import subprocess
import sys

import service_helpers as sh

from conftest import assert_refused

DEAD = "rtsp://127.0.0.1:9/x"  # nothing listens on the discard port
START_TIMEOUT_S = 2.0  # source.start_timeout_s: a dead source is refused after this (10 s by default)


def test_run_check_and_demo_refuse_a_dead_stream_in_one_line(small_model, tmp_path):
    commands = (["run"], ["check", "--json", "", "--plot", ""], ["demo", "--headless", "--port", "0"])
    config = sh.write_config(tmp_path / "edge.yaml", {"source": {"start_timeout_s": START_TIMEOUT_S}})
    procs = [subprocess.Popen([sys.executable, "-m", "edge"] + argv + ["--config", config, "--source", DEAD,
                                                                       "--model", small_model],
                              cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              encoding="utf-8", errors="replace") for argv in commands]  # side by side
    for argv, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=120)
        line = assert_refused(subprocess.CompletedProcess(argv, proc.returncode, out, err), "cannot open source")
        assert line.startswith("edge {}: error: {}: no frame within {:g} s of start".format(
            argv[0], DEAD, START_TIMEOUT_S)), line
