"""An image's width and height from its header, read before anything decodes it (a pixel bomb is refused
unread: edge.inputs.read_image)."""

import struct
from typing import Optional, Tuple


def image_size(data: bytes) -> Optional[Tuple[int, int]]:
    """(width, height) from the header of a PNG, JPEG, GIF, BMP, WebP, PNM or TIFF; None when not found."""
    try:
        if data[:8] == b"\x89PNG\r\n\x1a\n":
            return struct.unpack(">II", data[16:24])
        if data[:6] in (b"GIF87a", b"GIF89a"):
            return struct.unpack("<HH", data[6:10])
        if data[:2] == b"BM":
            w, h = struct.unpack("<ii", data[18:26])
            return abs(w), abs(h)
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return _webp_size(data)
        if data[:2] == b"\xff\xd8":
            return _jpeg_size(data)
        if data[:2] in (b"II", b"MM"):
            return _tiff_size(data)
        if data[:1] == b"P" and data[1:2] in b"123456":
            fields = b" ".join(ln.split(b"#")[0] for ln in data[2:4096].splitlines()).split()
            return int(fields[0]), int(fields[1])
    except (struct.error, ValueError, IndexError):
        return None
    return None


def _webp_size(data: bytes) -> Optional[Tuple[int, int]]:
    chunk = data[12:16]
    if chunk == b"VP8X":
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if chunk == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    return None


def _jpeg_size(data: bytes) -> Optional[Tuple[int, int]]:
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 1 if marker == 0xFF else 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return w, h
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    return None


def _tiff_size(data: bytes) -> Optional[Tuple[int, int]]:
    end = "<" if data[:2] == b"II" else ">"
    (offset,) = struct.unpack(end + "I", data[4:8])
    (count,) = struct.unpack(end + "H", data[offset:offset + 2])
    size = {}
    for n in range(count):
        tag, typ, _, value = struct.unpack(end + "HHI4s", data[offset + 2 + 12 * n:offset + 14 + 12 * n])
        if tag in (256, 257):
            size[tag] = struct.unpack(end + ("H" if typ == 3 else "I"), value[:2 if typ == 3 else 4])[0]
    return (size[256], size[257]) if len(size) == 2 else None
