"""Files a test run makes once and its pytest-xdist workers share (and the background maker conftest starts)."""

import fcntl
import os
import shutil


def _locked(folder):
    """`folder`.lock, open and held (closing it lets go)."""
    lock = open(folder + ".lock", "w", encoding="utf-8")
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def _make_unless_done(folder, make):
    done = os.path.join(folder, ".done")
    if not os.path.exists(done):
        shutil.rmtree(folder, ignore_errors=True)
        os.mkdir(folder)
        make(folder)
        open(done, "w", encoding="utf-8").close()


def make_once(folder, make):
    """`make(folder)` unless a complete `folder` exists: whoever holds `folder`.lock makes it, the others wait and
    use the same files. What a maker that died left is removed first."""
    with _locked(folder):
        _make_unless_done(folder, make)
    return folder


def make_in_order(jobs):
    """make_once for each (folder, make) of `jobs`, in order, holding all their locks from the start: nobody else
    starts one of them meanwhile. Each lock is let go as soon as its folder is complete."""
    locks = []
    try:
        for folder, _ in jobs:
            locks.append(_locked(folder))
        for lock, (folder, make) in zip(locks, jobs):
            _make_unless_done(folder, make)
            lock.close()
    finally:
        for lock in locks:
            lock.close()
