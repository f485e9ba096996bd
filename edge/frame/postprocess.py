"""Logits -> softmax -> top-k with labels. A model whose output already is probabilities (it ends in Softmax) is
not given softmax again; a non-finite output is a failed frame, never a score."""

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from edge.errors import EdgeError
from edge.fileio import read_regular

MAX_LABELS_BYTES = 16 << 20
MAX_LABEL_CHARS = 256  # a class name; a longer "label" is not one (it would fill every log line and page)


@dataclass
class Prediction:
    indices: List[int]
    scores: List[float]
    labels: List[str]

    def as_dict(self) -> dict:
        return {"top": [{"index": i, "label": lab, "score": round(s, 4)}
                        for i, lab, s in zip(self.indices, self.labels, self.scores)]}


def parse_labels(data: bytes, path: str) -> List[str]:
    """One label per line (UTF-8, a leading BOM dropped, any line ending). Labels reach logs, terminals and web
    pages: a blank line, a control character (an ANSI escape, NUL, a line separator) or a label over
    MAX_LABEL_CHARS is refused with its line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EdgeError("{}: labels file is not UTF-8 text (byte {})".format(path, exc.start)) from None
    text = text[1:] if text.startswith("\ufeff") else text
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    labels = text[:-1].split("\n") if text.endswith("\n") else text.split("\n") if text else []
    if not labels:
        raise EdgeError("{}: labels file must have one non-empty label per line".format(path))
    for number, label in enumerate(labels, 1):
        if not label.strip():
            raise EdgeError("{}: line {}: labels file must have one non-empty label per line".format(path, number))
        if not label.isprintable():
            raise EdgeError("{}: line {}: control or invisible characters in a label ({})".format(
                path, number, ascii(label)[:60]))
        if len(label) > MAX_LABEL_CHARS:
            raise EdgeError("{}: line {}: a label of {} characters; at most {}".format(
                path, number, len(label), MAX_LABEL_CHARS))
    return labels


def load_labels(path: str) -> List[str]:
    """`parse_labels` of a file; missing, unreadable or too big is one EdgeError."""
    if not os.path.lexists(path):
        raise EdgeError("{}: labels file not found".format(path))
    data, why = read_regular(path, MAX_LABELS_BYTES)
    if data is None:
        raise EdgeError("{}: cannot read labels file: {}".format(path, why))
    return parse_labels(data, path)


class TopK:
    """The k best classes of one output. `probabilities`: the model's output already is (it ends in Softmax)."""

    def __init__(self, labels: Sequence[str], k: int = 5, probabilities: bool = False):
        self.labels = list(labels)
        self.k = min(k, len(self.labels))
        self.probabilities = probabilities

    def __call__(self, logits: np.ndarray) -> Prediction:
        row = np.asarray(logits, np.float32).reshape(-1)
        if row.shape[0] != len(self.labels):
            raise ValueError("model gives {} classes, labels file has {}".format(row.shape[0], len(self.labels)))
        finite = np.isfinite(row)
        if not finite.all():
            raise ValueError("non-finite model output ({} of {} values NaN or infinite)".format(
                int((~finite).sum()), row.shape[0]))
        top = np.argpartition(-row, self.k - 1)[:self.k]
        top = top[np.argsort(-row[top])]
        if self.probabilities:
            probs = row[top]
        else:
            shifted = np.exp(row - row.max())
            probs = shifted[top] / shifted.sum()
        return Prediction([int(i) for i in top], [float(p) for p in probs], [self.labels[i] for i in top])


def check_first_output(values: np.ndarray, model_path: str, dtype: Optional[np.dtype] = None) -> None:
    """What a backend's load ran on a blank input (of the model's own `dtype`, when `values` were converted): one
    float score per class, all finite; else refused (exit 2), not failed frame by frame."""
    dtype = values.dtype if dtype is None else dtype
    if dtype.kind != "f":
        raise EdgeError("{}: its first output is {} {}; jetson-edge reads one float score per class from the first "
                        "output (put the logits first)".format(model_path, dtype, list(values.shape)))
    if not np.isfinite(values).all():
        raise EdgeError("{}: non-finite output (NaN or infinite) on a blank input: broken weights, or an FP16/INT8 "
                        "overflow; re-export or rebuild it".format(model_path))
