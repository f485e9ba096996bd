"""An artifact's names on edge.store.versions' numbered sets: the fixed links beside it and in previous/, read by
`resolve`, made by `ensure_links` (through versions.flip), and today's flat layout migrated (`migrate`). Only
edge.store.artifact uses this module; it knows file names, not what the files mean.

    <folder>/m.int8.onnx            -> m.int8.onnx.sets/current/m.int8.onnx
    <folder>/previous/m.int8.onnx   -> ../m.int8.onnx.sets/current/previous/m.int8.onnx

Each artifact has its own sets, named from its whole file name: m.int8.onnx and m.int8.engine never share one, and
the names they share (m.int8.json, m.int8.labels.txt: each reader takes them from its artifact's set) link to the
last installed. The one folder per stem they shared before (m.int8.sets) is split by the next writer (`_unshare`).
"""

import filecmp
import os
import stat
from typing import Dict, Optional, Sequence, Tuple

from edge.errors import EdgeError
from edge.inputs import file_kind
from edge.store import versions
from edge.store.durable import fsync_path, remove_path, temp_name
from edge.store.versions import CURRENT, PREVIOUS, SETS, flip, require_lock


def sets_dir(dest: str) -> str:
    return os.path.abspath(dest) + SETS


def _shared_dir(dest: str) -> str:
    """The sets folder every artifact of `dest`'s stem shared before (split by `_unshare`)."""
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


def _sets_of_link(path: str, previous: bool) -> Optional[str]:
    """The sets folder a link at `path` names when the store wrote it (for any artifact of the folder), else None."""
    parts = (_readlink(path) or "").split("/")
    if previous and parts[:1] != [".."]:
        return None
    parts = parts[1:] if previous else parts
    middle = [CURRENT, PREVIOUS] if previous else [CURRENT]
    if len(parts) == len(middle) + 2 and parts[1:-1] == middle and parts[-1] == os.path.basename(path) \
            and parts[0].endswith(SETS) and not parts[0].startswith("."):
        return parts[0]
    return None


def current_set(dest: str) -> Optional[str]:
    """The number `current` names (None: no set installed here); a link the store did not write is refused."""
    return versions.current(sets_dir(dest))


def previous_set(dest: str, number: Optional[str]) -> Optional[str]:
    """The number the set `number` replaced, or None."""
    return versions.previous(sets_dir(dest), number)


def set_file(dest: str, *, number: str, name: str) -> str:
    """The file `name` of the set `number` (read as a plain path: no link to resolve)."""
    return os.path.join(sets_dir(dest), number, name)


def resolve(path: str) -> Tuple[str, bool]:
    """(the folder whose files a reader of `path` reads, True when it is a set folder). A link made here (at the
    artifact's name or in previous/) resolves `current` once, strictly, so every file comes from one set; anything
    else reads the files beside `path` (today's layout, a user's own model)."""
    here, link = os.path.dirname(os.path.abspath(path)), _readlink(path) or ""
    parts = os.path.dirname(link).split("/")
    if os.path.basename(link) != os.path.basename(path):
        return here, False
    if len(parts) == 2 and parts[0].endswith(SETS) and parts[1] == CURRENT:
        sets, previous = os.path.join(here, parts[0]), False
    elif len(parts) == 4 and parts[0] == ".." and parts[1].endswith(SETS) and parts[2:] == [CURRENT, PREVIOUS]:
        sets, previous = os.path.join(os.path.dirname(here), parts[1]), True
    else:
        return here, False
    number = versions.current(sets)
    number = versions.previous(sets, number) if previous else number
    return os.path.join(sets, number or CURRENT), True


def check_names(dest: str, names: Sequence[str], what: Sequence[str]) -> None:
    """Before a writer changes anything: each name beside `dest` and in previous/ is absent, a file (today's
    layout) or a link the store made (to this artifact's sets, a sibling's, or the stem's shared ones from before),
    and the sets' links are the store's; anything else is refused, naming it."""
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
            if stat.S_ISREG(mode) or _sets_of_link(path, previous):
                continue
            raise EdgeError("{}: {} is {}; refusing to use it".format(path, kind, file_kind(mode)))
    sets = sets_dir(dest)
    if os.path.lexists(sets) and (os.path.islink(sets) or not os.path.isdir(sets)):
        raise EdgeError("{}: is not a folder (a symlink?); refusing to write through it (remove it)".format(sets))
    if not _resolved_copy(dest, names):
        previous_set(dest, current_set(dest))


