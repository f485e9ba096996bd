"""edge.sources.capture: what each kind of source reads (a video file, a folder of images, the synthetic camera), read
through the service's camera path."""

import numpy as np
import service_helpers as sh

from edge.config import SourceConfig
from edge.sources.source import SourceEnded, open_capture

from conftest import write_video


def grab_all(cfg, limit=1000):
    reader = sh.CameraReader(open_capture(cfg))
    frames = []
    try:
        while len(frames) < limit:
            frames.append(reader.get())
    except SourceEnded:
        pass
    finally:
        reader.stop()
    return frames, reader.stats()


def test_video_file_frames_match_what_was_written(tmp_path):
    written = write_video(tmp_path / "clip.avi", frames=12)
    frames, stats = grab_all(SourceConfig(uri=str(tmp_path / "clip.avi"), fps=1000, loop=False))
    assert len(frames) + stats["skipped"] == 12
    assert [f.seq for f in frames] == sorted(f.seq for f in frames)
    first = frames[0]
    assert first.image.shape == (240, 320, 3) and first.image.dtype == np.uint8
    # MJPG is lossy: close to what was written, not equal
    assert np.abs(first.image.astype(int) - written[first.seq - 1]).mean() < 6


def test_video_file_loops(tmp_path):
    write_video(tmp_path / "clip.avi", frames=5)
    frames, _ = grab_all(SourceConfig(uri=str(tmp_path / "clip.avi"), fps=2000, loop=True), limit=14)
    assert len(frames) == 14


def test_image_folder_reads_images_and_skips_non_images(tmp_path):
    import cv2

    for i in range(3):
        cv2.imwrite(str(tmp_path / "img{}.png".format(i)), np.full((50, 60, 3), i * 80, np.uint8))
    (tmp_path / "notes.txt").write_text("not an image", encoding="utf-8")
    frames, stats = grab_all(SourceConfig(uri=str(tmp_path), fps=1000, loop=False))
    assert len(frames) + stats["skipped"] == 3
    assert all(f.image.shape == (50, 60, 3) for f in frames)


def test_a_folder_source_is_listed_as_a_path_and_only_its_files_are_images(tmp_path):
    """`cam[1]/` is the folder of that name (never a glob matching `cam1/`); a subfolder named like an image is
    skipped, not read (issue 19 item 10)."""
    import cv2

    folder, decoy = tmp_path / "cam[1]", tmp_path / "cam1"
    for path, value in ((folder, 200), (decoy, 10)):
        path.mkdir()
        cv2.imwrite(str(path / "a.png"), np.full((20, 30, 3), value, np.uint8))
    (folder / "sub.jpg").mkdir()
    (folder / "sub.jpg" / "inner.png").write_bytes(b"")
    frames, stats = grab_all(SourceConfig(uri=str(folder), fps=1000, loop=False))
    assert [int(f.image.mean()) for f in frames] == [200] and stats["broken"] == 0


def test_synthetic_source_is_paced():
    reader = sh.CameraReader(open_capture(SourceConfig(width=64, height=48, fps=50)))
    try:
        frames = [reader.get() for _ in range(10)]
    finally:
        reader.stop()
    assert frames[0].image.shape == (48, 64, 3)
    span = frames[-1].captured - frames[0].captured
    assert span >= 0.8 * 0.02 * (frames[-1].seq - frames[0].seq)  # never faster than 50 fps, however idle
