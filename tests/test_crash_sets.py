"""SIGKILL at chosen moments of every writer of a set (issue 32): rollback, the build's install, calibrate import and
cache fetch, each the real CLI in its own process (tests/crash_driver.py), and the rebuild's calibration-set swap
(edge.store.versions.replace_folder, settled by the next rebuild's recover_sets), killed right after each of its
renames and after a few seeded random steps of any kind. Afterwards a reader gets a whole set, old or new, never an
artifact with another set's labels; what was installed with a previous one can still be rolled back (and back);
and the next writer leaves no temporary file behind.

A kill right after a rename is the widest window there is (strace's `inject=rename:delay_exit` only widens the
time before the same point), so the kills here cover the windows the issue widened with strace.
"""

import os
import shutil

import pytest
import yaml
from store_helpers import debris, kill_points, killed

from edge.config import load_config
from edge.model import engine_cache
from edge.model.calibration import import_calibration_set, load_calibration_set
from edge.model.plan import check_inputs
from edge.store import artifact as af
from edge.store.versions import recover_folder, temp_prefix

from conftest import REPO

quiet = lambda *a: None  # noqa: E731


def labels_of(tag):
    return ["{}{}".format(tag, i) for i in range(10)]


def served(dest):
    """(artifact sha256, labels) a reader gets from `dest` (edge.store.artifact.read_set, what every load uses), or None
    when nothing is installed. A torn set raises."""
    if not os.path.lexists(dest) or not os.path.exists(dest):
        return None
    model = af.read_set(dest)
    return model.sha256, tuple(model.labels or ())


