"""The one versioned-folder switch (edge.store.versions): links read back strictly (a `current` spelled `0001/`,
`./0001`, absolute or a loop is refused in one line naming it, and nothing is removed), nothing `current` or its
previous resolves to is ever removed, the folder fsynced after every flip and rename, folders replaced in place
with their previous kept, and a lock only its writer can open that names its holder."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from store_helpers import state_of

from edge.errors import EdgeError
from edge.fleet.releases import Device
from edge.store import artifact as af
from edge.store import durable, versions

from conftest import NOBODY, assert_refused, run_edge

quiet = lambda *a: None  # noqa: E731


def install(dest, model, tag):
    """`model` installed at `dest` with labels tag0..tag9, as a build installs it."""
    labels = af.staging_path(dest[:-5] + ".labels.txt")
    with open(labels, "w", encoding="utf-8") as fh:
        fh.write("".join("{}{}\n".format(tag, i) for i in range(10)))
    staged = af.staging_path(dest)
    shutil.copyfile(model, staged)
    try:
        af.install(dest, artifact=staged, info={"trained": False, "tag": tag}, labels=labels, log=quiet)
    finally:
        af.remove_quietly([staged, labels])


def two_sets(tmp_path, tiny_classifiers):
    """An engines folder with sets 0001 (previous) and 0002 (current); returns (dest, its sets folder)."""
    dest = str(tmp_path / "engines" / "m.int8.onnx")
    install(dest, tiny_classifiers[0], "a")
    install(dest, tiny_classifiers[1], "b")
    return dest, str(tmp_path / "engines" / "m.int8.onnx.sets")


def relink(path, target):
    os.symlink(target, path + ".new")
    os.replace(path + ".new", path)


def refused_in_one_line(act, *names):
    with pytest.raises(EdgeError) as err:
        act()
    line = str(err.value)
    assert "\n" not in line and all(str(n) in line for n in names), line
    return line


SPELLINGS = ("0002/", "./0002", "ABSOLUTE", "current", "LOOP")  # LOOP: current -> loop -> current


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_current_link_the_store_did_not_write_is_refused_and_nothing_is_removed(tiny_classifiers, tmp_path,
                                                                                  spelling):
    """`ln -sfn 0002/ current` (tab completion) was served, then the next writer removed both sets."""
    dest, sets = two_sets(tmp_path, tiny_classifiers)
    current = os.path.join(sets, "current")
    if spelling == "LOOP":
        os.symlink("current", os.path.join(sets, "loop"))
    relink(current, {"ABSOLUTE": os.path.join(sets, "0002"), "LOOP": "loop"}.get(spelling, spelling))
    before = state_of(tmp_path)
    refused_in_one_line(lambda: af.read_set(dest), current)  # a reader: served before
    refused_in_one_line(lambda: install(dest, tiny_classifiers[0], "c"), current)
    refused_in_one_line(lambda: af.rollback(dest, log=quiet), current)
    refused_in_one_line(lambda: af.writable_set(dest, "artifact"), current)  # a build's preflight
    assert_refused(run_edge("rollback", "--artifact", dest), current)
    assert state_of(tmp_path) == before  # nothing removed, nothing written


def test_doctor_no_longer_says_a_foreign_current_can_run(tiny_classifiers, tmp_path):
    dest, sets = two_sets(tmp_path, tiny_classifiers)
    config = tmp_path / "c.yaml"
    config.write_text("model: {{path: {}}}\nsource: {{uri: synthetic}}\n".format(dest), encoding="utf-8")
    current = os.path.join(sets, "current")
    proc = run_edge("doctor", "--config", config)
    assert current not in proc.stdout + proc.stderr, proc.stdout
    relink(current, "0002/")  # served, and doctor said the path could run
    proc = run_edge("doctor", "--config", config)
    assert proc.returncode == 1 and current in proc.stdout + proc.stderr, proc.stdout


def test_a_previous_link_the_store_did_not_write_is_refused_and_nothing_is_removed(tiny_classifiers, tmp_path):
    dest, sets = two_sets(tmp_path, tiny_classifiers)
    previous = os.path.join(sets, "0002", "previous")
    for target in ("../0001/", os.path.join(sets, "0001"), "previous"):
        relink(previous, target)
        before = state_of(tmp_path)
        refused_in_one_line(lambda: af.read_set(str(tmp_path / "engines" / "previous" / "m.int8.onnx")), previous)
        refused_in_one_line(lambda: install(dest, tiny_classifiers[0], "c"), previous)
        assert_refused(run_edge("rollback", "--artifact", dest), previous)
        assert state_of(tmp_path) == before, target


def test_a_flat_copy_beside_a_foreign_link_never_costs_the_sets_folder(tiny_classifiers, tmp_path):
    """`migrate` once removed the whole sets folder when flat files stood beside a `current` it did not read."""
    dest, sets = two_sets(tmp_path, tiny_classifiers)
    for name in ("m.int8.onnx", "m.int8.json", "m.int8.labels.txt"):  # the links replaced by copies of the files
        path = str(tmp_path / "engines" / name)
        data = open(path, "rb").read()
        os.unlink(path)
        with open(path, "wb") as fh:
            fh.write(data)
    relink(os.path.join(sets, "current"), "0002/")
    before = state_of(tmp_path)
    refused_in_one_line(lambda: install(dest, tiny_classifiers[0], "c"), os.path.join(sets, "current"))
    assert state_of(tmp_path) == before


def test_a_copy_that_resolved_the_links_migrates_as_its_plain_files(tiny_classifiers, tmp_path):
    dest, _ = two_sets(tmp_path / "a", tiny_classifiers)
    shutil.copytree(str(tmp_path / "a" / "engines"), str(tmp_path / "copy"))  # links followed: files and folders
    copy = str(tmp_path / "copy" / "m.int8.onnx")
    served = af.read_set(copy).labels
    with af.writing(str(tmp_path / "copy"), "test"):
        af.rollback(copy, log=quiet)
        af.rollback(copy, log=quiet)
    assert os.path.islink(copy) and af.read_set(copy).labels == served
    shutil.copytree(str(tmp_path / "a" / "engines"), str(tmp_path / "copy2"))
    copied = tmp_path / "copy2" / "m.int8.onnx.sets" / "current" / "m.int8.labels.txt"
    with open(str(copied), "a", encoding="utf-8") as fh:
        fh.write("edited\n")  # a resolved `current` that is not the files beside it: not the store's
    refused_in_one_line(lambda: install(str(tmp_path / "copy2" / "m.int8.onnx"), tiny_classifiers[0], "c"),
                        os.path.join(str(tmp_path / "copy2"), "m.int8.onnx.sets", "current"))


def test_a_set_folder_that_is_a_symlink_loop_is_named_as_one(tiny_classifiers, tmp_path):
    dest, sets = two_sets(tmp_path, tiny_classifiers)
    shutil.rmtree(os.path.join(sets, "0002"))
    os.symlink("0002", os.path.join(sets, "0002"))
    line = refused_in_one_line(lambda: af.read_set(dest), os.path.join(sets, "0002"), "a loop")
    assert "not found" not in line
    os.symlink("loop", str(tmp_path / "loop"))  # a loop on the way to a plain model
    line = refused_in_one_line(lambda: af.read_set(str(tmp_path / "loop" / "m.onnx")), "symbolic links")
    assert "not found" not in line


def test_nothing_current_or_its_previous_resolves_to_is_removed(tiny_classifiers, tmp_path):
    dest, sets = two_sets(tmp_path, tiny_classifiers)
    kept = {n: state_of(os.path.join(sets, n)) for n in ("0001", "0002")}
    os.symlink("0002", os.path.join(sets, "0009"))  # leftovers that resolve to the sets kept
    os.symlink(os.path.join(sets, "0001"), os.path.join(sets, ".new-0123456789abcdef"))
    os.mkdir(os.path.join(sets, "0007"))  # a set no link reaches
    with af.writing(str(tmp_path / "engines"), "test"):
        removed = versions.collect(sets)
    assert sorted(removed) == [".new-0123456789abcdef", "0007", "0009"]
    assert {n: state_of(os.path.join(sets, n)) for n in ("0001", "0002")} == kept
    assert sorted(os.listdir(sets)) == ["0001", "0002", "current"]


def test_no_set_is_collected_while_no_current_names_one(tiny_classifiers, tmp_path):
    dest, sets = two_sets(tmp_path, tiny_classifiers)
    os.unlink(os.path.join(sets, "current"))  # removed by hand
    with af.writing(str(tmp_path / "engines"), "test"):
        assert versions.collect(sets) == []
    assert sorted(os.listdir(sets)) == ["0001", "0002"]


def recorded(monkeypatch):
    """[('rename', folder) | ('fsync', folder)] of every rename, exchange and fsync edge.store.versions makes."""
    events = []
    for name in ("rename", "replace"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda a, b, real=real, **at: (real(a, b, **at), events.append(
            ("rename", os.path.dirname(os.path.abspath(b))))
            if sys._getframe(1).f_globals["__name__"] == versions.__name__ else None)[0])
    real_exchange = durable.exchange
    monkeypatch.setattr(durable, "exchange", lambda a, b: (
        lambda done: (events.append(("rename", os.path.dirname(os.path.abspath(b)))) if done else None, done)[1])(
        real_exchange(a, b)))
    real_fsync = versions.fsync_path
    monkeypatch.setattr(versions, "fsync_path", lambda p: (real_fsync(p), events.append(("fsync", p)))[0])
    return events


def unsynced(events):
    """The renames not followed by an fsync of their folder before the next rename (or the end)."""
    left = []
    for i, (kind, folder) in enumerate(events):
        if kind == "rename":
            after = events[i + 1:]
            stop = next((j for j, e in enumerate(after) if e[0] == "rename"), len(after))
            if ("fsync", folder) not in after[:stop]:
                left.append((i, folder))
    return left


@pytest.mark.parametrize("can_exchange", [True, False])
def test_every_flip_and_rename_is_followed_by_an_fsync_of_its_folder(tiny_classifiers, tmp_path, monkeypatch,
                                                                     can_exchange):
    if not can_exchange:
        monkeypatch.setattr(durable, "exchange", lambda a, b: False)
    events = recorded(monkeypatch)
    dest, sets = two_sets(tmp_path, tiny_classifiers)
    af.rollback(dest, log=quiet)
    for n in ("old", "new"):
        os.makedirs(str(tmp_path / n))
        (tmp_path / n / "x").write_text(n, encoding="utf-8")
    versions.replace_folder(str(tmp_path / "old"), str(tmp_path / "cal"))
    versions.replace_folder(str(tmp_path / "new"), str(tmp_path / "cal"), previous=str(tmp_path / "cal.previous"))
    assert (tmp_path / "cal" / "x").read_text(encoding="utf-8") == "new"
    assert (tmp_path / "cal.previous" / "x").read_text(encoding="utf-8") == "old"
    assert sum(kind == "rename" for kind, _ in events) >= 10
    assert unsynced(events) == []


ASIDE = [  # (the aside's kind, `dest` there, `previous` given, where the old folder ends: a name or None)
    ("old", False, False, "cal"), ("keep", False, True, "cal"),  # killed before the new one landed: it goes back
    ("keep", True, True, "cal.previous"),  # after: kept as the previous its writer meant
    ("keep", True, False, "aside"),  # ... left for that writer's own recovery (a plain build's does not know it)
    ("old", True, True, None),  # a replaced folder its writer meant to drop (calibrate import)
]


@pytest.mark.parametrize("kind,dest_there,with_previous,ends", ASIDE)
def test_a_folder_left_aside_by_a_killed_writer_is_settled_as_its_writer_meant(tmp_path, kind, dest_there,
                                                                              with_previous, ends):
    cal, previous = str(tmp_path / "cal"), str(tmp_path / "cal.previous")
    aside = os.path.join(str(tmp_path), versions.temp_prefix(cal, kind) + "0123456789abcdef")
    os.makedirs(os.path.join(aside, "set"))
    with open(os.path.join(aside, "set", "x"), "w", encoding="utf-8") as fh:
        fh.write("old")
    if dest_there:
        os.makedirs(cal)
    versions.recover_folder(cal, previous=previous if with_previous else None)
    found = [p for p in (cal, previous, os.path.join(aside, "set")) if os.path.isfile(os.path.join(p, "x"))]
    assert found == ([] if ends is None else [os.path.join(aside, "set") if ends == "aside" else
                                              str(tmp_path / ends)])
    assert os.path.lexists(aside) == (ends == "aside")


def test_the_lock_file_is_the_writers_own_and_a_refusal_names_its_holder(tiny_classifiers, tmp_path):
    dest, _ = two_sets(tmp_path, tiny_classifiers)
    engines = str(tmp_path / "engines")
    lock = os.path.join(engines, versions.LOCK)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from edge.store import versions\nwith versions.lock(sys.argv[1], 't'):\n"
         "    print('held', flush=True); sys.stdin.read()", engines],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, encoding="utf-8")
    try:
        assert holder.stdout.readline().strip() == "held"
        st = os.lstat(lock)
        assert (st.st_uid, oct(st.st_mode & 0o777)) == (os.geteuid(), "0o600")
        assert_refused(run_edge("rollback", "--artifact", dest), engines, "pid {}".format(holder.pid))
    finally:
        holder.communicate("", timeout=60)
    assert not os.path.lexists(lock)
    assert run_edge("rollback", "--artifact", dest).returncode == 0


def test_a_planted_lock_file_is_refused_naming_it(tiny_classifiers, tmp_path):
    dest, _ = two_sets(tmp_path, tiny_classifiers)
    lock = str(tmp_path / "engines" / versions.LOCK)
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's file\n", encoding="utf-8")
    os.symlink(str(outside), lock)
    assert_refused(run_edge("rollback", "--artifact", dest), lock)
    assert outside.read_text(encoding="utf-8") == "the user's file\n"
    os.unlink(lock)
    with open(lock, "w", encoding="utf-8"):
        pass
    os.chmod(lock, 0o644)  # readable by others: not the 0600 lock a writer makes
    assert_refused(run_edge("rollback", "--artifact", dest), lock, "mode 644")
    assert os.path.isfile(lock)  # refused, not removed


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("flock")),
                    reason="needs root, setpriv and flock")
def test_nobody_can_neither_squat_nor_open_the_lock(tiny_classifiers):
    """`flock -n engines sleep 1e9` as nobody once stopped root's rollback, build and cache fetch."""
    top = tempfile.mkdtemp(prefix="edge-lock-")  # a folder nobody can enter (pytest's tmp_path is 0700)
    try:
        os.chmod(top, 0o755)
        dest = os.path.join(top, "engines", "m.int8.onnx")
        install(dest, tiny_classifiers[0], "a")
        install(dest, tiny_classifiers[1], "b")
        nobody = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
        folder = os.path.dirname(dest)
        squatter = subprocess.Popen(nobody + ["flock", "-n", folder, "sh", "-c", "echo held; exec cat"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, encoding="utf-8")
        try:
            assert squatter.stdout.readline().strip() == "held"
            with af.writing(folder, "test"):  # root holds the lock: nobody cannot even open its file
                opened = subprocess.run(nobody + ["flock", "-n", os.path.join(folder, versions.LOCK), "true"],
                                        capture_output=True, encoding="utf-8", errors="replace", timeout=60)
                assert opened.returncode != 0 and "Permission denied" in opened.stderr, opened.stderr
            proc = run_edge("rollback", "--artifact", dest)
            assert proc.returncode == 0, proc.stderr
        finally:
            squatter.communicate("", timeout=60)
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize("planted", ["folder", "file"])
def test_a_flip_through_a_folder_descriptor_replaces_a_link_and_nothing_else(tmp_path, monkeypatch, planted):
    """Root's release state (edge.fleet.releases) flips relative to the folder it walked without links: the flip
    is fsynced there, a removal too, and a folder or file where the link should be is refused and kept."""
    fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda n: (real_fsync(n), synced.append(n))[0])
    try:
        versions.flip(str(tmp_path), "current", target="releases/r1", dir_fd=fd)
        assert os.readlink(str(tmp_path / "current")) == "releases/r1" and synced == [fd]
        versions.flip(str(tmp_path), "current", target=None, dir_fd=fd)
        assert not os.path.lexists(str(tmp_path / "current")) and synced == [fd, fd]
        if planted == "folder":
            os.mkdir(str(tmp_path / "committed"))
        else:
            (tmp_path / "committed").write_text("x", encoding="utf-8")
        refused_in_one_line(lambda: versions.flip(str(tmp_path), "committed", target="releases/r1", dir_fd=fd),
                            tmp_path / "committed", "not a link")
        assert os.path.exists(str(tmp_path / "committed")) and not os.path.islink(str(tmp_path / "committed"))
        assert sorted(os.listdir(str(tmp_path))) == ["committed"]
    finally:
        os.close(fd)


