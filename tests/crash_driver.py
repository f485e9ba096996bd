"""The real CLI, killed by SIGKILL right after its K-th filesystem step: `python crash_driver.py K KIND ARGS...`.

KIND `rename` counts renames only (os.replace, os.rename, edge.store.durable.exchange: the moments a set changes); `any`
counts every step that changes the disk (renames, links, unlinks, folders, fsyncs), for kill points spread over
the whole command. K = 0 never kills and prints on stderr how many steps the command took
("crash_driver: N steps"). With EDGE_TEST_NO_EXCHANGE=1 the filesystem seems to lack RENAME_EXCHANGE (the
two-rename path runs). The kill comes from the process itself, after the step returned: as a power cut there, with
nothing flushed or cleaned up. `install-set NEW DEST PREVIOUS` runs the rebuild's calibration-set swap alone
(edge.store.versions.discard and replace_folder, as edge.model.rebuild.step_install_set), which no command runs
by itself.
"""

import os
import signal
import sys

kill_at, kind, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
steps = [0]


def counted(fn):
    def step(*args, **kwargs):
        result = fn(*args, **kwargs)
        steps[0] += 1
        if steps[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    return step


import edge.store.durable  # noqa: E402  (edge.store.versions calls durable.exchange through the module)

if os.environ.get("EDGE_TEST_NO_EXCHANGE") == "1":
    edge.store.durable.exchange = lambda a, b: False
edge.store.durable.exchange = counted(edge.store.durable.exchange)  # folders replaced in place swap through it
for name in ("replace", "rename") + (("symlink", "link", "unlink", "mkdir", "fsync", "rmdir") if kind == "any" else ()):
    setattr(os, name, counted(getattr(os, name)))

from edge.cli.main import main  # noqa: E402


def install_set(new, dest, previous):
    """The rebuild's set swap alone (edge.model.rebuild.step_install_set, after the artifact's install)."""
    from edge.store.versions import discard, replace_folder

    discard(previous, dest)
    replace_folder(new, dest, previous=previous)
    return 0


try:
    code = install_set(*argv[1:]) if argv[0] == "install-set" else main(argv)
finally:
    print("crash_driver: {} steps".format(steps[0]), file=sys.stderr)
sys.exit(code)
