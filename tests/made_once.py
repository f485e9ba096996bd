"""Files a test run makes once and its pytest-xdist workers share (and the background maker conftest starts)."""

import fcntl
import os
import shutil


def make_once(folder, make):
    """`make(folder)` unless a complete `folder` exists: whoever holds `folder`.lock makes it, the others wait and
    use the same files. What a maker that died left is removed first."""
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = os.path.join(folder, ".done")
        if not os.path.exists(done):
            shutil.rmtree(folder, ignore_errors=True)
            os.mkdir(folder)
            make(folder)
            open(done, "w").close()
    return folder
