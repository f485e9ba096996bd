"""The calibration capture's flags, declared once with their help and bounds (edge.fields): `edge calibrate
capture` and `edge rebuild` each declare their options with these, giving their own defaults (a rebuild reads a
live camera, so it stops after a number of frames). How many images are needed is the config's build.min_images
(--min-images). Light: read when the commands are registered."""

from dataclasses import dataclass
from typing import Any

from edge.fields import setting

DEFAULT_MIN_DIFF = 4.0  # grey levels (0-255) below which a captured frame counts as a near-duplicate
MAX_FRAMES = 10 ** 12


def capture_frames(default: int) -> Any:
    return setting(default, "frames to read from the source (0: to its end)", low=0, high=MAX_FRAMES,
                   flag="--capture-frames")


def every(default: int) -> Any:
    return setting(default, "keep every k-th frame", low=1, high=MAX_FRAMES, flag="--every")


def max_images(default: int) -> Any:
    return setting(default, "stop after this many images", low=1, high=1000000, flag="--max-images")


def min_diff() -> Any:
    return setting(DEFAULT_MIN_DIFF, "near-duplicate threshold: mean grey-level difference of 16x16 thumbnails",
                   low=0.0, high=255.0, flag="--min-diff")


@dataclass(frozen=True)
class CaptureOptions:
    """`edge calibrate capture`'s own flags."""

    capture_frames: int = capture_frames(0)
    every: int = every(30)
    max_images: int = max_images(500)
    min_diff: float = min_diff()
