"""Captures: one source of BGR frames each (synthetic, image folder, video file or OpenCV capture), and the end of
a file source (SourceEnded). Cameras and streams build on OpenCVCapture in
edge/sources/gstreamer.py; edge/sources/source.py maps a URI to a capture, which a FrameReader (edge/sources/reader.py)
reads in its own thread for its Camera."""

import os
import time
from typing import Any, Dict, List, Optional

import numpy as np

from edge.errors import EdgeError, require
from edge.inputs import read_image

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


class SourceEnded(Exception):
    """A file or folder without `loop` has no more frames."""


class Capture:
    """One device or file: open(), read() -> BGR image or None at the end, close(). read(into=buffer) may return the
    frame in `buffer` (an HxWx3 uint8 array, e.g. the GPU's page-locked staging buffer), saving a copy later; a
    capture that cannot returns its own array, and the consumer copies."""

    description = ""
    pacer: Optional["_Pacer"] = None  # generated and file frames are paced like a camera
    live = False  # a camera or stream: a read failure is a fault to reconnect from, not the end of the run

    def open(self) -> None:
        raise NotImplementedError

    def pace(self) -> None:
        """Wait until the next frame is due (not counted as capture time)."""
        if self.pacer is not None:
            self.pacer.wait()

    def read(self, into: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Pacer:
    """Sleeps so that successive reads happen at `fps` (camera-like pacing for generated and file frames)."""

    def __init__(self, fps: float):
        self.period = 1.0 / fps
        self.next_at = 0.0

    def wait(self) -> None:
        now = time.monotonic()
        if self.next_at > now:
            time.sleep(self.next_at - now)
            now = self.next_at
        self.next_at = max(self.next_at + self.period, now)


class SyntheticCapture(Capture):
    """Moving colour gradients with a bright square: cheap to produce, non-trivial to classify."""

    live = True  # stands in for a camera

    def __init__(self, width: int, height: int, fps: float, variants: int = 16):
        self.description = "synthetic {}x{}@{:g}".format(width, height, fps)
        self.width, self.height, self.variants = width, height, variants
        self.pacer = _Pacer(fps)
        self.frames: List[np.ndarray] = []
        self.index = 0

    def open(self) -> None:
        ys, xs = np.mgrid[0:self.height, 0:self.width].astype(np.float32)
        for k in range(self.variants):
            phase = 2 * np.pi * k / self.variants
            img = np.empty((self.height, self.width, 3), np.uint8)
            img[:, :, 0] = 127 + 120 * np.sin(xs / 97.0 + phase)
            img[:, :, 1] = 127 + 120 * np.sin(ys / 71.0 - phase)
            img[:, :, 2] = 127 + 120 * np.sin((xs + ys) / 131.0 + 2 * phase)
            size = max(8, min(self.width, self.height) // 5)
            x0 = int((self.width - size) * (0.5 + 0.4 * np.cos(phase)))
            y0 = int((self.height - size) * (0.5 + 0.4 * np.sin(phase)))
            img[y0:y0 + size, x0:x0 + size] = 255
            self.frames.append(img)

    def read(self, into: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        frame = self.frames[self.index % self.variants]
        self.index += 1
        if into is not None and into.shape == frame.shape:
            np.copyto(into, frame)  # a camera's driver writes there; here, the reader's thread copies
            return into
        return frame


class ImageFolderCapture(Capture):
    def __init__(self, folder: str, fps: float, loop: bool):
        self.description = "images " + folder
        self.folder, self.loop = folder, loop
        self.pacer = _Pacer(fps)
        self.files: List[str] = []
        self.skipped: Dict[str, str] = {}
        self.index = 0

    def open(self) -> None:
        # listed, not globbed: a folder named `cam[1]` is a path, never a pattern. A subfolder (`sub.jpg/`) is not
        # an image; other odd entries (a FIFO, a dangling link) are skipped by read() and named if none is left.
        try:
            self.files = sorted(entry.path for entry in os.scandir(self.folder)
                                if entry.name.lower().endswith(IMAGE_EXTENSIONS) and not entry.is_dir())
        except OSError as exc:
            raise EdgeError("{}: cannot list the image folder: {}".format(self.folder, exc.strerror or exc)) from None
        if not self.files:
            raise EdgeError("{}: image folder has no images ({})".format(self.folder, " ".join(IMAGE_EXTENSIONS)))

    def read(self, into: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        while self.files:
            if self.index >= len(self.files):
                if not self.loop:
                    return None
                self.index = 0
            path = self.files[self.index]
            _, image, why = read_image(path)
            if image is not None:
                self.index += 1
                return image
            self.skipped[os.path.basename(path)] = why  # dropped from the loop, named if none is left
            del self.files[self.index]
        raise EdgeError("{}: no readable image in the folder ({})".format(
            self.folder, "; ".join("{}: {}".format(k, v) for k, v in list(self.skipped.items())[:5])))


class OpenCVCapture(Capture):
    """cv2.VideoCapture on a file or an RTSP URL (FFmpeg)."""

    def __init__(self, target: Any, api: int, description: str, fps: float = 0.0, loop: bool = False,
                 is_file: bool = False):
        self.target, self.api, self.description = target, api, description
        self.loop, self.is_file = loop, is_file
        self.live = not is_file
        self.pacer = _Pacer(fps) if is_file else None
        self.cap: Any = None

    def open(self) -> None:
        self.cap = require("cv2").VideoCapture(self.target, self.api)
        if not self.cap.isOpened():
            raise EdgeError("{}: cannot open {}".format(self.description, "video file" if self.is_file else "source"))

    def read(self, into: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        ok, image = self.cap.read(into)  # OpenCV decodes into `into` when its shape fits, else into a new array
        if not ok and self.is_file and self.loop:
            self.cap.set(require("cv2").CAP_PROP_POS_FRAMES, 0)
            ok, image = self.cap.read(into)
            if not ok:  # some containers (a 1-frame clip) cannot seek back: start the file again
                self.close()
                self.open()
                ok, image = self.cap.read(into)
        if not ok:
            return None
        return image if image.ndim == 3 else np.ascontiguousarray(np.dstack([image] * 3))

    def close(self) -> None:
        if self.cap is not None:
            self.cap.release()
            self.cap = None


def broken_image(image: Any) -> bool:
    """True for what a failing camera or decoder hands over instead of a frame: empty, wrong shape or dtype."""
    return (not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3
            or image.shape[2] != 3 or image.shape[0] == 0 or image.shape[1] == 0)
