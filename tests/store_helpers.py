"""Helpers of the tests of what the store writes (tests/test_versions.py, test_artifact.py, test_crash_sets.py,
test_fleet_releases.py): a folder's whole state, to assert that nothing changed, what a writer left behind, and the
real CLI killed at chosen moments (tests/crash_driver.py)."""

import hashlib
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RANDOM_POINTS = 2  # seeded random steps of any kind, on top of one kill after each rename


def state_of(folder):
    """{relative path: a file's sha256, 'link -> target' or 'folder'} of everything under `folder`, dot files too;
    links are read, never followed."""
    out = {}
    for root, dirs, files in os.walk(str(folder)):
        for name in files + dirs:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, str(folder))
            if os.path.islink(path):
                out[rel] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                out[rel] = "folder"
            else:
                with open(path, "rb") as fh:
                    out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return out


def debris(folder):
    """What a writer leaves only while it runs: dot names (staged files, work folders, the lock) and `.swap`s."""
    return sorted(rel for rel in state_of(folder) if os.path.basename(rel).startswith(".") or rel.endswith(".swap"))


def killed(k, kind, *argv, env=None):
    """The CLI run by crash_driver, killed after step `k` (0: not killed): (returncode, steps it took)."""
    command = [sys.executable, os.path.join(HERE, "crash_driver.py"), str(k), kind] + [str(a) for a in argv]
    proc = subprocess.run(command, capture_output=True, encoding="utf-8", errors="replace", cwd=os.path.dirname(HERE),
                          timeout=300, env=dict(os.environ, **(env or {})))
    steps = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("crash_driver:")]
    assert proc.returncode == -9 or (k == 0 and proc.returncode in (0, 1)), proc.stderr[-2000:]
    return proc.returncode, (steps[0] if steps else None)


def kill_points(name, *argv, env=None, prepare=lambda: None):
    """[(kind, k)]: after each rename the command makes, and RANDOM_POINTS seeded steps of any kind (counted on
    runs from the state `prepare()` sets up, as each kill starts from)."""
    prepare()
    _, renames = killed(0, "rename", *argv, env=env)
    prepare()
    _, steps = killed(0, "any", *argv, env=env)
    rng = random.Random(name)
    return [("rename", k) for k in range(1, renames + 1)] + [("any", rng.randint(1, steps))
                                                            for _ in range(RANDOM_POINTS)]
