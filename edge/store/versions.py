"""The one versioned-folder switch: every symlink edge.store writes is made here (`flip`), read back strictly
(`read_link`), and every folder that replaces another in one step goes through here (`replace_folder`). The
folder is fsynced after every flip and every rename. Two shapes:

Link-switched sets (artifact sets; fleet releases flip `current`, `previous` and `committed` with `flip` and
`read_link`, relative to the descriptor of root's state folder):

    <folder>/m.int8.onnx            -> m.int8.onnx.sets/current/m.int8.onnx     fixed links, made once
    <folder>/previous/m.int8.onnx   -> ../m.int8.onnx.sets/current/previous/m.int8.onnx   (and the other names)
    <folder>/m.int8.onnx.sets/current    -> 0007          the one flip: a new link renamed over it
    <folder>/m.int8.onnx.sets/0007/      the set's files, fsynced, never changed; previous -> ../0006

A set folder is written complete under a temporary name, renamed to its number, then `current` is flipped: a crash
at any instant leaves `current` naming a whole set, old or new. A rollback points the previous set's `previous`
at the current set, then flips `current` to it. A reader resolves `current` once and reads every file from that
folder (edge.store.layout.resolve: an artifact's names on these sets). A link spelled otherwise than the store
writes it (`0001/`, `./0001`, an absolute path, a loop) is refused in one line naming it, by readers and writers
alike, before anything is removed; sets `current` no longer reaches are removed by the next writer (`collect`),
never one `current` or its previous resolves to (by real path). Today's flat layout (files at those names,
previous/ a folder of files) is read as it is; the first writer turns it into sets (layout.migrate), each step
leaving the same bytes at the same names.

Folders replaced in place (calibration sets: a path users configure, ship and copy, read only by builds): the new
folder is exchanged with the old one (renameat2), or, where the filesystem cannot, the old one is renamed into a
held folder aside first; `recover_folder` puts an old set a crash left aside back.

Every writer of a link-switched folder (fleet releases too) holds `lock(folder)`: a 0600 lock file of its own that no
other user can open; a refusal (`Busy`) names the holder's pid. Taking it, `sweep` removes what a killed writer left.
"""

import atexit
import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import time
from typing import Dict, Iterator, List, Optional, Pattern, Tuple

from edge.errors import EdgeError
from edge.inputs import file_kind
from edge.store import durable
from edge.store.durable import abandoned, fsync_path, held_folder, held_here, remove_path, temp_name

SETS = ".sets"
CURRENT = "current"
PREVIOUS = "previous"
LOCK = ".lock"
MODE = 0o644  # every file of a set: the service user reads what root built
_NUMBER = re.compile(r"^\d{4,9}$")
_UP_NUMBER = re.compile(r"^\.\./(\d{4,9})$")  # a set's `previous`
_TEMP = re.compile(r"^\..+[.-][0-9a-f]{16}(\.staged|\.tmp)?$")  # edge.store.durable.temp_name's, in a folder
_held: Dict[str, List[int]] = {}  # folder -> [lock fd, depth]: the lock is re-entrant within a process
POLL_S = 0.2  # a waiting `lock` tries again this often


# --- the switch itself: links and renames -------------------------------------------------------------------------

def flip(folder: str, name: str, *, target: Optional[str], dir_fd: Optional[int] = None) -> None:
    """Point the link `folder/name` at `target` in one rename (None: remove the link), then fsync `folder`.
    `dir_fd`: `folder` opened already, walked without following a link (root's release state, edge.fleet.statedir):
    every name resolves relative to it alone, and only a link (or nothing) is replaced there."""
    path = os.path.join(folder, name) if dir_fd is None else name
    try:
        mode = None if dir_fd is None else os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISLNK(mode):
        raise EdgeError("{}: not a link; refused, nothing was changed".format(os.path.join(folder, name)))
    if target is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path, dir_fd=dir_fd)
    else:
        tmp = temp_name(folder if dir_fd is None else "", ".link-")
        os.symlink(target, tmp, dir_fd=dir_fd)
        try:
            os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    fsync_path(folder) if dir_fd is None else os.fsync(dir_fd)