def _resolved_copy(dest: str, names: Sequence[str], sets: str = "") -> bool:
    """True for a copy that resolved the links (cp -rL, scp -r, shutil.copytree): `current` a folder whose files
    are byte for byte the plain files beside `dest`, so migrating those loses nothing."""
    folder, current = os.path.dirname(os.path.abspath(dest)), os.path.join(sets or sets_dir(dest), CURRENT)
    if os.path.islink(current) or not os.path.isdir(current):
        return False
    present = [n for n in names if os.path.lexists(os.path.join(current, n))]
    return bool(present) and all(os.path.isfile(os.path.join(folder, n)) and not os.path.islink(
        os.path.join(folder, n)) and filecmp.cmp(os.path.join(folder, n), os.path.join(current, n), shallow=False)
        for n in present)


def commit(dest: str, files: Dict[str, str], *, keep_previous: bool) -> str:
    """Install `files` ({name: path}, the artifact's name among them) as the set at `dest`: written whole, then
    one flip. The set it replaces stays reachable as previous (`keep_previous`) or is removed. Returns the new
    set's folder."""
    require_lock(os.path.dirname(os.path.abspath(dest)))
    sets, current = sets_dir(dest), current_set(dest)
    number = versions.new_set(sets, files, current if keep_previous else None)
    flip(sets, CURRENT, target=number)
    ensure_links(dest, list(files), with_previous=keep_previous and current is not None, claim=True)
    versions.collect(sets)
    return os.path.join(sets, number)


def commit_files(dest: str, files: Dict[str, str], *, last: str) -> None:
    """Install `files` ({name: path}) as plain files beside `dest` (an export: files that travel), `last` renamed
    last: a reader checks the others against it, so a crash between the renames is refused, never served."""
    folder = os.path.dirname(os.path.abspath(dest))
    require_lock(folder)
    previous_set(dest, current_set(dest))  # a set layout these files replace: only one the store wrote
    for name in sorted(files, key=lambda n: n == last):
        tmp = temp_name(folder, "." + name + ".", ".staged")
        try:
            versions._place(files[name], tmp, False)
            os.replace(tmp, os.path.join(folder, name))
        finally:
            remove_path(tmp)
    fsync_path(folder)
    remove_path(sets_dir(dest))


def swap_with_previous(dest: str) -> Tuple[str, str]:
    """Rollback's flip (versions.swap_with_previous) of `dest`'s sets."""
    require_lock(os.path.dirname(os.path.abspath(dest)))
    return versions.swap_with_previous(sets_dir(dest))


def remove(dest: str, names: Sequence[str]) -> None:
    """Under the lock: `dest`'s links (the artifact's first: nothing half-removed is served) and its sets."""
    folder = os.path.dirname(os.path.abspath(dest))
    require_lock(folder)
    previous_set(dest, current_set(dest))  # only sets the store wrote
    for base, previous in ((folder, False), (os.path.join(folder, PREVIOUS), True)):
        for name in names:
            if _readlink(os.path.join(base, name)) == _link_target(dest, name, previous):
                os.unlink(os.path.join(base, name))
    remove_path(sets_dir(dest))


def ensure_links(dest: str, names: Sequence[str], *, with_previous: bool = True, claim: bool = False) -> None:
    """The fixed links beside `dest` and (`with_previous`) in previous/: made once, a missing one made; `claim`
    (an install): a name another artifact's set holds (a shared companion) links to this one's."""
    folder = os.path.dirname(os.path.abspath(dest))
    bases = [(folder, False)]
    if with_previous:
        os.makedirs(os.path.join(folder, PREVIOUS), exist_ok=True)
        bases.append((os.path.join(folder, PREVIOUS), True))
    for base, previous in bases:
        for name in names:
            target = _link_target(dest, name, previous)
            path = os.path.join(base, name)
            if _readlink(path) != target and (not os.path.lexists(path) or claim and _sets_of_link(path, previous)):
                flip(base, name, target=target)


def repair(dest: str, names: Sequence[str]) -> None:
    """Under the lock: the links a writer killed after its flip did not make yet."""
    current = current_set(dest)
    if current is not None:
        ensure_links(dest, names, with_previous=previous_set(dest, current) is not None)


def settle(dest: str, names: Sequence[str]) -> None:
    """Under the lock, before a writer changes anything: today's flat layout migrated, the links a killed writer
    did not make made, and the sets `current` no longer reaches removed (versions.collect)."""
    _unshare(dest, names)
    migrate(dest, names)
    repair(dest, names)
    versions.collect(sets_dir(dest))


