"""A folder that root works in without trusting anyone else: the release state (/var/lib/jetson-edge-release),
its releases, and the shared store's rollout records.

`StateDir.open` walks the path from / one component at a time, never through a symbolic link, and (`trusted`)
checks that each folder is owned by root or by the user running edge and writable by its owner only (a
root-owned sticky folder such as /tmp may sit above). Every file inside is then opened relative to that folder's
descriptor with O_NOFOLLOW: a link, FIFO or device planted where a file is expected is refused in one line naming
the path, never followed. Writes are edge.store.fileio's, relative to the folder's descriptor (`dir_fd`).
"""

import contextlib
import errno
import json
import os
import shutil
import stat
from typing import Any, List, Optional

from edge.errors import EdgeError, one_line
from edge.inputs import file_kind
from edge.store.fileio import write_json_atomic

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LINK_ERRORS = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)


def refuse(path: str, why: str) -> EdgeError:
    return EdgeError("{}: {}; refused (root follows no link and trusts no folder another user can write)".format(
        one_line(path), why))


def check_member(name: str, where: str) -> str:
    """A plain name inside one folder: no separator, not . or .., no control character."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or not name.isprintable():
        raise refuse(os.path.join(where, name), "not a plain file name")
    return name


class StateDir:
    """An open, checked folder; names inside are resolved relative to its descriptor only."""

    def __init__(self, path: str, fd: int, trusted: bool):
        self.path, self.fd, self.trusted = path, fd, trusted

    @classmethod
    def open(cls, path: str, *, trusted: bool = True) -> "StateDir":
        """Open the absolute folder `path` (missing: FileNotFoundError). `trusted`: every folder on the way is
        root's or this user's and no one else's to write."""
        path = os.path.normpath(os.path.abspath(path))
        fd = os.open("/", _DIR)
        walked = "/"
        try:
            parts = [p for p in path.split("/") if p]
            for i, part in enumerate(parts):
                walked = os.path.join(walked, part)
                nfd = _open_dir(fd, part, walked)
                os.close(fd)
                fd = nfd
                if trusted:
                    _check_owner(fd, walked, final=i == len(parts) - 1)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, trusted)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "StateDir":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def where(self, name: str) -> str:
        return os.path.join(self.path, name)

    def sub(self, name: str) -> "StateDir":
        """The folder `name` inside, checked as this one was (missing: FileNotFoundError)."""
        fd = _open_dir(self.fd, check_member(name, self.path), self.where(name))
        try:
            if self.trusted:
                _check_owner(fd, self.where(name), final=True)
        except BaseException:
            os.close(fd)
            raise
        return StateDir(self.where(name), fd, self.trusted)

    def lstat(self, name: str) -> Optional[os.stat_result]:
        try:
            return os.stat(check_member(name, self.path), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def is_dir(self, name: str) -> bool:
        st = self.lstat(name)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def listdir(self) -> List[str]:
        return sorted(os.listdir(self.fd))

    def read(self, name: str, limit: int) -> Optional[bytes]:
        """A regular file's bytes (None: absent); a link, FIFO or device, or one over `limit` bytes, is refused."""
        try:
            fd = os.open(check_member(name, self.path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._refused(name, exc) from None
        with os.fdopen(fd, "rb") as fh:
            self._check_file(fh.fileno(), name)
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise refuse(self.where(name), "larger than {} bytes".format(limit))
        return data

    def load_json(self, name: str, what: str, limit: int = 1 << 20) -> Any:
        """A JSON file's value (None: absent); not UTF-8 JSON is one line naming the file."""
        data = self.read(name, limit)
        if data is None:
            return None
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise EdgeError("{}: the {} is not JSON: {}".format(self.where(name), what, one_line(str(exc), 120))) \
                from None

    def write_json(self, name: str, value: Any) -> None:
        """Replace `name` by one rename in this folder (edge.store.fileio's writer, relative to this descriptor);
        only a regular file (or nothing) is replaced."""
        write_json_atomic(self.where(check_member(name, self.path)), value, "state file", dir_fd=self.fd)

    def append(self, name: str, line: str) -> None:
        """Append one line to a regular file (made if missing), flushed to the disk."""
        fd = self.open_file(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        with os.fdopen(fd, "ab") as fh:
            fh.write(line.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())

    def open_file(self, name: str, flags: int, mode: int = 0o600) -> int:
        """A descriptor of the regular file `name` (O_NOFOLLOW): a lock file, a log."""
        try:
            fd = os.open(check_member(name, self.path), flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode,
                         dir_fd=self.fd)
        except OSError as exc:
            raise self._refused(name, exc) from None
        try:
            self._check_file(fd, name)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def make_dir(self, name: str) -> None:
        """The folder `name`, made (0755) when missing; a failure names it."""
        if self.lstat(name) is None:
            try:
                os.mkdir(check_member(name, self.path), 0o755, dir_fd=self.fd)
            except OSError as exc:
                raise self._refused(name, exc) from None

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(check_member(name, self.path), dir_fd=self.fd)

    def readlink(self, name: str) -> Optional[str]:
        """The target of the link `name` (None: absent or not a link)."""
        st = self.lstat(name)
        if st is None or not stat.S_ISLNK(st.st_mode):
            return None
        return os.readlink(name, dir_fd=self.fd)

    def remove_tree(self, name: str) -> None:
        """Remove the folder `name` and what is in it, never through a link (a link is removed, not followed)."""
        st = self.lstat(name)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            return self.unlink(name)
        # this folder's path was walked without links and is no one else's to write; rmtree itself removes
        # links inside (engines/ is the service user's) without following them, where the platform allows it
        if not shutil.rmtree.avoids_symlink_attacks:
            raise refuse(self.where(name), "this platform's rmtree may follow links")
        shutil.rmtree(self.where(name), ignore_errors=True)
        return None

    def _check_file(self, fd: int, name: str) -> None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse(self.where(name), "it is {}, not a regular file".format(file_kind(st.st_mode)))

    def _refused(self, name: str, exc: OSError) -> EdgeError:
        if exc.errno in _LINK_ERRORS:
            return refuse(self.where(name), "a symbolic link")
        return EdgeError("{}: {}".format(one_line(self.where(name)), exc.strerror))


def _open_dir(parent_fd: int, name: str, path: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=parent_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in _LINK_ERRORS:
            raise refuse(path, "a symbolic link or not a folder") from None
        raise EdgeError("{}: {}".format(one_line(path), exc.strerror)) from None


def _check_owner(fd: int, path: str, final: bool) -> None:
    st = os.fstat(fd)
    if st.st_uid not in (0, os.geteuid()):
        raise refuse(path, "owned by uid {}, not root".format(st.st_uid))
    shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if shared and (final or st.st_uid != 0 or not st.st_mode & stat.S_ISVTX):
        raise refuse(path, "writable by its group or others (mode {:o})".format(stat.S_IMODE(st.st_mode)))
