"""The `edge` command: one subcommand per use. Errors are one line on stderr and an exit code."""

import argparse
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import __version__
from .errors import EXIT_OK, EdgeError


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by every command that runs the pipeline; each overrides one config key."""
    p.add_argument("--config", help="YAML config (see configs/example.yaml)")
    p.add_argument("--source", help="source.uri: synthetic | FILE | FOLDER | /dev/videoN | csi://N | rtsp://...")
    p.add_argument("--model", help="model.path: .onnx (ONNX Runtime) or .engine (TensorRT)")
    p.add_argument("--budget-ms", type=float, help="runtime.budget_ms (default 30)")
    p.add_argument("--backend", choices=("auto", "onnxruntime", "tensorrt"), help="backend.kind")
    p.add_argument("--preprocess", choices=("auto", "cpu", "cuda"), help="preprocess.device")


def config_from_args(args: argparse.Namespace, extra: Optional[Dict[str, Any]] = None):
    from .config import load_config

    flags = {"source.uri": args.source, "model.path": args.model, "runtime.budget_ms": args.budget_ms,
             "backend.kind": args.backend, "preprocess.device": args.preprocess}
    flags.update(extra or {})
    return load_config(args.config, {k: v for k, v in flags.items() if v is not None})


def cmd_run(args: argparse.Namespace) -> int:
    from .runtime import run

    extra = {"runtime.frames": args.frames}
    # SIGHUP re-reads the config file and re-applies the same flags.
    run(config_from_args(args, extra), reload_config=lambda: config_from_args(args, extra))
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_mobilenet

    export_mobilenet(args.arch, args.weights, args.out, args.seed)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge", description=__doc__)
    parser.add_argument("--version", action="version", version="jetson-edge " + __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser("run", help="run the camera -> preprocess -> infer -> postprocess loop")
    add_config_flags(run)
    run.add_argument("--frames", type=int, help="runtime.frames: stop after N timed frames (0: until stopped)")
    run.set_defaults(func=cmd_run)

    export = sub.add_parser("export", help="write MobileNetV3 to ONNX with its labels and model info")
    export.add_argument("--arch", default="mobilenet_v3_large", choices=("mobilenet_v3_large", "mobilenet_v3_small"))
    export.add_argument("--weights", default="auto", help="auto | imagenet | random | PATH to a checkpoint")
    export.add_argument("--out", help="output .onnx (default engines/<arch>.onnx)")
    export.add_argument("--seed", type=int, default=0, help="seed for random weights")
    export.set_defaults(func=cmd_export)

    from .build import add_build_parser, add_calibrate_parser, add_rollback_parser
    from .check import add_check_parser
    from .demo import add_demo_parser
    from .rebuild import add_rebuild_parser

    for add in (add_build_parser, add_calibrate_parser, add_rollback_parser, add_check_parser,
                add_rebuild_parser, add_demo_parser):
        add(sub)
    return parser


def add_command(subparsers: Any, name: str, summary: str, description: Optional[str],
                add_arguments: Callable[[argparse.ArgumentParser], None],
                func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """Register a subcommand whose flags come from `add_arguments` (shared with its scripts/ caller)."""
    p = subparsers.add_parser(name, help=summary, description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=func)
    return p


def _execute(prog: str, func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
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
                    func: Callable[[argparse.Namespace], int], argv: Optional[Sequence[str]] = None) -> int:
    """What `edge <command>` does, for the thin scripts/ callers."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return _execute(prog, func, parser.parse_args(argv))


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return _execute("edge " + args.command, args.func, args)


if __name__ == "__main__":
    sys.exit(main())
