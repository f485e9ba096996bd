"""Where an installed set's files lie: one folder per set, switched by one symlink flip. Only edge.store.artifact uses
this module; it knows file names, not what the files mean.

    <folder>/m.int8.onnx            -> m.int8.sets/current/m.int8.onnx     fixed links, made once
    <folder>/m.int8.json            -> m.int8.sets/current/m.int8.json
    <folder>/m.int8.labels.txt      -> m.int8.sets/current/m.int8.labels.txt
    <folder>/previous/m.int8.onnx   -> ../m.int8.sets/current/previous/m.int8.onnx   (and the other two)
    <folder>/m.int8.sets/current    -> 0007          the one flip: a new link renamed over it
    <folder>/m.int8.sets/0007/      the set's files, fsynced, never changed; previous -> ../0006
    <folder>/m.int8.sets/0006/

A set folder is written complete under a temporary name, renamed to its number, then `current` is flipped: a
crash at any instant leaves `current` naming a whole set, old or new. A rollback points the previous set's
`previous` link at the current set, then flips `current` to it. A reader resolves `current` once and reads every
file from that folder (`resolve`). Sets `current` no longer reaches are removed by the next writer.

Today's flat layout (the files themselves at those names, previous/ a folder of files) is read as it is; the
first writer turns it into sets (`migrate`), each step leaving the same bytes at the same names.

Every writer holds `lock(folder)` (an flock on the folder) for its whole run; on taking it, `sweep` removes what a
killed writer left.
"""

import contextlib
import errno
import fcntl
import filecmp
import os
import re
import shutil
import stat
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from edge.errors import EdgeError
from edge.store.durable import fsync_path, held_here, is_abandoned, remove_path
from edge.store.fileio import temp_name

SETS = ".sets"
CURRENT = "current"
PREVIOUS = "previous"
MODE = 0o644  # every file of a set: the service user reads what root built
_NUMBER = re.compile(r"^\d{4,9}$")
_TEMP = re.compile(r"^\..+[.-][0-9a-f]{16}(\.staged|\.tmp)?$")  # edge.store.fileio.temp_name's, in an artifact folder
_held: Dict[str, List[int]] = {}  # folder -> [lock fd, depth]: the lock is re-entrant within a process


def sets_dir(dest: str) -> str:
    folder, name = os.path.split(os.path.abspath(dest))
    return os.path.join(folder, os.path.splitext(name)[0] + SETS)


def _link_target(dest: str, name: str, previous: bool = False) -> str:
    sets = os.path.basename(sets_dir(dest))
    return os.path.join("..", sets, CURRENT, PREVIOUS, name) if previous else os.path.join(sets, CURRENT, name)


def _readlink(path: str) -> Optional[str]:
    try:
        return os.readlink(path)
    except OSError:
        return None


def resolve(path: str) -> Tuple[str, bool]:
    """(the folder whose files a reader of `path` reads, True when it is a set folder). A link made here (at the
    artifact's name or in previous/) resolves `current` once, so every file comes from one set; anything else
    reads the files beside `path` (today's layout, a user's own model)."""
    here = os.path.dirname(os.path.abspath(path))
    head, name = os.path.split(_readlink(path) or "")
    if not head or name != os.path.basename(path):
        return here, False
    real = os.path.realpath(os.path.join(here, head))
    return (real, True) if os.path.dirname(real).endswith(SETS) else (here, False)


def current_set(dest: str) -> Optional[str]:
    """The number `current` names, or None (no set installed here)."""
    target = _readlink(os.path.join(sets_dir(dest), CURRENT))
    return target if target and _NUMBER.match(target) else None


def previous_set(dest: str, number: Optional[str]) -> Optional[str]:
    """The number the set `number` replaced, or None."""
    if number is None:
        return None
    target = _readlink(os.path.join(sets_dir(dest), number, PREVIOUS)) or ""
    head, tail = os.path.split(target)
    return tail if head == ".." and _NUMBER.match(tail) else None


def _kind(mode: int) -> str:
    return "a symlink" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file"


def check_names(dest: str, names: Sequence[str], what: Sequence[str]) -> None:
    """Before a writer changes anything: each name beside `dest` and in previous/ is absent, a file (today's
    layout) or a link made here; a symlink, folder or device elsewhere is refused, naming it."""
    folder = os.path.dirname(os.path.abspath(dest))
    backup = os.path.join(folder, PREVIOUS)
    if os.path.islink(backup) or (os.path.lexists(backup) and not os.path.isdir(backup)):
        raise EdgeError("{}: is not a folder (a symlink?); refusing to write through it (remove it)".format(backup))
    for base, previous in ((folder, False), (backup, True)):
        for name, kind in zip(names, what):
            path = os.path.join(base, name)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISREG(mode) or _readlink(path) == _link_target(dest, name, previous):
                continue
            raise EdgeError("{}: {} is {}; refusing to use it".format(path, kind, _kind(mode)))
    sets = sets_dir(dest)
    if os.path.lexists(sets) and (os.path.islink(sets) or not os.path.isdir(sets)):
        raise EdgeError("{}: is not a folder (a symlink?); refusing to write through it (remove it)".format(sets))