def read_link(path: str, spelled: Pattern[str], *, dir_fd: Optional[int] = None) -> Optional[str]:
    """The target of the link `path` (None: absent) spelled as the store writes it (`dir_fd`: its folder, as for
    `flip`); anything else (another spelling, a folder, a loop) is one line naming it, and nothing was changed."""
    try:
        target = os.readlink(path if dir_fd is None else os.path.basename(path), dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError:
        target = None
    if target is None or not spelled.match(target):
        raise EdgeError("{}: {}, not a link as the store writes it; refused, nothing was removed".format(
            path, "a link to {!r}".format(target) if target is not None else "not a link"))
    return target


def move(src: str, dest: str) -> None:
    """Rename `src` to `dest`, then fsync the folder(s)."""
    os.rename(src, dest)
    for folder in sorted({os.path.dirname(os.path.abspath(p)) for p in (src, dest)}):
        fsync_path(folder)


def temp_prefix(dest: str, kind: str) -> str:
    """The names a writer of the folder `dest` uses beside it ("tmp": the new folder; "old", "keep": the old one
    aside, to drop or to keep as the previous)."""
    return ".{}.{}-".format(os.path.basename(dest)[:64], kind)  # short: the folder's own name may be 255 bytes


def replace_folder(new: str, dest: str, *, previous: Optional[str] = None) -> None:
    """The folder `new` becomes `dest` in one step; the folder `dest` held goes to `previous` (absent) or is removed.
    Exchanged where the filesystem can; else the old one is renamed into a held folder aside first, named for what
    becomes of it (a crash then leaves it there and `recover_folder` settles it)."""
    if not os.path.lexists(dest):
        move(new, dest)
    elif durable.exchange(new, dest):
        fsync_path(os.path.dirname(os.path.abspath(dest)))
        _retire(new, previous)
    else:
        kind = "old" if previous is None else "keep"
        aside = temp_name(os.path.dirname(os.path.abspath(dest)), temp_prefix(dest, kind))
        with held_folder(aside):
            move(dest, os.path.join(aside, "set"))
            try:
                move(new, dest)
            finally:
                if os.path.lexists(os.path.join(aside, "set")) and not os.path.lexists(dest):
                    move(os.path.join(aside, "set"), dest)  # the new folder did not land: the old one goes back
            _retire(os.path.join(aside, "set"), previous)
        remove_path(aside)


def _retire(old: str, previous: Optional[str]) -> None:
    if previous is None:
        remove_path(old)
    elif os.path.abspath(old) != os.path.abspath(previous):
        move(old, previous)


def discard(path: str, dest: str) -> None:
    """Remove the folder `path` (a previous of `dest`) so that a crash cannot leave half of it under its name:
    renamed to one of `dest`'s temporary names first (what `recover_folder(dest)` removes), then removed."""
    if os.path.lexists(path):
        gone = temp_name(os.path.dirname(os.path.abspath(dest)), temp_prefix(dest, "tmp"))
        move(path, gone)
        remove_path(gone)


def recover_folder(dest: str, *, previous: Optional[str] = None) -> List[str]:
    """What a killed `replace_folder` of `dest` left beside it: an old folder aside goes back to `dest` when it is
    missing; else one its writer meant to keep goes to `previous` (given and absent; not given: left for the
    writer's own recovery), and one it meant to drop is removed, as are unfinished new folders. Folders a living
    writer holds are left alone. Returns what it did, one line each."""
    dest = os.path.abspath(dest)
    parent, done = os.path.dirname(dest), []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return done
    for kind in ("keep", "old", "tmp"):  # an old folder first: it may be the only copy
        for name in (n for n in names if n.startswith(temp_prefix(dest, kind))):
            path, home = os.path.join(parent, name), dest
            with abandoned(path) as left:  # held while it is settled: no writer takes it meanwhile
                if not left or (os.path.lexists(dest) and kind == "keep" and previous is None):
                    continue
                if os.path.lexists(dest):
                    home = previous if kind == "keep" and not os.path.lexists(previous or dest) else ""
                if kind != "tmp" and os.path.isdir(os.path.join(path, "set")) and home:
                    move(os.path.join(path, "set"), home)
                    done.append("{}: restored from {} (a writer was killed between its renames)".format(home, name))
                remove_path(path)
                done.append("{}: removed (left by a killed writer)".format(path))
    return done


# --- the lock -----------------------------------------------------------------------------------------------------

class Busy(EdgeError):
    """The lock is another process's (after `wait_s`): one line naming its pid."""


@contextlib.contextmanager
def lock(folder: str, command: str, *, wait_s: float = 0.0) -> Iterator[None]:
    """The one lock of a link-switched folder, held by every writer (build, rebuild, rollback, cache fetch, export,
    a fleet release change) for its whole run: an flock on `folder`/.lock, a 0600 file of this user's that only
    exists while held, so no other user can open it. Held by another process for `wait_s` seconds (0: at once):
    `Busy`. Re-entrant within a process. A filesystem without flock (some network mounts) runs unlocked."""
    key = os.path.realpath(folder)
    if key in _held or held_here(folder):  # a temporary folder of this process's (a candidate's) is its own
        _held.setdefault(key, [-1, 0])[1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
            if _held[key] == [-1, 0]:
                del _held[key]
        return
    fd = _take(os.path.join(folder, LOCK), command, wait_s)
    _held[key] = [fd, 1]
    try:
        yield
    finally:
        _release(os.path.join(key, LOCK), fd)
        _held.pop(key, None)


@atexit.register
def _release_left() -> None:
    """A signal raised between the lock's enter and the `with` body (or inside its release) skips the `finally`:
    the lock file still goes at exit."""
    for key, (fd, _) in list(_held.items()):
        if fd >= 0:
            with contextlib.suppress(OSError):
                _release(os.path.join(key, LOCK), fd)


def _release(path: str, fd: int) -> None:
    """Unlink the lock file while still holding it (a waiter that opened it takes a new one), then let it go."""
    with contextlib.suppress(FileNotFoundError):
        if os.path.samestat(os.fstat(fd), os.lstat(path)):
            os.unlink(path)
    os.close(fd)


def _take(path: str, command: str, wait_s: float) -> int:
    """The lock file at `path`, flock'ed; tried again every POLL_S while another process holds it, for `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            why = "a symbolic link; refused" if exc.errno == errno.ELOOP else exc.strerror
            raise EdgeError("{}: cannot take the lock ({})".format(path, why)) from None
        try:
            if _locked(path, fd, command, wait_s):
                return fd
        except EdgeError as exc:
            os.close(fd)
            if not isinstance(exc, Busy) or time.monotonic() >= deadline:
                raise
            time.sleep(POLL_S)
            continue
        except BaseException:  # a signal: the file goes, unless another writer holds it
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
            else:
                _release(path, fd)
            raise
        os.close(fd)


def _locked(path: str, fd: int, command: str, wait_s: float) -> bool:
    """Take the flock on `fd` (the lock file at `path`): True, with this pid written in it, or False when its
    last holder unlinked it meanwhile; held by another: `Busy`, naming its pid."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise EdgeError("{}: a lock file of uid {} with mode {:o}, not this user's 0600 one; refusing it (remove it)"
                        .format(path, st.st_uid, stat.S_IMODE(st.st_mode)))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            raise Busy("{}: in use by another edge command (pid {}); {} {}: try again once it has ended".format(
                os.path.dirname(path), holder, command, "waited {:g} s".format(wait_s) if wait_s else
                "waits for none")) from None
    try:
        if not os.path.samestat(st, os.lstat(path)):
            return False
    except FileNotFoundError:
        return False
    os.ftruncate(fd, 0)
    os.write(fd, "{}\n".format(os.getpid()).encode("ascii"))
    return True


def require_lock(folder: str) -> None:
    assert os.path.realpath(folder) in _held, "hold lock({}) first".format(folder)


def sweep(folder: str) -> List[str]:
    """Under the lock: remove the temporary files and folders a killed writer left in `folder` (staged files,
    unfinished downloads and work folders); a folder still flock'ed by a living process is left alone."""
    require_lock(folder)
    removed = []
    for base in (folder, os.path.join(folder, PREVIOUS)):
        for name in sorted(os.listdir(base)) if os.path.isdir(base) and not os.path.islink(base) else []:
            path = os.path.join(base, name)
            if not _TEMP.match(name):
                continue
            with abandoned(path) as left:
                if left or os.path.isfile(path):
                    remove_path(path)
                    removed.append(os.path.relpath(path, folder))
    return removed


# --- numbered sets under one `current` ----------------------------------------------------------------------------

def _set_folder(sets: str, number: str) -> str:
    """The set folder `number`: a folder the store wrote, not a link (a loop) or a file."""
    path = os.path.join(sets, number)
    mode = os.lstat(path).st_mode if os.path.lexists(path) else None
    if mode is None or not stat.S_ISDIR(mode):
        raise EdgeError("{}: {}, not a set folder the store wrote; refusing to use it, nothing was removed".format(
            path, "missing" if mode is None else file_kind(mode) + (" (a loop?)" if stat.S_ISLNK(mode) else "")))
    return path


def current(sets: str) -> Optional[str]:
    """The set number `sets`/current names (None: none installed); anything the store did not write is refused."""
    if os.path.islink(sets):
        raise EdgeError("{}: a symlink, not the store's sets folder; refusing to use it (remove it)".format(sets))
    number = read_link(os.path.join(sets, CURRENT), _NUMBER) if os.path.lexists(sets) else None
    return number if number is None else os.path.basename(_set_folder(sets, number))


def previous(sets: str, number: Optional[str]) -> Optional[str]:
    """The number the set `number` replaced (its `previous` link), or None."""
    if number is None:
        return None
    target = read_link(os.path.join(sets, number, PREVIOUS), _UP_NUMBER)
    return None if target is None else os.path.basename(_set_folder(sets, target[3:]))


def _place(src: str, dest: str, link: bool) -> None:
    """`src` at `dest`, 0644 and on the disk: a copy (a caller's file may be rewritten in place later), or a hard
    link of a file only this module will touch again (`link`: migrating today's layout)."""
    try:
        if not link:
            raise OSError("copy")
        os.link(src, dest, follow_symlinks=False)
    except OSError:
        shutil.copyfile(src, dest)
    os.chmod(dest, MODE)
    fsync_path(dest)


def new_set(sets: str, files: Dict[str, str], replaced: Optional[str], *, link: bool = False) -> str:
    """A complete set folder in `sets` of `files` ({name: source path}) that replaced the set `replaced`, not yet
    current; returns its number."""
    os.makedirs(sets, exist_ok=True)
    new = temp_name(sets, ".new-")
    os.mkdir(new, 0o755)
    try:
        for name, src in files.items():
            _place(src, os.path.join(new, name), link)
        if replaced is not None:
            os.symlink(os.path.join("..", replaced), os.path.join(new, PREVIOUS))
        fsync_path(new)
        number = "{:04d}".format(max([int(n) for n in os.listdir(sets) if _NUMBER.match(n)], default=0) + 1)
        move(new, os.path.join(sets, number))
    except BaseException:
        remove_path(new)
        raise
    return number


def swap_with_previous(sets: str) -> Tuple[str, str]:
    """Rollback's flip: the previous set becomes current, with the current one as its previous. Returns (the set
    folder now current, the one replaced)."""
    now = current(sets)
    before = previous(sets, now)
    assert now is not None and before is not None
    flip(os.path.join(sets, before), PREVIOUS, target=os.path.join("..", now))
    flip(sets, CURRENT, target=before)
    return os.path.join(sets, before), os.path.join(sets, now)


def collect(sets: str) -> List[str]:
    """Remove the set folders `current` no longer reaches and what a killed writer left in `sets`; never what
    `current` or its previous resolves to (by real path), and no set while no `current` names one. Returns the
    names removed."""
    if not os.path.isdir(sets):
        return []
    now = current(sets)
    kept = [n for n in (now, previous(sets, now)) if n]
    real = [os.path.realpath(os.path.join(sets, n)) for n in kept]
    removed = [n for n in sorted(os.listdir(sets)) if n not in kept + [CURRENT]
               and (n.startswith(".") or (_NUMBER.match(n) and now is not None))]
    for number in kept:
        removed += [os.path.join(number, t) for t in sorted(os.listdir(os.path.join(sets, number)))
                    if t.startswith(".")]  # a link a killed rollback was about to flip
    removed = [n for n in removed if os.path.islink(os.path.join(sets, n)) or not any(  # a link: only itself goes
        r == g or r.startswith(g + os.sep) for r in real for g in [os.path.realpath(os.path.join(sets, n))])]
    for name in removed:
        remove_path(os.path.join(sets, name))
    return removed
