"""A dead live source gives every frame-loop command the same one-line error and exit 2 (the one loop)."""

import subprocess
import sys

from conftest import assert_refused

DEAD = "rtsp://127.0.0.1:9/x"  # nothing listens on the discard port


def test_run_check_and_demo_refuse_a_dead_stream_in_one_line(small_model, tmp_path):
    commands = (["run"], ["check", "--json", "", "--plot", ""], ["demo", "--headless", "--port", "0"])
    procs = [subprocess.Popen([sys.executable, "-m", "edge"] + argv + ["--source", DEAD, "--model", small_model],
                              cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True) for argv in commands]  # side by side: ~10 s in all
    for argv, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=120)
        line = assert_refused(subprocess.CompletedProcess(argv, proc.returncode, out, err), "cannot open source")
        assert line.startswith("edge {}: error: {}: no frame within".format(argv[0], DEAD)), line
