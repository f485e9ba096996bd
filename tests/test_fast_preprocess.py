"""The fast CPU preprocessing (OpenCV box average + bilinear at the exact positions) against the exact filter
(CpuPreprocessor) on photographs at camera sizes; small frames get the exact filter itself; the service chooses it.
Its speed is benchmarks/preprocess_speed.py's."""

import cv2
import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.infer.preprocess import CpuPreprocessor, FastPreprocessor

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def frames(width, height):
    import skimage.data

    return [cv2.resize(np.ascontiguousarray(getattr(skimage.data, name)()[:, :, ::-1]), (width, height),
                       interpolation=cv2.INTER_CUBIC) for name in PHOTOS]


@pytest.mark.parametrize("size", [(1280, 720), (1281, 721), (1920, 1080), (3840, 2160), (720, 1280)])
@pytest.mark.parametrize("cfg", [PreprocessConfig(),
                                 PreprocessConfig(resize=320, crop=288, mean=[127 / 255] * 3, std=[128 / 255] * 3)],
                         ids=["imagenet", "resize320-crop288"])
def test_within_0_02_of_the_exact_filter_at_camera_sizes(size, cfg):
    fast, exact = FastPreprocessor(cfg), CpuPreprocessor(cfg)
    diffs = [float(np.abs(fast(f).copy() - exact(f)).mean()) for f in frames(*size)]
    assert fast._plans[(size[1], size[0])] is not None  # the premise: the fast path ran, not the exact one
    assert np.mean(diffs) <= 0.02 and max(diffs) <= 0.025, diffs


@pytest.mark.parametrize("size", [(640, 480), (320, 240), (100, 60)])
def test_small_frames_get_the_exact_filter(size):
    fast, exact = FastPreprocessor(PreprocessConfig()), CpuPreprocessor(PreprocessConfig())
    for frame in frames(*size)[:2]:
        np.testing.assert_array_equal(fast(frame), exact(frame))


def test_refuses_what_is_no_bgr_frame():
    with pytest.raises(ValueError):
        FastPreprocessor(PreprocessConfig())(np.zeros((720, 1280), np.uint8))
