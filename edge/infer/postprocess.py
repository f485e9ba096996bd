"""Logits -> softmax -> top-k with labels. A model whose output already is probabilities (it ends in Softmax) is
not given softmax again; a non-finite output is a failed frame, never a score."""

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from edge.errors import EdgeError
from edge.inputs import read_regular
from edge.store.artifact import MAX_LABELS_BYTES, parse_labels


@dataclass
class Prediction:
    indices: List[int]
    scores: List[float]
    labels: List[str]

    def top1(self) -> Dict[str, Any]:
        """The best class: what each frame line says it classified."""
        return {"label": self.labels[0], "score": round(self.scores[0], 4)}

    def as_dict(self) -> dict:
        return {"top": [{"index": i, "label": lab, "score": round(s, 4)}
                        for i, lab, s in zip(self.indices, self.labels, self.scores)]}


class ClassCounts:
    """How often each class was a timed frame's top-1: what `edge run`'s summary lines, final report and table say
    it classified. Bounded by the labels (one counter per class seen)."""

    def __init__(self) -> None:
        self.counts: Dict[str, int] = {}
        self.total = 0

    def add(self, prediction: Prediction) -> None:
        label = prediction.labels[0]
        self.counts[label] = self.counts.get(label, 0) + 1
        self.total += 1

    def top(self, k: int = 3) -> List[Dict[str, Any]]:
        """The `k` most frequent top-1 classes (ties by label): label, frames, share of the frames counted."""
        best = sorted(self.counts.items(), key=lambda item: (-item[1], item[0]))[:k]
        return [{"label": label, "frames": n, "share": round(n / self.total, 4)} for label, n in best]


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
        # one reduction instead of a mask: a float64 sum of float32 values cannot overflow, so it is finite iff all are
        if not np.isfinite(row.sum(dtype=np.float64)):
            raise ValueError("non-finite model output ({} of {} values NaN or infinite)".format(
                int((~np.isfinite(row)).sum()), row.shape[0]))
        negated = -row
        top = np.argpartition(negated, self.k - 1)[:self.k]
        top = top[np.argsort(negated[top])]
        if self.probabilities:
            probs = row[top]
        else:
            shifted = np.exp(row - row[top[0]])  # row[top[0]] is the row's max
            probs = shifted[top] / shifted.sum()
        indices = top.tolist()
        return Prediction(indices, probs.tolist(), [self.labels[i] for i in indices])


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