@contextlib.contextmanager
def lock(folder: str, command: str) -> Iterator[None]:
    """The one lock of an artifact folder (an flock on the folder itself: no file of its own), held by every
    writer (build, rebuild, rollback, cache fetch, export) for its whole run. Taken already: one line (exit 2).
    Re-entrant within a process. A filesystem without flock (some network mounts) runs unlocked."""
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
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise EdgeError("{}: cannot use this folder ({})".format(folder, exc.strerror)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            os.close(fd)
            raise EdgeError("{}: in use by another edge command (build, rebuild, rollback, cache fetch or export); "
                            "{} waits for none: try again once it has ended".format(folder, command)) from None
    _held[key] = [fd, 1]
    try:
        yield
    finally:
        del _held[key]
        os.close(fd)  # releases the flock


def _require_lock(folder: str) -> None:
    assert os.path.realpath(folder) in _held, "hold lock({}) first".format(folder)


def sweep(folder: str) -> List[str]:
    """Under the lock: remove the temporary files and folders a killed writer left in `folder` (staged files,
    unfinished downloads and work folders); a folder still flock'ed by a living process is left alone."""
    _require_lock(folder)
    removed = []
    for base in (folder, os.path.join(folder, PREVIOUS)):
        for name in sorted(os.listdir(base)) if os.path.isdir(base) and not os.path.islink(base) else []:
            path = os.path.join(base, name)
            if _TEMP.match(name) and (os.path.isfile(path) or os.path.islink(path) or is_abandoned(path)):
                remove_path(path)
                removed.append(os.path.relpath(path, folder))
    return removed


def _flip(folder: str, name: str, target: str) -> None:
    """Point the link `folder/name` at `target` in one rename."""
    tmp = temp_name(folder, ".link-")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, os.path.join(folder, name))
    except BaseException:
        remove_path(tmp)
        raise
    fsync_path(folder)


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


def _next_number(sets: str) -> str:
    numbers = [int(n) for n in os.listdir(sets) if _NUMBER.match(n)]
    return "{:04d}".format(max(numbers, default=0) + 1)


def _new_set(dest: str, files: Dict[str, str], previous: Optional[str], link: bool = False) -> str:
    """A complete set folder of `files` ({name: source path}) that replaced `previous`; returns its number."""
    sets = sets_dir(dest)
    os.makedirs(sets, exist_ok=True)
    new = temp_name(sets, ".new-")
    os.mkdir(new, 0o755)
    try:
        for name, src in files.items():
            _place(src, os.path.join(new, name), link)
        if previous is not None:
            os.symlink(os.path.join("..", previous), os.path.join(new, PREVIOUS))
        fsync_path(new)
        number = _next_number(sets)
        os.rename(new, os.path.join(sets, number))
    except BaseException:
        remove_path(new)
        raise
    return number


def commit(dest: str, files: Dict[str, str], *, keep_previous: bool) -> str:
    """Install `files` ({name: path}, the artifact's name among them) as the set at `dest`: written whole, then
    one flip. The set it replaces stays reachable as previous (`keep_previous`) or is removed. Returns the new
    set's folder."""
    _require_lock(os.path.dirname(os.path.abspath(dest)))
    current = current_set(dest)
    number = _new_set(dest, files, current if keep_previous else None)
    _flip(sets_dir(dest), CURRENT, number)
    ensure_links(dest, list(files), with_previous=keep_previous and current is not None)
    collect(dest)
    return os.path.join(sets_dir(dest), number)


def commit_files(dest: str, files: Dict[str, str], *, last: str) -> None:
    """Install `files` ({name: path}) as plain files beside `dest` (an export: files that travel), `last` renamed
    last: a reader checks the others against it, so a crash between the renames is refused, never served."""
    folder = os.path.dirname(os.path.abspath(dest))
    _require_lock(folder)
    for name in sorted(files, key=lambda n: n == last):
        tmp = temp_name(folder, "." + name + ".", ".staged")
        try:
            _place(files[name], tmp, False)
            os.replace(tmp, os.path.join(folder, name))
        finally:
            remove_path(tmp)
    fsync_path(folder)
    remove_path(sets_dir(dest))  # a set layout these files replaced


