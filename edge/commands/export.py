"""`edge export`: MobileNetV3 to ONNX with its labels and model info (edge/build/export.py)."""

import argparse
from typing import Any

from edge.commands.common import add_command
from edge.errors import EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", default="mobilenet_v3_large", choices=("mobilenet_v3_large", "mobilenet_v3_small",
                                                                "efficientnet_lite0"))
    p.add_argument("--weights", default="auto", help="auto | imagenet | random | PATH to a checkpoint")
    p.add_argument("--out", help="output .onnx (default engines/<arch>.onnx)")
    p.add_argument("--seed", type=int, default=0, help="seed for random weights")


def cmd_export(args: argparse.Namespace) -> int:
    from edge.build.export import export_mobilenet

    export_mobilenet(args.arch, args.weights, args.out, args.seed)
    return EXIT_OK


def register(subparsers: Any) -> None:
    add_command(subparsers, "export", "write MobileNetV3 to ONNX with its labels and model info", __doc__,
                add_arguments, cmd_export)
