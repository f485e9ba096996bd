"""`edge model add MODEL.onnx --labels FILE [--mean R,G,B --std R,G,B --size N --colour rgb|bgr --layout nchw|nhwc
--expected-top1 F --weights TEXT]`: your own ONNX classifier, recorded once (labels, the preprocessing it was trained
with, its provenance) so that classify, run, check, demo and build feed and describe it as it was trained
(edge/model/user_model.py; docs/own-model.md walks the whole path from PyTorch).

    edge model add shapes.onnx --labels shapes.labels.txt --size 128 --mean 0.5,0.5,0.5 --std 0.5,0.5,0.5
"""

import argparse
from typing import Any

from edge.cli.common import add_command
from edge.errors import EXIT_OK
from edge.fields import add_flags, leaves, options_from
from edge.model.model_add_options import ModelAddOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx", help="your FP32 ONNX classifier")
    add_flags(p, ModelAddOptions, *(dotted for dotted, _, _ in leaves(ModelAddOptions)))


def cmd_add(args: argparse.Namespace) -> int:
    from edge.model.user_model import add_model

    add_model(args.model, options_from(args, ModelAddOptions))
    return EXIT_OK


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("model", help="your own model: record its labels, preprocessing and provenance",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="model_command", metavar="ACTION")
    sub.required = True
    add_command(sub, "add", "record MODEL.onnx's labels, preprocessing and provenance in its model info", __doc__,
                add_arguments, cmd_add).set_defaults(command="model add")  # its error lines say "edge model add"
