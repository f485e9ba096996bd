"""The release bundle: what the controller ships for a release (the wheel and its constraints, the FP32 model with
its labels and info, the calibration and regression sets), packed once into the shared store, so that the devices
after each board type's canary fetch it from the cache they already read rather than through the controller
(deploy/ansible: tasks/bundle.yml).

    <store>/bundle/<sha256>.tar

The tar is the same bytes for the same files (names sorted, no times or owners, modes 0644 and 0755), so its name
is the sha256 of the controller-side inputs: a device verifies what it fetched against the name, and a re-run with
the same files writes nothing.
"""

import hashlib
import os
import stat
import tarfile
from typing import IO, Callable, List, Optional, Sequence, Tuple

from edge.errors import EdgeError
from edge.inputs import file_kind
from edge.store.artifact import sha256_file
from edge.store.fileio import atomic_write

FOLDER = "bundle"
Entry = Tuple[str, Optional[str]]  # (name in the bundle, path of a file here; None for a folder)


def entries(members: Sequence[Tuple[str, str]]) -> List[Entry]:
    """Every file and folder of `members` ((name in the bundle, a file or a folder here)), sorted by name. A link
    or anything but a regular file or folder is refused in one line naming it."""
    out: List[Entry] = []
    for name, path in members:
        if not name or name.startswith("/") or ".." in name.split("/"):
            raise EdgeError("release bundle: {!r} is not a relative name inside the bundle".format(name))
        out.extend(_walk(name.rstrip("/"), path))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise EdgeError("release bundle: a name given twice ({})".format(
            sorted(n for n in names if names.count(n) > 1)[0]))
    return sorted(out)


def _walk(name: str, path: str) -> List[Entry]:
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise EdgeError("{}: cannot read it for the release bundle: {}".format(path, exc.strerror)) from None
    if stat.S_ISREG(mode):
        return [(name, path)]
    if not stat.S_ISDIR(mode):
        raise EdgeError("{}: {} in the release bundle; give the file itself".format(path, file_kind(mode)))
    found: List[Entry] = [(name, None)]
    for child in sorted(os.listdir(path)):
        found.extend(_walk(name + "/" + child, os.path.join(path, child)))
    return found


class _Hashing:
    """A write-only file that keeps only the sha256 of what was written."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return len(data)


def _write(files: List[Entry], out: IO[bytes]) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, path in files:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            with open(path, "rb") as fh:
                info.mode, info.size = 0o644, os.fstat(fh.fileno()).st_size
                tar.addfile(info, fh)


def pack(store: str, members: Sequence[Tuple[str, str]], *, log: Callable[..., None] = print) -> str:
    """Pack `members` into `<store>/bundle/<sha256>.tar` unless it is there already; returns the sha256."""
    if not os.path.isdir(store):
        raise EdgeError("{}: the shared store folder does not exist".format(store))
    files = entries(members)
    hashing = _Hashing()
    _write(files, hashing)  # type: ignore[arg-type]
    sha = hashing.sha.hexdigest()
    final = os.path.join(store, FOLDER, sha + ".tar")
    if os.path.isfile(final):
        log("release bundle: {} holds it already".format(final))
        return sha
    atomic_write(final, lambda fh: _write(files, fh), "release bundle")
    if sha256_file(final) != sha:  # a file changed between the two passes: never a bundle under another's name
        os.unlink(final)
        raise EdgeError("release bundle: its files changed while it was packed; run again")
    log("release bundle: packed {}".format(final))
    return sha
