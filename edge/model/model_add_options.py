"""`edge model add`'s flags, declared once with their help and bounds (edge.fields). Light: read when the commands
are registered; the work is edge/model/user_model.py."""

import math
from dataclasses import dataclass
from typing import List

from edge.errors import EdgeError
from edge.fields import setting


def _triple(value: str, label: str) -> None:
    if value:
        parse_triple(value, label)


def parse_triple(value: str, label: str) -> List[float]:
    """'R,G,B' (0-1, as torchvision's Normalize) -> three floats; anything else is one EdgeError naming `label`."""
    try:
        numbers = [float(v) for v in value.replace(" ", ",").split(",") if v]
    except ValueError:
        numbers = []
    if len(numbers) != 3 or not all(math.isfinite(n) for n in numbers):
        raise EdgeError("{} must be three numbers R,G,B (of pixels scaled to 0-1, e.g. 0.485,0.456,0.406), got "
                        "{!r}".format(label, value[:40]))
    return numbers


@dataclass(frozen=True)
class ModelAddOptions:
    """`edge model add`'s flags, declared once (edge.fields)."""

    labels: str = setting("", "labels file, one class name per line in output order; \"\": <stem>.labels.txt",
                          flag="--labels")
    mean: str = setting("", "R,G,B mean the model was trained with, of pixels scaled to 0-1; \"\": "
                            "ImageNet's 0.485,0.456,0.406", flag="--mean", check=_triple)
    std: str = setting("", "R,G,B std; \"\": ImageNet's 0.229,0.224,0.225", flag="--std", check=_triple)
    size: int = setting(0, "input size the model was trained at (0: its ONNX input's, else 224)", low=0,
                        high=4096, flag="--size")
    resize: int = setting(0, "shorter side before the centre crop (0: size / 0.875, torchvision's 256 for 224)",
                          low=0, high=4096, flag="--resize")
    colour: str = setting("rgb", "channel order the model was trained on", choices=("rgb", "bgr"), flag="--colour")
    layout: str = setting("nchw", "the model's input layout", choices=("nchw", "nhwc"), flag="--layout")
    expected_top1: float = setting(0.0, "its FP32 top-1 accuracy on your validation set, a fraction (0.96); 0: not "
                                        "known", low=0.0, high=1.0, flag="--expected-top1")
    weights: str = setting("yours", "provenance recorded as the model info's 'weights' (e.g. 'shapes v3, "
                                    "trained 2026-05-01')", flag="--weights")