def migrate(dest: str, names: Sequence[str]) -> bool:
    """Under the lock: today's flat layout at `dest` (its files, and a previous set in previous/) becomes two set
    folders and the links; every step leaves the same bytes at the same names, and a crash is finished by the
    next writer (sets a killed migration numbered but never flipped to are collected after the flip; a sets
    folder is never removed whole). A copy that resolved the links migrates as the plain files it holds.
    Returns True when there was something to migrate."""
    folder = os.path.dirname(os.path.abspath(dest))
    backup = os.path.join(folder, PREVIOUS)
    flat = [os.path.join(base, n) for base in (folder, backup) for n in names]
    if not any(os.path.isfile(p) and not os.path.islink(p) for p in flat):
        return False
    if _resolved_copy(dest, names):
        remove_path(os.path.join(sets_dir(dest), CURRENT))  # its bytes are the plain files migrated below
    if current_set(dest) is None:

        def files(base: str) -> Dict[str, str]:
            return {n: os.path.join(base, n) for n in names if os.path.isfile(os.path.join(base, n))}

        sets = sets_dir(dest)
        kept = versions.new_set(sets, files(backup), None, link=True) if os.path.isfile(
            os.path.join(backup, names[0])) else None
        flip(sets, CURRENT, target=versions.new_set(sets, files(folder), kept, link=True))
    for path in flat:
        previous = os.path.dirname(path) == backup
        target = _link_target(dest, os.path.basename(path), previous)
        in_set = os.path.join(os.path.dirname(path), target)
        if os.path.isfile(path) and not os.path.islink(path) and os.path.isfile(in_set):
            if not filecmp.cmp(path, in_set, shallow=False):
                raise EdgeError("{}: a file that is not part of the installed set {}; move it away".format(
                    path, os.path.relpath(os.path.realpath(in_set), folder)))
            flip(os.path.dirname(path), os.path.basename(path), target=target)
    ensure_links(dest, names, with_previous=os.path.isdir(backup))
    return True


def _unshare(dest: str, names: Sequence[str]) -> None:
    """Under the lock: the sets folder `dest`'s stem shared (m.int8.sets, where an engine's install left
    m.int8.onnx naming nothing) split into each artifact's own: the sets holding it (current, then previous) hard
    linked into <artifact>.sets, the links flipped, the shared folder discarded. Every link names a whole set
    throughout; a crash is finished by the next writer."""
    folder, shared = os.path.dirname(os.path.abspath(dest)), _shared_dir(dest)
    owner = shared[:-len(SETS)]  # an artifact without a suffix (m) owns m.sets: not a shared folder
    if not os.path.isdir(shared) or os.path.islink(shared) or _sets_of_link(owner, False) or shared == sets_dir(dest):
        return
    copied = os.path.join(shared, CURRENT)
    if os.path.isdir(copied) and not os.path.islink(copied) and _resolved_copy(dest, [
            f for f in os.listdir(copied) if f != PREVIOUS], shared):
        versions.discard(shared, shared)  # its bytes are the plain files `migrate` takes
        return
    now = versions.current(shared)
    chain = [n for n in (now, versions.previous(shared, now)) if n]
    companions = set(names) - {os.path.basename(dest)}
    artifacts = []  # the artifact of `current` first: the shared names link to it
    for number in chain:
        artifacts += sorted(f for f in os.listdir(os.path.join(shared, number)) if f not in companions
                            and f != PREVIOUS and not f.startswith(".") and f not in artifacts)
    for artifact in artifacts:
        own = sets_dir(os.path.join(folder, artifact))
        if versions.current(own) is None:
            kept = None
            for number in reversed([n for n in chain if os.path.isfile(os.path.join(shared, n, artifact))]):
                held = {f: os.path.join(shared, number, f) for f in sorted(companions) + [artifact]
                        if os.path.isfile(os.path.join(shared, number, f))}
                kept = versions.new_set(own, held, kept, link=True)
            flip(own, CURRENT, target=kept)
    for base, previous in ((folder, False), (os.path.join(folder, PREVIOUS), True)):
        for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            if _sets_of_link(os.path.join(base, name), previous) != os.path.basename(shared):
                continue
            targets = [_link_target(os.path.join(folder, a), name, previous)
                       for a in ([name] if name in artifacts else artifacts)]
            found = next((t for t in targets if os.path.isfile(os.path.join(base, t))), None)
            if found is None:
                os.unlink(os.path.join(base, name))  # named nothing whole: the bug this split ends
            else:
                flip(base, name, target=found)
        if os.path.isdir(base):
            fsync_path(base)
    versions.discard(shared, shared)