HOLD = ("import sys; from edge.store import versions\nwith versions.lock(sys.argv[1], 'edge rollback'):\n"
        "    print('held', flush=True); sys.stdin.readline()\nprint('let go', flush=True); sys.stdin.read()")


def holder(folder):
    """Another process holding `folder`'s lock until a line comes on its stdin (then it says 'let go')."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            encoding="utf-8")
    assert proc.stdout.readline().strip() == "held"
    return proc


def let_go(proc):
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "let go"


def fake_clock(monkeypatch, on_wait=lambda: None):
    """edge.store.versions' clock and sleep on a fake clock (any other caller keeps the real ones): each wait moves
    it on and calls `on_wait`. Returns the waits."""
    now, waits = [0.0], []
    real_sleep, real_clock = time.sleep, time.monotonic

    def ours():
        return sys._getframe(2).f_globals["__name__"] == versions.__name__

    def sleep(s):
        if not ours():
            return real_sleep(s)
        waits.append(s)
        now[0] += s
        return on_wait()

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(time, "monotonic", lambda: now[0] if ours() else real_clock())
    return waits


def test_a_waiting_lock_is_taken_once_its_holder_lets_go(tmp_path, monkeypatch):
    """The fleet's release changes wait for the folder's one lock (`wait_s`), polling it: the first wait finds it
    another process's; once that one lets go, the next try takes it, with this pid in the lock file."""
    proc = holder(tmp_path)
    try:
        waits = fake_clock(monkeypatch, on_wait=lambda: let_go(proc) if len(waits) == 1 else None)
        with versions.lock(str(tmp_path), "a release change", wait_s=60):
            with open(str(tmp_path / versions.LOCK), encoding="utf-8") as fh:
                assert fh.read() == "{}\n".format(os.getpid())
        assert waits == [versions.POLL_S]
    finally:
        proc.communicate("", timeout=60)
    assert not os.path.lexists(str(tmp_path / versions.LOCK))


