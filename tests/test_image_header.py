"""edge.image_header: an image's width and height read from its header alone, for every format OpenCV writes (and a
GIF's), as OpenCV encodes them; a truncated or unknown header is None, never an exception."""

import cv2
import numpy as np
import pytest

from edge.image_header import image_size

WIDTH, HEIGHT = 37, 23  # odd, and neither a multiple of the other


@pytest.mark.parametrize("ext, params", [
    (".png", []), (".jpg", []), (".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]), (".bmp", []),
    (".webp", [cv2.IMWRITE_WEBP_QUALITY, 80]), (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101]),  # VP8 and lossless VP8L
    (".ppm", []), (".pgm", []), (".tiff", [])])
def test_the_size_is_read_from_the_header_of_what_opencv_writes(ext, params):
    image = np.random.default_rng(0).integers(0, 255, (HEIGHT, WIDTH, 3), np.uint8)
    if ext == ".pgm":
        image = image[:, :, 0]
    ok, data = cv2.imencode(ext, image, params)
    assert ok
    assert image_size(data.tobytes()) == (WIDTH, HEIGHT)


def test_a_gif_and_a_pnm_with_a_comment_are_read_too():
    gif = b"GIF89a" + WIDTH.to_bytes(2, "little") + HEIGHT.to_bytes(2, "little") + b"\x00" * 8
    assert image_size(gif) == (WIDTH, HEIGHT)
    assert image_size(b"P6\n# made by hand\n37 23\n255\n" + b"\x00" * 9) == (WIDTH, HEIGHT)


@pytest.mark.parametrize("data", [b"", b"\x89PNG\r\n\x1a\n\x00", b"\xff\xd8\xff", b"II*\x00\xff\xff\xff\xff",
                                  b"P6\n#only a comment\n", b"RIFF\x00\x00\x00\x00WEBPVP9 ", b"plain text"])
def test_a_truncated_or_unknown_header_is_none(data):
    assert image_size(data) is None
