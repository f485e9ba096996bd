"""edge.cli.common: the one error path of every command (one line, credentials masked, control characters escaped,
an exit code: 2 for bad input, 1 for a failure, 130 for Ctrl-C) and the config flags over a config file."""

import argparse
import errno

import pytest

from edge.cli.common import add_config_flags, config_from_args, execute
from edge.errors import EXIT_BAD_INPUT, EXIT_FAIL, EdgeError


def raising(exc):
    def command(args):
        raise exc
    return command


@pytest.mark.parametrize("exc, code, line", [
    (EdgeError("rtsp://admin:S3cretPass@cam/s: no frame\x1b[2J"), EXIT_BAD_INPUT,
     "edge run: error: rtsp://***@cam/s: no frame\\x1b[2J"),
    (EdgeError("gate failed", EXIT_FAIL), EXIT_FAIL, "edge run: error: gate failed"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "cfg.yaml"), EXIT_BAD_INPUT,
     "edge run: error: cfg.yaml: No such file or directory"),
    (OSError(errno.ENOSPC, "No space left on device", "engines/m.onnx"), EXIT_FAIL,
     "edge run: error: engines/m.onnx: No space left on device"),  # the disk, not the path given
    (KeyboardInterrupt(), 130, "edge run: interrupted")])
def test_a_failure_is_one_line_on_stderr_and_its_exit_code(capsys, exc, code, line):
    assert execute("edge run", raising(exc), argparse.Namespace()) == code
    out = capsys.readouterr()
    assert out.err == line + "\n" and out.out == ""


def test_a_command_returns_its_own_exit_code():
    assert execute("edge run", lambda args: 3, argparse.Namespace()) == 3


def test_config_flags_override_the_file_and_source_is_refused_where_the_file_lists_cameras(tmp_path):
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    single, cameras = tmp_path / "one.yaml", tmp_path / "many.yaml"
    single.write_text("runtime:\n  budget_ms: 50\nsource:\n  uri: synthetic\n", encoding="utf-8")
    cameras.write_text("sources:\n  - {name: a, uri: synthetic}\n  - {name: b, uri: synthetic}\n", encoding="utf-8")
    cfg = config_from_args(parser.parse_args(["--config", str(single), "--budget-ms", "20"]), serves_cameras=True)
    assert cfg.runtime.budget_ms == 20.0 and cfg.source.uri == "synthetic"
    with pytest.raises(EdgeError, match=r"^--source: .*many.yaml lists 2 cameras under 'sources'"):
        config_from_args(parser.parse_args(["--config", str(cameras), "--source", "synthetic"]), serves_cameras=True)
