"""Files written and read safely: every writer goes through `atomic_write`, every untrusted image through
`read_regular` + `image_size`.

A write goes to a temporary file created exclusively (O_EXCL, no link followed) beside the target, is fsynced,
then renamed over it, and the folder is fsynced: a reader sees the old file or the new one, never half of one.
Only a regular file (or nothing) is ever replaced; a device node, FIFO, directory or symlink at the target is
refused. Root's release state writes relative to the descriptor of its checked folder (`dir_fd`).

A folder written whole (`atomic_dir`: a calibration set) is made under a temporary name, fsynced, and put in place
of the old one in one step by edge.store.versions (`replace_folder`; what a killed writer left is settled first:
`recover_folder`). A temporary folder is flock'ed by its writer while it lives, so a sweep removes only what a
killed writer left.
"""

import contextlib
import errno
import json
import os
import shutil
import stat
from typing import IO, Any, Callable, Iterator, Optional, Set

from edge.errors import EXIT_FAIL, EdgeError, first_line
from edge.inputs import file_kind, load_json
from edge.store.durable import fsync_path, fsync_tree, held_folder, temp_name
from edge.store.versions import recover_folder, replace_folder, temp_prefix
from edge.uri import redact

NAME_MAX = 255  # bytes in one file or folder name (Linux filesystems)



