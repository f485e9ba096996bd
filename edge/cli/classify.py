"""`edge classify IMAGE|FOLDER...`: top-k for image files through the runtime's own stages.

    edge classify photo.jpg holiday/ --model engines/efficientnet_lite0.int8.onnx
    edge classify calibration/regression --json > predictions.jsonl

The model, preprocessing (with the constants from the model's info) and backend come from the config and flags,
built by edge.infer.stages.build_stages as for `edge run`. A folder means every image file under it (sorted).
Prints a table, or one JSON line per image with --json (never a NaN: a non-finite output is a failed image).
Unreadable or missing files, image types it does not read (.gif, .ico, .jp2, ...) and images the model failed on
are named on stderr and skipped; exit 2 when none could be classified.

A folder laid out as torchvision's ImageFolder (FOLDER/<class name>/image.jpg, or FOLDER/<class index>/ as the
calibration sets are) is scored: the top-1 and top-5 accuracy of its images against their folder's class is the
last line (stderr with --json), with the folders that name no class of the model's labels.
"""

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from edge.cli.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.errors import EXIT_OK, EdgeError, first_line
from edge.fields import add_flags, options_from, setting
from edge.inputs import read_image
from edge.model.class_labels import index_of_name, is_index, label_lines

# image files found in a folder that are not read (IMAGE_EXTENSIONS are): named, not silently left out
OTHER_IMAGE_TYPES = (".gif", ".ico", ".jp2", ".j2k", ".jpx", ".heic", ".heif", ".avif", ".jxl", ".svg", ".psd",
                     ".exr", ".hdr", ".pfm", ".dng", ".cr2", ".nef", ".raw")


@dataclass(frozen=True)
class ClassifyOptions:
    """`edge classify`'s own flag, declared once (edge.fields)."""

    json: bool = setting(False, "one JSON line per image instead of the table", flag="--json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="IMAGE|FOLDER", help="image files, or folders of them")
    add_config_flags(p, "model.path", "backend.kind", "preprocess.device", "runtime.top_k")
    add_flags(p, ClassifyOptions, "json")


def image_files(paths: Sequence[str]) -> Iterator[Tuple[str, Optional[str], str]]:
    """(path, None, class folder) for every file to read, (path, why, "") for a path that gives nothing. The class
    folder is the first folder below a FOLDER argument that the image lies in ("" for an image right in it)."""
    from edge.sources.source import IMAGE_EXTENSIONS

    for path in paths:
        if os.path.isdir(path):
            names = sorted(os.path.join(root, name) for root, dirs, names in os.walk(path) for name in names
                           if not name.startswith("."))
            found = {n for n in names if n.lower().endswith(IMAGE_EXTENSIONS)}
            if not found:
                yield path, "folder has no images ({})".format(" ".join(IMAGE_EXTENSIONS)), ""
            for name in names:
                if name in found:
                    parts = os.path.relpath(name, path).split(os.sep)
                    yield name, None, parts[0] if len(parts) > 1 else ""
                elif name.lower().endswith(OTHER_IMAGE_TYPES):
                    yield name, "{} images are not read ({})".format(os.path.splitext(name)[1].lower(),
                                                                     " ".join(IMAGE_EXTENSIONS)), ""
        elif os.path.exists(path):
            yield path, None, ""
        else:
            yield path, "no such file or folder", ""


class Accuracy:
    """Top-1/top-5 of images against the class their folder names (a line of the labels, or a class index: read as
    edge.model.class_labels reads them)."""

    def __init__(self, labels: Sequence[str], k: int):
        self.lines = label_lines(labels)
        self.classes = len(labels)
        self.top5_known = k >= min(5, self.classes)  # the top-k printed holds the top 5
        self.images = self.top1 = self.top5 = 0
        self.unknown: Dict[str, int] = {}  # folders that name no class: their images, not scored

    def truth(self, folder: str, where: str) -> Optional[int]:
        line = index_of_name(folder, self.lines, where)
        if line is None and is_index(folder) and int(folder) < self.classes:
            return int(folder)
        return line

    def add(self, folder: str, indices: Sequence[int], where: str) -> None:
        if not folder:
            return
        truth = self.truth(folder, where)
        if truth is None:
            self.unknown[folder] = self.unknown.get(folder, 0) + 1
            return
        self.images += 1
        self.top1 += int(indices[0] == truth)
        self.top5 += int(truth in indices[:5])

    def line(self) -> Optional[str]:
        """The accuracy line, or None when no image lay in a folder naming a class (not an ImageFolder tree)."""
        if not self.images:
            return None
        text = "accuracy: top-1 {} top-5 {} over {} images in class folders".format(
            _share(self.top1, self.images), _share(self.top5, self.images) if self.top5_known else "- (--top-k 5)",
            self.images)
        if self.unknown:
            names = sorted(self.unknown)
            text += "; not scored: {} images in {} folders that name no class ({}{})".format(
                sum(self.unknown.values()), len(names), ", ".join(names[:5]), ", ..." if len(names) > 5 else "")
        return text


def _share(right: int, total: int) -> str:
    return "{:.1%} ({}/{})".format(right / total, right, total)


def _table_rows(path: str, top: List[Any]) -> List[str]:
    return ["{:<40} {:>2}  {:.4f}  {} ({})".format(path if rank == 1 else "", rank, entry["score"], entry["label"],
                                                   entry["index"]) for rank, entry in enumerate(top, 1)]


def cmd_classify(args: argparse.Namespace) -> int:
    from edge.infer.stages import build_stages

    stages = build_stages(config_from_args(args))
    classified, skipped, json_lines = 0, 0, options_from(args, ClassifyOptions).json
    accuracy = Accuracy(stages.postprocess.labels, stages.postprocess.k)
    try:
        if stages.warning:
            print("edge classify: {} ({})".format(stages.warning, stages.model_info.get("weights")), file=sys.stderr)
        for path, why, folder in image_files(args.paths):
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
            accuracy.add(folder, prediction.indices, path)
            if json_lines:
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
    line = accuracy.line()
    if line:
        print(line, file=sys.stderr if json_lines else sys.stdout)
    return EXIT_OK


def register(subparsers: Any) -> None:
    add_command(subparsers, "classify", "top-k classes for image files or folders (table or JSON lines)", __doc__,
                add_arguments, cmd_classify)


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge classify") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_classify, argv)
