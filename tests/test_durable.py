"""edge.store.durable: what a crash must not undo or confuse. A folder held by a living writer is never taken for
a leftover; one whose writer died is; a name is handed out without creating anything; two paths swap in one step or
say they cannot; removal never follows a link."""

import fcntl
import os
import subprocess
import sys

from edge.store import durable


def is_abandoned(path):
    with durable.abandoned(path) as left:
        return left


def test_a_held_folder_is_a_leftover_only_once_its_writer_has_ended(tmp_path):
    work = str(tmp_path / ".work")
    with durable.held_folder(work):
        assert os.path.isdir(work) and durable.held_here(work)
        assert not is_abandoned(work)  # this process's flock: a sweep leaves it alone
    assert not durable.held_here(work) and is_abandoned(work)


def test_a_folder_held_by_another_living_process_is_not_abandoned(tmp_path):
    work = str(tmp_path / ".work")
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom edge.store import durable\n"
                               "with durable.held_folder(sys.argv[1]):\n    print('held', flush=True)\n"
                               "    sys.stdin.read()\n", work], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              encoding="utf-8")
    try:
        assert holder.stdout.readline() == "held\n"
        assert not is_abandoned(work) and not durable.held_here(work)
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert is_abandoned(work)  # its writer ended: a crash's leftover from now on


def test_a_sweep_between_a_writers_mkdir_and_its_flock_neither_removes_its_folder_nor_leaves_it_unheld(
        tmp_path, monkeypatch):
    """Two writers of one set (edge calibrate import twice): the second's sweep finds the first's new folder before
    the first holds it. The sweep holds what it removes, so the writer waits, sees its folder gone and makes it
    again; and a sweep's probe never leaves the writer without its flock."""
    work = str(tmp_path / ".set.tmp-0123456789abcdef")
    flock, swept = fcntl.flock, []

    def sweep_first(fd, how):
        if not swept:  # the other writer's sweep, right between this one's mkdir and its flock
            monkeypatch.setattr(fcntl, "flock", flock)
            with durable.abandoned(work) as left:
                swept.append(left)
                if left:
                    durable.remove_path(work)
        return flock(fd, how)

    monkeypatch.setattr(fcntl, "flock", sweep_first)
    with durable.held_folder(work):
        assert swept == [True]  # it was taken for a leftover and removed...
        assert os.path.isdir(work) and not is_abandoned(work)  # ...and the writer holds a folder of that name
    assert is_abandoned(work)


def test_a_link_or_a_missing_path_is_never_followed(tmp_path):
    target = tmp_path / "user"
    target.mkdir()
    (target / "keep.txt").write_text("mine\n", encoding="utf-8")
    link = tmp_path / ".work"
    link.symlink_to(target)
    assert is_abandoned(str(link))  # a link is never a writer's: removable as the link it is
    durable.remove_path(str(link))
    assert not os.path.lexists(str(link)) and (target / "keep.txt").read_text(encoding="utf-8") == "mine\n"
    assert not is_abandoned(str(tmp_path / "gone"))
    durable.remove_path(str(tmp_path / "gone"))  # absent is fine


def test_a_temporary_name_is_fresh_and_nothing_is_created(tmp_path):
    names = {durable.temp_name(str(tmp_path), ".m.", ".staged") for _ in range(50)}
    assert len(names) == 50 and os.listdir(str(tmp_path)) == []
    assert all(os.path.basename(n).startswith(".m.") and n.endswith(".staged") for n in names)


def test_exchange_swaps_two_paths_in_one_step_or_says_it_cannot(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "which").write_text("a", encoding="utf-8")
    b.write_text("b", encoding="utf-8")
    if durable.exchange(str(a), str(b)):
        assert (tmp_path / "b" / "which").read_text(encoding="utf-8") == "a"
        assert (tmp_path / "a").read_text(encoding="utf-8") == "b"
    else:  # no renameat2 here: nothing changed, the caller renames twice
        assert (a / "which").read_text(encoding="utf-8") == "a" and b.read_text(encoding="utf-8") == "b"


def test_fsync_tree_reaches_every_file_and_folder_but_no_link(tmp_path, monkeypatch):
    (tmp_path / "set" / "sub").mkdir(parents=True)
    (tmp_path / "set" / "sub" / "f").write_text("x", encoding="utf-8")
    (tmp_path / "set" / "link").symlink_to("/nonexistent")
    synced = []
    monkeypatch.setattr(durable, "fsync_path", synced.append)
    durable.fsync_tree(str(tmp_path / "set"))
    rel = [os.path.relpath(p, str(tmp_path)) for p in synced]
    assert rel == ["set/sub/f", "set/sub", "set"]  # children before their folder, the link skipped
