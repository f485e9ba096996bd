"""Helpers of the tests of what the store writes (tests/test_versions.py, test_artifacts.py, test_crash_sets.py):
a folder's whole state, to assert that nothing changed, and what a writer left behind."""

import hashlib
import os


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
