"""edge.inputs: every file a user hands in is read bounded and refused in one line naming it: too big, not UTF-8,
not JSON, a repeated key, nesting too deep, or not a regular file (a FIFO is named, never opened for long)."""

import os

import pytest

from edge.errors import EdgeError
from edge.inputs import load_json, read_regular


@pytest.mark.parametrize("content, why", [
    (b'{"a": 1, "a": 2}', 'the record repeats the key "a"'),
    (b"[" * 100000 + b"]" * 100000, "the record is nested too deeply"),
    (b"{nope", "the record is not JSON"),
    (b"\xff\xfe{}", "the record is not UTF-8 text (byte 0)"),
    (b" " * (2 << 20), "cannot read the record: larger than 1 MB"),
])
def test_a_bad_json_file_is_one_line_naming_it(tmp_path, content, why):
    path = tmp_path / "r.json"
    path.write_bytes(content)
    with pytest.raises(EdgeError) as refused:
        load_json(str(path), "record", max_bytes=1 << 20)
    assert str(refused.value).startswith("{}: {}".format(path, why)) and "\n" not in str(refused.value)


def test_a_json_file_within_bounds_is_read(tmp_path):
    (tmp_path / "r.json").write_text('{"a": [1, 2]}', encoding="utf-8")
    assert load_json(str(tmp_path / "r.json"), "record") == {"a": [1, 2]}
    with pytest.raises(EdgeError, match="r2.json: the record not found"):
        load_json(str(tmp_path / "r2.json"), "record")


def test_what_is_not_a_regular_file_is_named_not_read(tmp_path):
    os.mkfifo(str(tmp_path / "fifo"))  # opening it to read would block: O_NONBLOCK, then named
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dangling").symlink_to("gone")
    (tmp_path / "ok").write_bytes(b"data")
    (tmp_path / "link").symlink_to("ok")
    assert read_regular(str(tmp_path / "fifo")) == (None, "not a regular file (a FIFO)")
    assert read_regular(str(tmp_path / "loop")) == (None, "symlink loop")
    assert read_regular(str(tmp_path / "dangling")) == (None, "dangling link")
    assert read_regular(str(tmp_path / "link")) == (b"data", None)  # a link to a regular file is followed
    assert read_regular(str(tmp_path), 10)[1].startswith("not a regular file")