def stage_set(folder, name, model, tag):
    """A plain model with its own labels, as an export leaves it (no model info: any provenance, gated as trained,
    so the builds below declare these random-weight models --untrained)."""
    os.makedirs(folder, exist_ok=True)
    shutil.copyfile(model, os.path.join(folder, name + ".onnx"))
    with open(os.path.join(folder, name + ".labels.txt"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(labels_of(tag)) + "\n")
    return os.path.join(folder, name + ".onnx")


def install_set(dest, model, tag):
    labels = af.staging_path(dest[:-5] + ".labels.txt")
    with open(labels, "w", encoding="utf-8") as fh:
        fh.write("\n".join(labels_of(tag)) + "\n")
    staged = af.staging_path(dest)
    shutil.copyfile(model, staged)
    try:
        af.install(dest, artifact=staged, info={"trained": False, "tag": tag}, labels=labels, log=quiet)
    finally:
        af.remove_quietly([staged, labels])
    return af.sha256_file(dest), tuple(labels_of(tag))


def rolls_back(dest, before):
    """`edge rollback` twice from what a reader gets now: the other whole set, then this one again."""
    with af.writing(os.path.dirname(dest), "test"):
        af.rollback(dest, log=quiet)
    other = served(dest)
    assert other is not None and other != before
    with af.writing(os.path.dirname(dest), "test"):
        af.rollback(dest, log=quiet)
    assert served(dest) == before
    return other


def test_rollback_killed_at_any_moment_leaves_a_whole_set_that_rolls_back(tiny_classifiers, tmp_path):
    dest = str(tmp_path / "engines" / "m.int8.onnx")
    a, b = install_set(dest, tiny_classifiers[0], "a"), install_set(dest, tiny_classifiers[1], "b")
    points = kill_points("rollback", "rollback", "--artifact", dest)
    assert served(dest) == b  # the counting runs rolled back twice
    for kind, k in points:
        killed(k, kind, "rollback", "--artifact", dest)
        now = served(dest)
        assert now in (a, b), (kind, k)
        assert rolls_back(dest, now) in (a, b), (kind, k)
        with af.writing(os.path.dirname(dest), "test"):  # the next writer's sweep
            pass
        assert debris(str(tmp_path / "engines")) == [], (kind, k)
    assert len(points) >= 4


def test_the_split_of_a_stems_shared_sets_killed_at_any_moment_is_finished_by_the_next_writer(
        tiny_classifiers, tmp_path, monkeypatch):
    from edge.store import layout

    shared, engines = tmp_path / "shared", tmp_path / "engines"
    onnx, engine = str(engines / "m.int8.onnx"), str(engines / "m.int8.engine")
    with monkeypatch.context() as before:  # the layout before: one m.int8.sets for every artifact of the stem
        before.setattr(layout, "sets_dir", layout._shared_dir)
        before.setattr(layout, "_unshare", lambda dest, names: None)
        other = install_set(str(engines / "e.int8.onnx"), tiny_classifiers[0], "x")  # another stem: its own writer's
        install_set(str(engines / "m.int8.engine"), tiny_classifiers[0], "e")
        a, b = install_set(onnx, tiny_classifiers[0], "a"), install_set(onnx, tiny_classifiers[1], "b")
    assert os.readlink(engine) == "m.int8.sets/current/m.int8.engine" and not os.path.exists(engine)
    shutil.copytree(str(engines), str(shared), symlinks=True)

    def prepare():
        shutil.rmtree(str(engines))
        shutil.copytree(str(shared), str(engines), symlinks=True)

    points = kill_points("split", "rollback", "--artifact", onnx, prepare=prepare)
    for kind, k in points:
        prepare()
        killed(k, kind, "rollback", "--artifact", onnx)
        now = served(onnx)  # old links or new, each names a whole set
        assert now in (a, b), (kind, k)
        assert rolls_back(onnx, now) in (a, b), (kind, k)  # the next writer finishes the split
        assert sorted(n for n in os.listdir(str(engines)) if n.endswith(".sets")) == [
            "e.int8.sets", "m.int8.onnx.sets"] and served(str(engines / "e.int8.onnx")) == other, (kind, k)
        assert not os.path.lexists(engine) and debris(str(engines)) == [], (kind, k)
    assert len(points) >= 4


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """A calibration and a regression set of three shipped images each."""
    tmp = tmp_path_factory.mktemp("sets")
    images = sorted(f for f in os.listdir(os.path.join(REPO, "calibration", "default")) if f.endswith(".jpg"))
    out = []
    for name, chosen in (("cal", images[:3]), ("reg", images[3:6])):
        raw = tmp / ("raw-" + name)
        raw.mkdir()
        for image in chosen:
            shutil.copy(os.path.join(REPO, "calibration", "default", image), str(raw))
        out.append(str(tmp / name))
        import_calibration_set(str(raw), out[-1], 1, log=quiet)
    return out


def build_config(tmp_path, name, source, sets):
    config = tmp_path / (name + ".yaml")
    config.write_text(yaml.safe_dump({
        "model": {"path": source}, "backend": {"kind": "onnxruntime"},
        "build": {"engines_dir": str(tmp_path / name), "calibration_dir": sets[0], "regression_dir": sets[1],
                  "min_images": 1, "precision": "int8", "method": "minmax"}}), encoding="utf-8")
    return str(config)


def test_build_killed_during_its_install_never_pairs_an_artifact_with_other_labels(tiny_classifiers, sets, tmp_path):
    source = stage_set(str(tmp_path / "src"), "m", tiny_classifiers[0], "a")
    config = build_config(tmp_path, "engines", source, sets)
    assert killed(0, "rename", "build", "--config", config, "--no-progress", "--untrained")[0] == 0
    dest = str(tmp_path / "engines" / "m.int8.onnx")
    expected = {af.sha256_file(tiny_classifiers[0]): tuple(labels_of("a")),
                af.sha256_file(tiny_classifiers[1]): tuple(labels_of("b"))}
    first = served(dest)
    stage_set(str(tmp_path / "src"), "m", tiny_classifiers[1], "b")  # the next build: another model, other labels

    def reset():  # back to the first build's set (the second kept as previous), as before each kill
        if served(dest) != first:
            with af.writing(os.path.dirname(dest), "test"):
                af.rollback(dest, log=quiet)
        assert served(dest) == first

    build = ("build", "--config", config, "--no-progress", "--untrained")
    killed(0, "rename", *build)  # the links previous/ needs, made once
    points = kill_points("build", *build, prepare=reset)
    for kind, k in points:
        reset()
        killed(k, kind, *build)
        now = served(dest)
        source_sha = af.read_model_info(dest)["source"]["sha256"]
        assert now[1] == expected[source_sha], (kind, k)  # the labels of the model it was built from
        assert rolls_back(dest, now) is not None, (kind, k)
        with af.writing(os.path.dirname(dest), "test"):
            pass
        assert debris(str(tmp_path / "engines")) == [], (kind, k)


def old_and_new_images(tmp_path):
    """Two folders of shipped calibration images to import, tmp_path/raw-old (2) and tmp_path/raw-new (3 others)."""
    shipped = os.path.join(REPO, "calibration", "default")
    images = sorted(f for f in os.listdir(shipped) if f.endswith(".jpg"))
    raws = []
    for name, chosen in (("old", images[:2]), ("new", images[2:5])):
        raws.append(tmp_path / ("raw-" + name))
        raws[-1].mkdir()
        for image in chosen:
            shutil.copy(os.path.join(shipped, image), str(raws[-1]))
    return raws


def test_calibrate_import_killed_at_any_moment_leaves_the_old_or_the_new_set(tmp_path):
    raws = old_and_new_images(tmp_path)
    out = str(tmp_path / "set")
    held = 0
    for no_exchange in ("0", "1"):  # RENAME_EXCHANGE, and a filesystem without it (two renames, an orphan restored)
        env = {"EDGE_TEST_NO_EXCHANGE": no_exchange}
        argv = ("calibrate", "import", raws[1], out, "--min-images", "1")

        def prepare():
            import_calibration_set(str(raws[0]), out, 1, log=quiet)

        prepare()
        old = load_calibration_set(out).sha256
        killed(0, "rename", *argv, env=env)
        new = load_calibration_set(out).sha256
        for kind, k in kill_points("import" + no_exchange, *argv, env=env, prepare=prepare):
            prepare()
            killed(k, kind, *argv, env=env)
            recover_folder(out)  # what the next import, capture or build does first
            assert load_calibration_set(out).sha256 in (old, new), (no_exchange, kind, k)
            assert debris(str(tmp_path)) == [], (no_exchange, kind, k)
            held += 1
    assert held >= 6


def test_cache_fetch_killed_at_any_moment_installs_whole_or_nothing(tiny_classifiers, sets, tmp_path):
    source = stage_set(str(tmp_path / "src"), "m", tiny_classifiers[0], "a")
    canary = build_config(tmp_path, "canary", source, sets)
    assert killed(0, "rename", "build", "--config", canary, "--no-progress", "--untrained")[0] == 0
    cache = str(tmp_path / "cache")
    engine_cache.publish(check_inputs(load_config(canary), show_progress=False), cache, log=quiet)
    device = build_config(tmp_path, "device", source, sets)
    dest = str(tmp_path / "device" / "m.int8.onnx")
    fetched = served(str(tmp_path / "canary" / "m.int8.onnx"))
    kept = []

    def prepare():
        shutil.rmtree(str(tmp_path / "device"), ignore_errors=True)
        kept[:] = [install_set(dest, tiny_classifiers[1], "x")]  # what the device served before the fetch

    for kind, k in kill_points("fetch", "cache", "fetch", cache, "--config", device, prepare=prepare):
        prepare()
        killed(k, kind, "cache", "fetch", cache, "--config", device)
        now = served(dest)
        assert now in (kept[0], fetched), (kind, k)
        if now == fetched:
            assert rolls_back(dest, now) == kept[0], (kind, k)
        with af.writing(os.path.dirname(dest), "test"):
            pass
        assert debris(str(tmp_path / "device")) == [], (kind, k)


def test_what_a_killed_rebuild_left_of_the_calibration_sets_is_settled_by_the_next(tmp_path):
    """The rebuild installs the artifact, then swaps the captured set in (edge.store.versions.replace_folder:
    exchange, or the old set renamed aside first); killed in between, its next run puts the set the installed
    artifact records in build.calibration_dir and the old one in `.previous`."""
    from types import SimpleNamespace

    from edge.config import with_overrides
    from edge.model.rebuild import RebuildJob, recover_sets

    raws = old_and_new_images(tmp_path)
    cal, staged = str(tmp_path / "cal"), str(tmp_path / "cal.rebuild-20261201T000000Z")
    job = RebuildJob(with_overrides(load_config(None), {"build.calibration_dir": cal}), stamp="20261202T000000Z")
    artifact = str(tmp_path / "engines" / "m.int8.onnx")
    lines = []
    aside = os.path.join(str(tmp_path), temp_prefix(cal, "keep") + "0123456789abcdef")  # a previous to keep
    for killed_at in ("between the two renames", "after the exchange", "before the swap", "with the old set aside",
                      "after the new set landed, the old one aside"):
        shutil.rmtree(str(tmp_path / "engines"), ignore_errors=True)
        for path in (cal, staged, job.previous_set):
            shutil.rmtree(path, ignore_errors=True)
        import_calibration_set(str(raws[0]), cal, 1, log=quiet)
        import_calibration_set(str(raws[1]), staged, 1, log=quiet)
        old, new = load_calibration_set(cal).sha256, load_calibration_set(staged).sha256
        staged_artifact = af.staging_path(artifact)
        with open(staged_artifact, "wb") as fh:
            fh.write(b"the rebuilt artifact")
        af.install(artifact, artifact=staged_artifact, info={"trained": False, "calibration": {"sha256": new}},
                   log=quiet)  # installed first: its model info records the captured set
        af.remove_quietly([staged_artifact])
        if killed_at == "between the two renames":
            os.rename(cal, job.previous_set)
        elif killed_at == "after the exchange":
            os.rename(cal, cal + ".x")
            os.rename(staged, cal)
            os.rename(cal + ".x", staged)
        elif killed_at.endswith("aside"):
            os.mkdir(aside)
            os.rename(cal, os.path.join(aside, "set"))
            if killed_at.startswith("after the new set landed"):
                os.rename(staged, cal)
        recover_sets(job, SimpleNamespace(artifact=artifact), lines.append)
        assert load_calibration_set(cal).sha256 == new, killed_at
        assert load_calibration_set(job.previous_set).sha256 == old, killed_at
        assert sorted(n for n in os.listdir(str(tmp_path)) if n.lstrip(".").startswith("cal")) == \
            ["cal", "cal.previous"], killed_at


def test_the_rebuilds_set_swap_killed_at_any_moment_is_settled_by_the_next(tmp_path):
    """The rebuild's swap (an older `.previous` discarded, then replace_folder with the old set kept as
    `.previous`) killed after each rename and at seeded random steps, with and without RENAME_EXCHANGE: the next
    rebuild's `recover_sets` leaves the set the installed artifact records in build.calibration_dir, the old one in
    `.previous`, and nothing else."""
    from types import SimpleNamespace

    from edge.config import with_overrides
    from edge.model.rebuild import RebuildJob, recover_sets

    raws = old_and_new_images(tmp_path)
    older = tmp_path / "raw-older"  # the `.previous` of an earlier rebuild, replaced by this one
    older.mkdir()
    shipped = os.path.join(REPO, "calibration", "default")
    shutil.copy(os.path.join(shipped, sorted(f for f in os.listdir(shipped) if f.endswith(".jpg"))[5]), str(older))
    work = tmp_path / "work"
    cal, staged = str(work / "cal"), str(work / "cal.rebuild-20261201T000000Z")
    job = RebuildJob(with_overrides(load_config(None), {"build.calibration_dir": cal}), stamp="20261202T000000Z")
    artifact = str(tmp_path / "engines" / "m.int8.onnx")
    held = 0

    def prepare():
        shutil.rmtree(str(work), ignore_errors=True)
        import_calibration_set(str(raws[0]), cal, 1, log=quiet)
        import_calibration_set(str(raws[1]), staged, 1, log=quiet)
        import_calibration_set(str(older), job.previous_set, 1, log=quiet)

    prepare()
    old, new = load_calibration_set(cal).sha256, load_calibration_set(staged).sha256
    staged_artifact = af.staging_path(artifact)
    with open(staged_artifact, "wb") as fh:
        fh.write(b"the rebuilt artifact")
    af.install(artifact, artifact=staged_artifact, info={"trained": False, "calibration": {"sha256": new}}, log=quiet)
    af.remove_quietly([staged_artifact])  # installed first: its model info records the captured set
    for no_exchange in ("0", "1"):
        env = {"EDGE_TEST_NO_EXCHANGE": no_exchange}
        argv = ("install-set", staged, cal, job.previous_set)
        for kind, k in kill_points("swap" + no_exchange, *argv, env=env, prepare=prepare):
            prepare()
            killed(k, kind, *argv, env=env)
            recover_folder(cal)  # a plain `edge build` first (what its check_inputs does): nothing of this is its own
            recover_sets(job, SimpleNamespace(artifact=artifact), quiet)
            assert load_calibration_set(cal).sha256 == new, (no_exchange, kind, k)
            assert load_calibration_set(job.previous_set).sha256 == old, (no_exchange, kind, k)
            assert sorted(os.listdir(str(work))) == ["cal", "cal.previous"], (no_exchange, kind, k)
            held += 1
    assert held >= 6
