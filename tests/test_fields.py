"""edge.fields, on a small declaration of its own: a mapping is built into it key by key (an unknown key, a wrong
type or a control character refused naming the dotted key), checked against its choices, ranges and lengths, reloaded
by each key's policy, and a command's options go to flags and back unchanged."""

import argparse
import dataclasses
from typing import List

import pytest

from edge.errors import EdgeError
from edge.fields import APPLY, add_flags, as_argv, build, example, options_from, reloaded, section, setting, validate


@dataclasses.dataclass
class Camera:
    fps: float = setting(30.0, "frames a second", low=1, high=120, reload=APPLY)
    mode: str = setting("auto", "exposure", choices=("auto", "off", "on"))


@dataclasses.dataclass
class Settings:
    camera: Camera = section(Camera)
    size: List[int] = setting([4, 3], "width and height", low=1, high=8, length=2)


@dataclasses.dataclass
class Options:
    frames: int = setting(10, "timed frames", low=1, high=100, flag="--frames")
    batch: List[int] = setting([1], "batch sizes", low=1, high=8, flag="--batch")
    tag: List[str] = setting([], "tags", flag="--tag")
    quiet: bool = setting(False, "say less", flag="--quiet")


def test_a_mapping_is_built_key_by_key_and_a_bad_key_or_value_is_named():
    built = build(Settings, {"camera": {"fps": 25, "mode": False}, "size": [8, 6]}, "edge.yaml")
    assert built == Settings(Camera(fps=25.0, mode="off"), [8, 6])  # YAML 1.1's `off` is the word it spells
    for data, says in (({"camera": {"rate": 1}}, "unknown key 'camera.rate' (expected one of: fps, mode)"),
                       ({"camera": {"fps": True}}, "'camera.fps' must be a number, got True"),
                       ({"camera": {"fps": 1e400}}, "'camera.fps' must be a finite number"),
                       ({"camera": {"mode": "a\x1b[31m"}}, "'camera.mode' must not contain control characters"),
                       ({"size": [1, "2"]}, "'size[1]' must be an integer"), ({"camera": 3}, "'camera' must be a map")):
        with pytest.raises(EdgeError) as err:
            build(Settings, data, "edge.yaml")
        assert str(err.value).startswith("edge.yaml: ") and says in str(err.value), str(err.value)


def test_choices_ranges_and_lengths_are_checked_naming_the_key():
    for settings, says in ((Settings(Camera(fps=0.5)), "'camera.fps' must be between 1 and 120, got 0.5"),
                           (Settings(Camera(mode="dusk")), "'camera.mode' must be one of auto|off|on, got 'dusk'"),
                           (Settings(size=[4, 3, 2]), "'size' must list 2 numbers")):
        with pytest.raises(EdgeError, match="^edge.yaml: " + says.replace("|", r"\|").replace(".", r"\.")):
            validate(settings, "edge.yaml")
    validate(Settings(), "edge.yaml")


def test_a_reload_applies_the_keys_declared_so_and_names_the_others():
    running = Settings()
    new = Settings(Camera(fps=15.0, mode="on"), [2, 2])
    applied, restart = reloaded(running, new)
    assert applied == Settings(Camera(fps=15.0)) and restart == ["camera.mode", "size"]


def test_options_go_to_flags_and_back_unchanged_and_out_of_bounds_is_one_line_naming_the_flag():
    parser = argparse.ArgumentParser()
    add_flags(parser, Options, "frames", "batch", "tag", "quiet")
    options = Options(frames=5, batch=[2, 4], tag=["front", "back door"], quiet=True)
    assert options_from(parser.parse_args(as_argv(options)), Options) == options
    assert options_from(parser.parse_args([]), Options) == Options()
    assert options_from(parser.parse_args(["--batch", "4,1,4"]), Options).batch == [1, 4]
    with pytest.raises(EdgeError, match="^--frames must be between 1 and 100, got 0$"):
        options_from(parser.parse_args(["--frames", "0"]), Options)


def test_the_example_yaml_has_every_key_with_its_default_and_help():
    text = example(Settings, "# settings")
    assert text.splitlines()[:3] == ["# settings", "", "camera:"]
    assert "  fps: 30.0" in text and "# frames a second (SIGHUP applies)" in text
    assert "# auto | off | on; exposure" in text and "size: [4, 3]" in text
