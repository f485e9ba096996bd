"""A dead live source gives every frame-loop command the same one-line error and exit 2 (the one loop)."""

import subprocess
import sys

DEAD = "rtsp://127.0.0.1:9/x"  # nothing listens on the discard port


def test_run_check_and_demo_refuse_a_dead_stream_in_one_line(small_model, tmp_path):
    commands = (["run"], ["check", "--json", "", "--plot", ""], ["demo", "--headless", "--port", "0"])
    procs = [subprocess.Popen([sys.executable, "-m", "edge"] + argv + ["--source", DEAD, "--model", small_model],
                              cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True) for argv in commands]  # side by side: ~10 s in all
    for argv, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=120)
        lines = err.strip().splitlines()
        assert proc.returncode == 2, (argv, err)
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)
        assert lines[0].startswith("edge {}: error: {}: no frame within".format(argv[0], DEAD)), lines
        assert "cannot open source" in lines[0]
