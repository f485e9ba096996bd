"""edge.errors: one bounded, escaped line for any text (the HOSTILE_LINES), a long path cut in the middle so its end
still names the problem, an exception's first line, and a missing optional dependency named with how to install it."""

import sys

import pytest

from edge.errors import EXIT_BAD_INPUT, EdgeError, first_line, one_line, require

HOSTILE_LINES = ["a\x00b", "a\nb\r\nc", "\x1b[2J\x1b[31mred", "\u202eevil", "\x85next", "\udcff\udcfe",
                 "x" * 900000, "é" * 1000 + "\n" * 1000, "\u2028line"]


@pytest.mark.parametrize("text", HOSTILE_LINES)
def test_one_line_escapes_control_characters_and_bounds_the_length(text):
    line = one_line(text)
    assert len(line) <= 300 and line.isprintable()
    line.encode("utf-8")  # prints on any UTF-8 terminal: no lone surrogate


def test_a_long_path_is_cut_in_the_middle_and_its_end_still_names_the_file():
    line = one_line("cannot read " + "/data" * 200 + "/cameras/front.yaml: permission denied")
    assert len(line) <= 300 and line.startswith("cannot read /data/data") and " ... " in line
    assert line.endswith("/cameras/front.yaml: permission denied")
    assert one_line("short line") == "short line"


def test_first_line_is_the_messages_first_line_or_the_type_name():
    assert first_line(ValueError("bad value\nTraceback details")) == "bad value"
    assert first_line(KeyError()) == "KeyError" and first_line(OSError("  ")) == "OSError"


def test_a_missing_dependency_is_one_line_saying_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it fails, as where it is not installed
    with pytest.raises(EdgeError, match=r"^missing dependency 'matplotlib' .*: pip install 'jetson-edge\[check\]'$"):
        require("matplotlib")
    with pytest.raises(EdgeError, match=r"^missing dependency 'edge_no_such_module' .*: pip install \w+$") as err:
        require("edge_no_such_module")
    assert err.value.exit_code == EXIT_BAD_INPUT
