"""Logits -> softmax -> top-k with labels."""

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np

from edge.errors import EdgeError
from edge.fileio import read_text

MAX_LABELS_BYTES = 16 << 20


@dataclass
class Prediction:
    indices: List[int]
    scores: List[float]
    labels: List[str]

    def as_dict(self) -> dict:
        return {"top": [{"index": i, "label": lab, "score": round(s, 4)}
                        for i, lab, s in zip(self.indices, self.labels, self.scores)]}


def load_labels(path: str) -> List[str]:
    """One label per line (UTF-8, a leading BOM dropped, any line ending). Labels reach logs, terminals and web
    pages: a blank line or a control character (an ANSI escape, NUL, a line separator) is refused with its line."""
    text = read_text(path, "labels file", MAX_LABELS_BYTES)
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
    return labels


class TopK:
    def __init__(self, labels: Sequence[str], k: int = 5):
        self.labels = list(labels)
        self.k = min(k, len(self.labels))

    def __call__(self, logits: np.ndarray) -> Prediction:
        row = np.asarray(logits, np.float32).reshape(-1)
        if row.shape[0] != len(self.labels):
            raise ValueError("model gives {} classes, labels file has {}".format(row.shape[0], len(self.labels)))
        top = np.argpartition(-row, self.k - 1)[:self.k]
        top = top[np.argsort(-row[top])]
        shifted = np.exp(row - row.max())
        probs = shifted[top] / shifted.sum()
        return Prediction([int(i) for i in top], [float(p) for p in probs], [self.labels[i] for i in top])
