"""`edge classify IMAGE|FOLDER...`: top-k for image files through the runtime's own stages.

    edge classify photo.jpg holiday/ --model engines/efficientnet_lite0.int8.onnx
    edge classify calibration/regression --json > predictions.jsonl

The model, preprocessing (with the constants from the model's info) and backend come from the config and flags,
built by edge.infer.stages.build_stages as for `edge run`. A folder means every image file under it (sorted).
Prints a table, or one JSON line per image with --json (never a NaN: a non-finite output is a failed image).
Unreadable or missing files, image types it does not read (.gif, .ico, .jp2, ...) and images the model failed on
are named on stderr and skipped; exit 2 when none could be classified.
"""

import argparse
import json
import os
import sys
import time
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from edge.cli.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.errors import EXIT_OK, EdgeError, first_line
from edge.inputs import read_image

# image files found in a folder that are not read (IMAGE_EXTENSIONS are): named, not silently left out
OTHER_IMAGE_TYPES = (".gif", ".ico", ".jp2", ".j2k", ".jpx", ".heic", ".heif", ".avif", ".jxl", ".svg", ".psd",
                     ".exr", ".hdr", ".pfm", ".dng", ".cr2", ".nef", ".raw")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="IMAGE|FOLDER", help="image files, or folders of them")
    add_config_flags(p, "model.path", "backend.kind", "preprocess.device", "runtime.top_k")
    p.add_argument("--json", action="store_true", help="one JSON line per image instead of the table")


def image_files(paths: Sequence[str]) -> Iterator[Tuple[str, Optional[str]]]:
    """(path, None) for every file to read, (path, why) for a path that gives nothing."""
    from edge.sources.source import IMAGE_EXTENSIONS

    for path in paths:
        if os.path.isdir(path):
            names = sorted(os.path.join(root, name) for root, dirs, names in os.walk(path) for name in names
                           if not name.startswith("."))
            found = {n for n in names if n.lower().endswith(IMAGE_EXTENSIONS)}
            if not found:
                yield path, "folder has no images ({})".format(" ".join(IMAGE_EXTENSIONS))
            for name in names:
                if name in found:
                    yield name, None
                elif name.lower().endswith(OTHER_IMAGE_TYPES):
                    yield name, "{} images are not read ({})".format(os.path.splitext(name)[1].lower(),
                                                                     " ".join(IMAGE_EXTENSIONS))
        elif os.path.exists(path):
            yield path, None
        else:
            yield path, "no such file or folder"


def _table_rows(path: str, top: List[Any]) -> List[str]:
    return ["{:<40} {:>2}  {:.4f}  {} ({})".format(path if rank == 1 else "", rank, entry["score"], entry["label"],
                                                   entry["index"]) for rank, entry in enumerate(top, 1)]


def cmd_classify(args: argparse.Namespace) -> int:
    from edge.infer.stages import build_stages

    stages = build_stages(config_from_args(args))
    classified, skipped = 0, 0
    try:
        if stages.warning:
            print("edge classify: {} ({})".format(stages.warning, stages.model_info.get("weights")), file=sys.stderr)
        for path, why in image_files(args.paths):
            image, why = (None, why) if why else read_image(path)[1:]
            if image is None:
                print("edge classify: skipped {}: {}".format(path, why), file=sys.stderr)
                skipped += 1
                continue
            started = time.monotonic()
            try:
                prediction = stages.classify(image)
            except Exception as exc:  # a failed frame (a non-finite output): named, the others go on
                print("edge classify: failed {}: {}".format(path, first_line(exc)), file=sys.stderr)
                skipped += 1
                continue
            top = prediction.as_dict()["top"]
            if args.json:
                print(json.dumps({"file": path, "top": top, "ms": round((time.monotonic() - started) * 1e3, 2)},
                                 allow_nan=False))
            else:
                if not classified:
                    print("{:<40} {:>2}  {:<6}  {}".format("image", "#", "score", "class (index)"))
                print("\n".join(_table_rows(path, top)))
            classified += 1
    finally:
        stages.close()
    if not classified:
        raise EdgeError("no image could be read ({} skipped)".format(skipped))
    return EXIT_OK


def register(subparsers: Any) -> None:
    add_command(subparsers, "classify", "top-k classes for image files or folders (table or JSON lines)", __doc__,
                add_arguments, cmd_classify)


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge classify") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_classify, argv)
