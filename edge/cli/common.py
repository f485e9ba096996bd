"""What every command shares: config flags, registration, and the one error path (one line, an exit code)."""

import argparse
import errno
import os
import signal
import sys
from typing import Any, Callable, Dict, Optional, Sequence

from edge import interrupts
from edge.config import Config, load_config
from edge.errors import EXIT_BAD_INPUT, EXIT_FAIL, EdgeError, first_line, one_line
from edge.fields import add_flags, flag_values
from edge.uri import argv_note, redact

Handler = Callable[[argparse.Namespace], int]
_NOT_THE_PATH = (errno.ENOSPC, errno.EDQUOT, errno.EIO)  # the disk, not the path the user gave: exit 1


PIPELINE_KEYS = ("source.uri", "model.path", "runtime.budget_ms", "backend.kind", "preprocess.device")


def add_config_flags(p: argparse.ArgumentParser, *keys: str) -> None:
    """--config and the flags of config `keys` (default: those of every command that runs the pipeline); each
    flag overrides its key, with the type, choices and help declared in edge/config.py."""
    p.add_argument("--config", help="YAML config (see configs/example.yaml)")
    add_flags(p, Config, *(keys or PIPELINE_KEYS))


def config_from_args(args: argparse.Namespace, extra: Optional[Dict[str, Any]] = None, *,
                     serves_cameras: bool = False) -> Config:
    """The config file named by --config with the config flags given (and `extra` keys) applied.
    `serves_cameras`: the command serves the config's cameras (`sources`, else `source`), so --source with a
    config that lists cameras is refused rather than silently ignored."""
    uri = getattr(args, "source.uri", None)
    note = argv_note(uri) if isinstance(uri, str) else None
    if note:  # before the flags are checked: a refused URI still says where its credentials belong
        print(note, file=sys.stderr)
    flags = flag_values(args, Config)
    flags.update({k: v for k, v in (extra or {}).items() if v is not None})
    path = getattr(args, "config", None)
    if serves_cameras and uri is not None and path is not None:
        listed = load_config(path).sources  # as the file has them: --source would fill a camera's left-out uri
        if listed:
            raise EdgeError("--source: {} lists {} cameras under 'sources', which --source does not replace; set "
                            "their uri there, or use a config without 'sources'".format(path, len(listed)))
    return load_config(path, flags)


def add_command(subparsers: Any, name: str, summary: str, description: Optional[str],
                add_arguments: Callable[[argparse.ArgumentParser], None], func: Handler,
                hangup_reloads: bool = False) -> argparse.ArgumentParser:
    """Register a subcommand whose flags come from `add_arguments` (shared with its scripts/ caller).
    `hangup_reloads`: the command serves SIGHUP as a reload (edge.interrupts' "reloading_command" phase, then its
    own "serving" phase first thing)."""
    p = subparsers.add_parser(name, help=summary, description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=func, hangup_reloads=hangup_reloads)
    return p


def _run(func: Handler, args: argparse.Namespace) -> int:
    try:
        return int(func(args))
    except Exception:
        if interrupts.received:  # the signal became another error on its way out (an interrupted import)
            raise interrupts.interruption(interrupts.received[0]) from None
        raise


def execute(prog: str, func: Handler, args: argparse.Namespace) -> int:
    """Run a command: EdgeError becomes one line on stderr and its exit code, Ctrl-C exit 130, SIGTERM 143."""
    # FFmpeg and OpenCV would print their own lines for a bad file; our error line says what matters.
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 prints escaped, never a traceback
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    phase = interrupts.Phase("reloading_command" if getattr(args, "hangup_reloads", False) else "command")
    interrupts.received.clear()
    try:
        phase.begin()
        return _run(func, args)
    except EdgeError as exc:
        return _error(prog, str(exc), exc.exit_code)
    except OSError as exc:  # a file the command reads or writes: named, one line (a full disk, a read-only folder)
        where = exc.filename if exc.filename is not None else type(exc).__name__
        bad_path = exc.filename is not None and exc.errno not in _NOT_THE_PATH
        return _error(prog, "{}: {}".format(where, exc.strerror or first_line(exc)),
                      EXIT_BAD_INPUT if bad_path else EXIT_FAIL)
    except interrupts.Terminated as exc:
        print("{}: terminated by {}".format(prog, signal.Signals(exc.signum).name), file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print("{}: interrupted".format(prog), file=sys.stderr)
        return 130
    finally:
        phase.end()


def _error(prog: str, message: str, code: int) -> int:
    """The one error line: credentials masked, control characters escaped, length bounded."""
    print("{}: error: {}".format(prog, one_line(redact(message))), file=sys.stderr)
    return code


def standalone_main(prog: str, description: Optional[str], add_arguments: Callable[[argparse.ArgumentParser], None],
                    func: Handler, argv: Optional[Sequence[str]] = None) -> int:
    """What `edge <command>` does, for the thin scripts/ callers."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return execute(prog, func, parser.parse_args(argv))