def check_output(path: str, what: str = "output", *, dir_fd: Optional[int] = None) -> None:
    """Refuse, before any work is done, an output path that is not a regular file or cannot be written (`dir_fd`:
    its folder, opened and checked already, where its name alone is looked up)."""
    try:
        st = os.stat(path if dir_fd is None else os.path.basename(path), dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise EdgeError("{}: cannot write the {}: {}".format(path, what, exc.strerror)) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise EdgeError("{}: cannot write the {}: it is {}, not a regular file".format(
            path, what, file_kind(st.st_mode)))
    if dir_fd is None:
        check_folder(path, what)


def check_folder(path: str, what: str) -> None:
    """Refuse, before any work, a `path` whose folder (or nearest existing one) this user cannot write."""
    probe = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise EdgeError("{}: cannot write the {} ({} is not a writable folder)".format(path, what, probe))


@contextlib.contextmanager
def temp_dir(parent: str, prefix: str) -> Iterator[str]:
    """A new private folder in `parent` (made if missing), removed with its contents when the block ends, however
    it ends; flock'ed meanwhile, so no sweep takes it from a living writer."""
    os.makedirs(parent, exist_ok=True)
    path = temp_name(parent, prefix)
    try:
        with held_folder(path):
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def atomic_write(path: str, write_fn: Callable[[IO[bytes]], Any], what: str = "file", *,
                 dir_fd: Optional[int] = None) -> None:
    """Write `path` through `write_fn(binary file)`; the old file (if any) stays until the new one is complete.
    `dir_fd`: the folder of `path` opened already, walked without following a link (root's release state,
    edge.fleet.statedir): every name resolves relative to it alone."""
    path = os.path.abspath(path) if dir_fd is None else path
    check_output(path, what, dir_fd=dir_fd)
    if dir_fd is None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    target = path if dir_fd is None else os.path.basename(path)
    try:
        mode = stat.S_IMODE(os.stat(target, dir_fd=dir_fd, follow_symlinks=False).st_mode)  # kept when replaced
    except FileNotFoundError:
        mode = 0o644
    tmp = temp_name(os.path.dirname(target), "." + os.path.basename(path) + ".", ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600,
                     dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as fh:
            write_fn(fh)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        check_output(path, what, dir_fd=dir_fd)  # still a regular file (or nothing) right before the rename
        os.replace(tmp, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        if isinstance(exc, OSError) and exc.errno and exc.filename in (None, tmp):  # named as the target
            raise OSError(exc.errno, exc.strerror, path) from None
        raise
    fsync_path(os.path.dirname(path)) if dir_fd is None else os.fsync(dir_fd)


def write_json_atomic(path: str, data: Any, what: str = "JSON file", *, dir_fd: Optional[int] = None) -> None:
    """Sorted, indented JSON, written whole or not at all (`atomic_write`)."""
    text = redact(json.dumps(data, indent=2, sort_keys=True)) + "\n"  # no password in any stored file
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")), what, dir_fd=dir_fd)


def check_replaceable(out_dir: str, manifest: str) -> None:
    """Refuse to replace the folder `out_dir` unless it is absent, empty, or one this code wrote: its `manifest`
    (JSON, {"files": [{"name": ...}]}) lists every file in it. Anything else may hold the user's files."""
    if not os.path.lexists(out_dir):
        return
    if os.path.islink(out_dir) or not os.path.isdir(out_dir):
        raise EdgeError("{}: exists and is not a folder; refusing to replace it".format(out_dir))
    if not os.listdir(out_dir):
        return
    why = "no {} in it".format(manifest)
    if os.path.isfile(os.path.join(out_dir, manifest)):
        try:
            listed = {e["name"] for e in load_json(os.path.join(out_dir, manifest), "manifest")["files"]}
        except (EdgeError, KeyError, TypeError):
            listed = None
            why = "its {} is not one this tool wrote".format(manifest)
        if listed is not None:
            present: Set[str] = set()
            for root, dirs, files in os.walk(out_dir):
                names = files + [d for d in dirs if os.path.islink(os.path.join(root, d))]
                present.update(os.path.relpath(os.path.join(root, n), out_dir).replace(os.sep, "/") for n in names)
            extra = sorted(present - listed - {manifest})
            why = "files not listed in its {}: {}".format(manifest, ", ".join(extra[:3])) if extra else ""
    if why:
        raise EdgeError("{}: refusing to replace this folder ({}); choose a new or empty output folder".format(
            out_dir, why))


def _check_out_dir(out_dir: str, what: str) -> None:
    """Before any work: a folder name the filesystem takes, in a folder this user can write."""
    name = os.path.basename(out_dir)
    if len(os.fsencode(name)) > NAME_MAX:
        raise EdgeError("{}: the {}'s folder name is longer than {} bytes".format(out_dir, what, NAME_MAX))
    check_folder(out_dir, what)


def _commit(tmp: str, out_dir: str, *, manifest: str) -> None:
    """Put `tmp` at `out_dir` in one step (edge.store.versions.replace_folder); the old set, one this tool wrote,
    is removed."""
    check_replaceable(out_dir, manifest)  # still true after the (long) work
    fsync_tree(tmp)  # a power cut after the swap finds every image and the manifest whole
    try:
        replace_folder(tmp, out_dir)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):  # another writer renamed in between
            raise EdgeError("{}: another command wrote this folder at the same time; nothing of this run was "
                            "kept (run it again)".format(out_dir)) from None
        raise


@contextlib.contextmanager
def atomic_dir(out_dir: str, manifest: str, what: str, keep_out: Optional[str] = None) -> Iterator[str]:
    """Yields a temporary folder beside `out_dir`; on success it replaces `out_dir` (only a folder written here:
    `check_replaceable`), on any error or signal it is removed. `keep_out` (the source) and `out_dir` must not
    overlap. The name and the parent are checked first; a write that fails (a full disk, a read-only folder) is
    one EdgeError naming the folder. What a killed earlier writer left is restored or removed first."""
    out_dir = os.path.abspath(out_dir)
    real = os.path.realpath(out_dir)
    if keep_out is not None:
        other = os.path.realpath(keep_out)
        if other == real or other.startswith(real + os.sep) or real.startswith(other + os.sep):
            raise EdgeError("{}: the output folder must not contain, or be inside, {}".format(out_dir, keep_out))
    _check_out_dir(out_dir, what)
    try:
        recover_folder(out_dir)
        check_replaceable(out_dir, manifest)
        with temp_dir(os.path.dirname(out_dir), temp_prefix(out_dir, "tmp")) as tmp:
            yield tmp
            os.chmod(tmp, 0o755)
            _commit(tmp, out_dir, manifest=manifest)
    except OSError as exc:
        raise EdgeError("{}: cannot write the {}: {}{}".format(
            out_dir, what, exc.strerror or first_line(exc), " ({})".format(os.path.basename(str(exc.filename)))
            if exc.filename else ""), exit_code=EXIT_FAIL) from None


