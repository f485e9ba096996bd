"""File operations a crash must not undo or confuse: data flushed to the disk (`fsync_path`, `fsync_tree`), two
paths swapped in one step (`exchange`), and temporary folders flock'ed by the process writing them
(`held_folder`), so a sweep (`abandoned`) removes only what a killed writer left."""

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import shutil
from typing import Iterator, Set

_HELD: Set[str] = set()  # temporary folders this process holds (`held_folder`)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@contextlib.contextmanager
def held_folder(path: str) -> Iterator[None]:
    """Make the folder `path` and hold an flock on it while the block runs: a sweep (`abandoned`) leaves it alone
    until its writer has ended, however it ended. A sweep that took the new folder between its mkdir and the flock
    holds the flock while it removes it: the writer waits for that, then makes it again."""
    while True:
        os.mkdir(path, 0o700)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        with contextlib.suppress(OSError):  # a filesystem without flock: such a folder is never swept
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while a sweep probes or removes it
        try:
            if os.path.samestat(os.fstat(fd), os.lstat(path)):
                break
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # swept before it was held: made again
    _HELD.add(os.path.realpath(path))
    try:
        yield
    finally:
        _HELD.discard(os.path.realpath(path))
        os.close(fd)


def held_here(path: str) -> bool:
    """True for a temporary folder this process made and holds (its flock is this process's already)."""
    return os.path.realpath(path) in _HELD


@contextlib.contextmanager
def abandoned(path: str) -> Iterator[bool]:
    """True when no living writer holds the temporary folder (or file) `path`: a crash's leftover, flock'ed by the
    caller until the block ends, so that no writer takes it while the caller moves or removes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield os.path.islink(path)  # gone (nothing to do), or a link: never ours to follow
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            held = False
        else:
            held = True
        yield held
    finally:
        os.close(fd)


def temp_name(parent: str, prefix: str, suffix: str = "") -> str:
    """A fresh, unused name in `parent` for temporary work. Nothing is created: the caller records the name first,
    then creates it, so a signal between the two never leaves a file its cleanup does not know (tempfile's
    mkstemp/mkdtemp return only after creating it)."""
    return os.path.join(parent, prefix + secrets.token_hex(8) + suffix)


def remove_path(path: str) -> None:
    """Remove a file, link or folder tree; absent is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def fsync_path(path: str) -> None:
    """Flush a file's or folder's contents to the disk (a folder: the names in it)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """Every file and folder under `root`, then `root`: what a power cut must not find half-written."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                fsync_path(os.path.join(folder, name))
        fsync_path(folder)


def exchange(a: str, b: str) -> bool:
    """Swap the paths `a` and `b` in one step (renameat2 RENAME_EXCHANGE, Linux 3.15+); False where the C library,
    kernel or filesystem cannot (the caller then renames twice)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)  # glibc 2.28+
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), a)