def swap_with_previous(dest: str) -> Tuple[str, str]:
    """Rollback's flip: the previous set becomes current, with the current one as its previous. Returns (the set
    folder now current, the one replaced)."""
    _require_lock(os.path.dirname(os.path.abspath(dest)))
    sets, current = sets_dir(dest), current_set(dest)
    previous = previous_set(dest, current)
    assert current is not None and previous is not None
    _flip(os.path.join(sets, previous), PREVIOUS, os.path.join("..", current))
    _flip(sets, CURRENT, previous)
    return os.path.join(sets, previous), os.path.join(sets, current)


def remove(dest: str, names: Sequence[str]) -> None:
    """Under the lock: `dest`'s links (the artifact's first: nothing half-removed is served) and its sets."""
    _require_lock(os.path.dirname(os.path.abspath(dest)))
    folder = os.path.dirname(os.path.abspath(dest))
    for base, previous in ((folder, False), (os.path.join(folder, PREVIOUS), True)):
        for name in names:
            if _readlink(os.path.join(base, name)) == _link_target(dest, name, previous):
                os.unlink(os.path.join(base, name))
    remove_path(sets_dir(dest))


def ensure_links(dest: str, names: Sequence[str], *, with_previous: bool = True) -> None:
    """The fixed links beside `dest` and (`with_previous`) in previous/: made once, a missing one made."""
    folder = os.path.dirname(os.path.abspath(dest))
    bases = [(folder, False)]
    if with_previous:
        os.makedirs(os.path.join(folder, PREVIOUS), exist_ok=True)
        bases.append((os.path.join(folder, PREVIOUS), True))
    for base, previous in bases:
        for name in names:
            target = _link_target(dest, name, previous)
            if _readlink(os.path.join(base, name)) != target and not os.path.lexists(os.path.join(base, name)):
                _flip(base, name, target)


def set_file(dest: str, number: str, name: str) -> str:
    """The file `name` of the set `number` (read as a plain path: no link to resolve)."""
    return os.path.join(sets_dir(dest), number, name)


def repair(dest: str, names: Sequence[str]) -> None:
    """Under the lock: the links a writer killed after its flip did not make yet."""
    current = current_set(dest)
    if current is not None:
        ensure_links(dest, names, with_previous=previous_set(dest, current) is not None)


def collect(dest: str) -> List[str]:
    """Under the lock: remove the set folders `current` no longer reaches and what a killed writer left in the
    sets folder. Returns the names removed."""
    sets = sets_dir(dest)
    if not os.path.isdir(sets):
        return []
    current = current_set(dest)
    keep = {current, previous_set(dest, current), CURRENT}
    removed = [n for n in sorted(os.listdir(sets)) if n not in keep and (_NUMBER.match(n) or n.startswith("."))]
    for number in (n for n in keep if n and n != CURRENT and os.path.isdir(os.path.join(sets, n))):
        removed += [os.path.join(number, t) for t in sorted(os.listdir(os.path.join(sets, number)))
                    if t.startswith(".")]  # a link a killed rollback was about to flip
    for name in removed:
        remove_path(os.path.join(sets, name))
    return removed


def migrate(dest: str, names: Sequence[str]) -> bool:
    """Under the lock: today's flat layout at `dest` (its files, and a previous set in previous/) becomes two set
    folders and the links; every step leaves the same bytes at the same names, and a crash is finished by the
    next writer. Returns True when there was something to migrate."""
    folder = os.path.dirname(os.path.abspath(dest))
    backup = os.path.join(folder, PREVIOUS)
    flat = [os.path.join(base, n) for base in (folder, backup) for n in names]
    if not any(os.path.isfile(p) and not os.path.islink(p) for p in flat):
        return False
    if current_set(dest) is None:  # a migration killed before its flip, or a copy that resolved the links
        remove_path(sets_dir(dest))

        def files(base: str) -> Dict[str, str]:
            return {n: os.path.join(base, n) for n in names if os.path.isfile(os.path.join(base, n))}

        kept = _new_set(dest, files(backup), None, True) if os.path.isfile(os.path.join(backup, names[0])) else None
        _flip(sets_dir(dest), CURRENT, _new_set(dest, files(folder), kept, True))
    for path in flat:
        previous = os.path.dirname(path) == backup
        target = _link_target(dest, os.path.basename(path), previous)
        in_set = os.path.join(os.path.dirname(path), target)
        if os.path.isfile(path) and not os.path.islink(path) and os.path.isfile(in_set):
            if not filecmp.cmp(path, in_set, shallow=False):
                raise EdgeError("{}: a file that is not part of the installed set {}; move it away".format(
                    path, os.path.relpath(os.path.realpath(in_set), folder)))
            _flip(os.path.dirname(path), os.path.basename(path), target)
    ensure_links(dest, names, with_previous=os.path.isdir(backup))
    return True
