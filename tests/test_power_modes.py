"""The maximum power mode by watts, from the board's own nvpmodel.conf (edge.board): MAXN where the board has one,
else the most watts its mode names give, ties broken by the cores a mode leaves online, "unknown" rather than a
guess. On the three boards of tests/nvpmodel/ (see its README.md), through `edge doctor`'s power line."""

import os
import stat
from pathlib import Path

import pytest

from edge import board
from edge.cli.doctor import check_power

FIXTURES = Path(__file__).resolve().parent / "nvpmodel"
BOARDS = {  # fixture: (the maximum mode, a lower mode the board may be in)
    "xavier_nx_r35.conf": ("MODE_20W_6CORE (8)", ("MODE_15W_2CORE", 0)),
    "orin_nano_8gb_super_r36.conf": ("MAXN_SUPER (2)", ("15W", 0)),
    "agx_orin_64gb_r36.conf": ("MAXN (0)", ("MODE_50W", 3)),
}


def fake_jetson(tmp_path: Path, conf: str, mode: str, mode_id: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """A root with the board's nvpmodel.conf, and an `nvpmodel -q` on PATH that answers `mode`."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nv_tegra_release").write_text("# R36 (release), REVISION: 4.3, GCID: 1, BOARD: generic\n",
                                                   encoding="utf-8")
    (root / "etc" / "nvpmodel.conf").write_text((FIXTURES / conf).read_text(encoding="utf-8"), encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvpmodel = bin_dir / "nvpmodel"
    nvpmodel.write_text("#!/bin/sh\necho 'NV Power Mode: {}'\necho {}\n".format(mode, mode_id), encoding="utf-8")
    nvpmodel.chmod(nvpmodel.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", "{}{}{}".format(bin_dir, os.pathsep, os.environ["PATH"]))
    return str(root)


@pytest.mark.parametrize("conf", sorted(BOARDS))
def test_doctor_names_the_boards_maximum_mode(tmp_path: Path, conf: str, monkeypatch: pytest.MonkeyPatch) -> None:
    top, (lower, lower_id) = BOARDS[conf]
    assert str(board.max_power_mode(board.power_modes((FIXTURES / conf).read_text(encoding="utf-8")))) == top
    status, what, detail = check_power(fake_jetson(tmp_path, conf, lower, lower_id, monkeypatch))
    assert (status, what) == ("warn", "power")
    assert "nvpmodel is '{}', not the maximum power mode {}".format(lower, top) in detail
    assert "sudo nvpmodel -m {}".format(top.split("(")[1].rstrip(")")) in detail


@pytest.mark.parametrize("conf", sorted(BOARDS))
def test_at_the_maximum_mode_nothing_is_said_about_it(tmp_path: Path, conf: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    top = BOARDS[conf][0]
    name, mode_id = top.split(" (")[0], int(top.split("(")[1].rstrip(")"))
    state, warnings = board.clock_state(fake_jetson(tmp_path, conf, name, mode_id, monkeypatch))
    assert state["nvpmodel_max"] is True and state["nvpmodel_max_mode"] == top
    assert not any("power mode" in w for w in warnings)


def test_xavier_nx_modes_parse_with_watts_and_cores() -> None:
    modes = board.power_modes((FIXTURES / "xavier_nx_r35.conf").read_text(encoding="utf-8"))
    assert [(m.id, m.watts, m.cores) for m in modes] == [
        (0, 15, 2), (1, 15, 4), (2, 15, 6), (3, 10, 2), (4, 10, 4), (5, 10, 4), (6, 20, 2), (7, 20, 4), (8, 20, 6)]


@pytest.mark.parametrize("conf", [
    "< POWER_MODEL ID=0 NAME=15W >\nCPU_ONLINE CORE_0 1\n< POWER_MODEL ID=1 NAME=MY_TUNED_MODE >\n"
    "CPU_ONLINE CORE_0 1\n",
    "< POWER_MODEL ID=0 NAME=MODE_20W_A >\nCPU_ONLINE CORE_0 1\n< POWER_MODEL ID=1 NAME=MODE_20W_B >\n"
    "CPU_ONLINE CORE_0 1\n",
    "",
], ids=["a mode without watts", "a tie the cores do not break", "no modes"])
def test_unknown_rather_than_a_guess(tmp_path: Path, conf: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert board.max_power_mode(board.power_modes(conf)) is None
    root = fake_jetson(tmp_path, "xavier_nx_r35.conf", "15W", 0, monkeypatch)
    Path(root, "etc", "nvpmodel.conf").write_text(conf, encoding="utf-8")
    state, warnings = board.clock_state(root)
    assert state["nvpmodel_max"] is None and state["nvpmodel_max_mode"] is None
    assert any("the maximum power mode is unknown" in w for w in warnings)
