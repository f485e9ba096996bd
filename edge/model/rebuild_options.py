"""`edge rebuild`'s own flags with their defaults and bounds, declared once (edge.fields): the command line and a
RebuildJob built in code (edge.model.rebuild) read this one declaration. Light: read when the command registers."""

from dataclasses import dataclass

from edge.bench.check import CheckOptions
from edge.fields import declared_range, setting
from edge.model import capture_options as capture
from edge.uri import parse_source


def _source_or_empty(uri: str, name: str) -> None:
    if uri:
        parse_source(uri, name)


_CHECK_FRAMES = declared_range(CheckOptions, "frames")
_CHECK_WARMUP = declared_range(CheckOptions, "warmup")


@dataclass(frozen=True)
class RebuildOptions:
    """The capture (how many images it needs is the config's build.min_images, --min-images) and the latency
    check."""

    capture_frames: int = capture.capture_frames(3000)
    every: int = capture.every(15)
    max_images: int = capture.max_images(500)
    min_diff: float = capture.min_diff()
    check_frames: int = setting(300, "the latency check's timed frames", low=_CHECK_FRAMES[0],
                                high=_CHECK_FRAMES[1], flag="--check-frames")
    check_warmup: int = setting(20, "the latency check's warm-up frames", low=_CHECK_WARMUP[0],
                                high=_CHECK_WARMUP[1], flag="--check-warmup")
    check_source: str = setting("", "the latency check's source ('': the configured source; synthetic when the "
                                    "service holds the camera)", flag="--check-source", check=_source_or_empty)
