"""What every command shares: config flags, registration, and the one error path (one line, an exit code)."""

import argparse
import os
import sys
from typing import Any, Callable, Dict, Optional, Sequence

from edge.config import Config, load_config
from edge.errors import EdgeError

Handler = Callable[[argparse.Namespace], int]


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by every command that runs the pipeline; each overrides one config key."""
    p.add_argument("--config", help="YAML config (see configs/example.yaml)")
    p.add_argument("--source", help="source.uri: synthetic | FILE | FOLDER | /dev/videoN | csi://N | rtsp://...")
    p.add_argument("--model", help="model.path: .onnx (ONNX Runtime) or .engine (TensorRT)")
    p.add_argument("--budget-ms", type=float, help="runtime.budget_ms (default 30)")
    p.add_argument("--backend", choices=("auto", "onnxruntime", "tensorrt"), help="backend.kind")
    p.add_argument("--preprocess", choices=("auto", "cpu", "cuda"), help="preprocess.device")


def config_from_args(args: argparse.Namespace, extra: Optional[Dict[str, Any]] = None) -> Config:
    """The config file named by --config with the flags (and `extra` keys) applied; None values are unset."""
    flags = {"source.uri": getattr(args, "source", None), "model.path": getattr(args, "model", None),
             "runtime.budget_ms": getattr(args, "budget_ms", None), "backend.kind": getattr(args, "backend", None),
             "preprocess.device": getattr(args, "preprocess", None)}
    flags.update(extra or {})
    return load_config(getattr(args, "config", None), {k: v for k, v in flags.items() if v is not None})


def add_command(subparsers: Any, name: str, summary: str, description: Optional[str],
                add_arguments: Callable[[argparse.ArgumentParser], None], func: Handler) -> argparse.ArgumentParser:
    """Register a subcommand whose flags come from `add_arguments` (shared with its scripts/ caller)."""
    p = subparsers.add_parser(name, help=summary, description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=func)
    return p


def execute(prog: str, func: Handler, args: argparse.Namespace) -> int:
    """Run a command: EdgeError becomes one line on stderr and its exit code, Ctrl-C exit 130."""
    # FFmpeg and OpenCV would print their own lines for a bad file; our error line says what matters.
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
    try:
        return int(func(args))
    except EdgeError as exc:
        print("{}: error: {}".format(prog, exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("{}: interrupted".format(prog), file=sys.stderr)
        return 130


def standalone_main(prog: str, description: Optional[str], add_arguments: Callable[[argparse.ArgumentParser], None],
                    func: Handler, argv: Optional[Sequence[str]] = None) -> int:
    """What `edge <command>` does, for the thin scripts/ callers."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return execute(prog, func, parser.parse_args(argv))
