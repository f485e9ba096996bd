"""`edge gate export-flips OUT`: the images whose top-1 answer the candidate changed, from the latest gate report of
the configured model (or --report), as a labelled regression set at OUT (OUT/<class>/<file>, the class folders as
the gate read them; unlabelled flips at OUT's top). Written whole or not at all; the next build is judged on it
with --regression OUT. The gate's Markdown summary beside its report: <artifact>.gate.md.

`edge gate history`: the configured source model's last builds as the gate judged them (b, c, the drop, cosine, the
classes that changed), from <engines_dir>/../gate-looks/<source sha256>.history.jsonl."""

import argparse
import os
from dataclasses import dataclass
from typing import Any

from edge.cli.common import add_command, add_config_flags, config_from_args
from edge.errors import EXIT_OK, EdgeError
from edge.fields import add_flags, leaves, options_from, setting


@dataclass(frozen=True)
class ExportFlipsOptions:
    """`edge gate export-flips`'s own flags."""

    report: str = setting("", "the gate report to read (default: the configured model's, "
                              "<engines_dir>/<model>.<precision>.gate.json)", flag="--report")
    engine: bool = setting(False, "the TensorRT engine's gate report rather than the Q/DQ ONNX's", flag="--engine")


@dataclass(frozen=True)
class HistoryOptions:
    """`edge gate history`'s own flags."""

    last: int = setting(10, "how many of the latest builds to show", low=1, high=200, flag="--last")


def cmd_history(args: argparse.Namespace) -> int:
    from edge.model.gate_looks import history_path, read_history
    from edge.model.gate_report import history_table
    from edge.model.plan import source_model
    from edge.store.artifact import sha256_file

    cfg = config_from_args(args)
    source = source_model(cfg.model.path)
    if not os.path.isfile(source):
        raise EdgeError("{}: source model not found (model.path or --model)".format(source))
    path = history_path(cfg.build.engines_dir, sha256_file(source))
    history = read_history(path)[-options_from(args, HistoryOptions).last:]
    print("\n".join(history_table(history)) if history else "{}: no gated build of {} yet".format(path, source))
    return EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    from edge.model.gate_report import export_flips, report_path
    from edge.model.plan import artifact_path, format_for, source_model

    if args.gate_command == "history":
        return cmd_history(args)
    options = options_from(args, ExportFlipsOptions)
    report = options.report
    if not report:
        cfg = config_from_args(args)
        report = report_path(artifact_path(source_model(cfg.model.path), cfg.build.engines_dir, cfg.build.precision,
                                           format_for(options.engine)))
    export_flips(report, args.out)
    return EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="gate_command", metavar="{export-flips,history}")
    sub.required = True
    flips = sub.add_parser("export-flips", help="the flipped images of the latest gate report as a labelled "
                                                "regression set", description=__doc__)
    flips.add_argument("out", help="new regression set folder (replaced atomically)")
    add_config_flags(flips, "model.path", "build.precision")
    add_flags(flips, ExportFlipsOptions, *(dotted for dotted, _, _ in leaves(ExportFlipsOptions)))
    history = sub.add_parser("history", help="the source model's last builds as the gate judged them",
                             description=__doc__)
    add_config_flags(history, "model.path")
    add_flags(history, HistoryOptions, *(dotted for dotted, _, _ in leaves(HistoryOptions)))


def register(subparsers: Any) -> None:
    add_command(subparsers, "gate", "what the accuracy gate found: export its flipped images, its history", __doc__,
                add_arguments, cmd_gate)
