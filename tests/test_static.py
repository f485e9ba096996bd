"""Static checks CI runs with the tests: Python 3.8 compatibility (no 3.8 interpreter here) and lint."""

import os
import subprocess
import sys

from conftest import REPO


def test_source_is_python38_compatible():
    vermin = os.path.join(os.path.dirname(sys.executable), "vermin")
    proc = subprocess.run([vermin, "--target=3.8-", "--violations", "--no-tips", "--eval-annotations",
                           "edge", "scripts", "benchmarks"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "edge", "tests", "scripts", "benchmarks"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
