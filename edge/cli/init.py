"""`edge init`: write the files a product needs beside the code into a folder (default: here), from the package.

    edge init                 # ./calibration/default, ./calibration/regression, ./configs/example.yaml,
    edge init /srv/edge       # ./systemd/jetson-edge.service + config.yaml, ./constraints/jetpackN.txt

An installed wheel carries them as edge/shipped/ (setup.py SHIPPED); a source checkout has them in place. With
them, `edge export`, `edge build` (its default calibration set; the default regression set, the labelled ImageNet
photographs, is made by `edge calibrate imagenet`) and `edge run` work from that folder. A file that is already
there is never replaced: they are all named and nothing is written.
"""

import argparse
import os
import shutil
from typing import Any, List, Tuple

from edge.cli.common import add_command
from edge.errors import EXIT_OK, EdgeError
from edge.store.fileio import atomic_write

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("calibration/default", "calibration/regression", "configs", "systemd", "constraints")


def shipped_root() -> str:
    """edge/shipped/ of an installed wheel, else the source checkout the package runs from."""
    for root in (os.path.join(PACKAGE, "shipped"), os.path.dirname(PACKAGE)):
        if os.path.isdir(os.path.join(root, "calibration", "default")):
            return root
    raise EdgeError("no shipped files beside {} (a wheel built without edge/shipped/?): reinstall jetson-edge".format(
        PACKAGE))


def shipped_files(root: str) -> List[str]:
    """Paths relative to `root`, in a stable order."""
    found = []
    for folder in FOLDERS:
        base = os.path.join(root, folder)
        names = sorted(os.listdir(base)) if os.path.isdir(base) else []
        found += [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(base, n))]
    return found


def _copy(src: str, dest: str, what: str) -> None:
    with open(src, "rb") as fh:
        atomic_write(dest, lambda out: shutil.copyfileobj(fh, out), what)


def write_out(dest: str) -> Tuple[int, str]:
    """(files written, from where). Refuses, writing nothing, when any of them exists at `dest`."""
    root = shipped_root()
    files = shipped_files(root)
    taken = [rel for rel in files if os.path.lexists(os.path.join(dest, rel))]
    if taken:
        raise EdgeError("{} already has {} of these files ({}{}): nothing written; init another "
                        "folder".format(dest, len(taken), ", ".join(taken[:3]), ", ..." if len(taken) > 3 else ""))
    for rel in files:
        _copy(os.path.join(root, rel), os.path.join(dest, rel), rel)
    return len(files), root


def cmd_init(args: argparse.Namespace) -> int:
    count, root = write_out(args.folder)
    print("edge init: {} files from {} into {}".format(count, root, os.path.abspath(args.folder)))
    return EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", nargs="?", default=".", help="where to write them (default: the current folder)")


def register(subparsers: Any) -> None:
    add_command(subparsers, "init", "write the calibration sets, example config, unit and constraints into a folder",
                __doc__, add_arguments, cmd_init)