def test_a_waiting_lock_gives_up_after_wait_s_naming_the_holder(tmp_path, monkeypatch):
    proc = holder(tmp_path)
    try:
        waits = fake_clock(monkeypatch)
        with pytest.raises(versions.Busy) as busy:
            with versions.lock(str(tmp_path), "edge release try", wait_s=1.0):
                pass
        assert "pid {}".format(proc.pid) in str(busy.value) and "edge release try waited 1 s" in str(busy.value)
        assert sum(waits) == pytest.approx(1.0) and set(waits) == {versions.POLL_S}
        with pytest.raises(versions.Busy, match="waits for none"):  # no wait: refused at once, as before
            with versions.lock(str(tmp_path), "edge rollback"):
                pass
        assert len(waits) == 5
    finally:
        proc.communicate("", timeout=60)


def test_the_release_state_lock_is_the_versions_lock(tmp_path, monkeypatch):
    """A release change (edge.fleet.releases.Device.lock) and an `edge rollback`-style writer of the same folder
    take one lock: each waits for or is refused by the other, naming its pid, and the lock file goes with its
    holder. A lock file that is not this user's 0600 one is refused by both."""
    state = tmp_path / "state"
    os.makedirs(str(state / "releases"))
    proc = holder(state)
    try:
        with Device(str(state)).lock(0) as locked:
            assert not locked
        waits = fake_clock(monkeypatch, on_wait=lambda: let_go(proc))
        with Device(str(state)).lock(60) as locked:
            assert locked and waits == [versions.POLL_S]
            probe = subprocess.run([sys.executable, "-c", "import sys; from edge.store import versions\ntry:\n"
                                    "    with versions.lock(sys.argv[1], 'edge rollback'): pass\n"
                                    "except versions.Busy as busy:\n    sys.exit(str(busy))", str(state)],
                                   capture_output=True, encoding="utf-8", timeout=60)
            assert_refused(probe, state, "pid {}".format(os.getpid()), "edge rollback waits for none", code=1)
    finally:
        proc.communicate("", timeout=60)
    assert sorted(os.listdir(str(state))) == ["releases"]
    with open(str(state / versions.LOCK), "w", encoding="utf-8"):
        pass
    os.chmod(str(state / versions.LOCK), 0o644)
    refused_in_one_line(lambda: Device(str(state)).lock(0).__enter__(), state / versions.LOCK, "mode 644")
