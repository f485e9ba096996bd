"""The Backend interface: a runner with one lifecycle, in the spirit of Polygraphy's runners.

    with OnnxRuntimeBackend(cfg) as backend:    # load() on enter, close() on exit
        logits = backend.infer(tensor)         # (1, 3, H, W) float32 -> (1, num_classes) float32
        backend.put_row(0, a); backend.put_row(1, b)
        logits = backend.infer_rows(2)         # several cameras' frames as one batch (up to max_batch)

GPU backends accept, besides a NumPy array, the device tensor their paired GPU preprocessor wrote.
"""

from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import numpy as np

if TYPE_CHECKING:
    from edge.store.artifact import ModelSet

INPUT_NAME = "input"  # 1x3x224x224 float32, RGB, ImageNet-normalised
OUTPUT_NAME = "logits"  # 1x1000 float32, before softmax


class Backend:
    name = "base"
    sha256 = "unknown"  # of the model bytes load() read: what the service reports it serves
    probabilities = False  # the first output already is probabilities (the model ends in Softmax)
    max_batch = 1  # the most rows infer_rows() takes: a model with a batch axis takes more
    _rows: Optional[np.ndarray] = None  # the next batch, on the host

    def put_row(self, row: int, tensor: Any) -> None:
        """Copy a preprocessed (1, 3, H, W) tensor into row `row` of the next batch (before the preprocessor reuses
        its buffer). Here: a host array, which `infer_rows` hands to `infer`."""
        array = np.asarray(tensor)
        if self._rows is None or self._rows.shape[1:] != array.shape[1:] or self._rows.dtype != array.dtype:
            self._rows = np.empty((self.max_batch,) + array.shape[1:], array.dtype)
        self._rows[row] = array[0]

    def infer_rows(self, n: int) -> np.ndarray:
        """The first `n` rows put as one batch -> (n, num_classes)."""
        assert self._rows is not None, "put_row() first"
        return self.infer(self._rows[:n])

    def load(self, model: Optional["ModelSet"] = None) -> None:
        """Load the model's bytes (`model`: read and checked once by edge.store.artifact.read_set; None: read here).
        Refused at load, one line naming the file: an input the pipeline cannot feed, a first output that is not
        one float score per class, or a non-finite output on a blank input."""
        raise NotImplementedError

    def infer(self, tensor: Any) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> Dict[str, Any]:
        """What the startup log line and reports say about this backend (name, precision, model, ...)."""
        raise NotImplementedError

    @property
    def input_shape(self) -> Tuple[int, ...]:
        """(1, 3, H, W) as the model declares it (a dynamic dimension reads 1)."""
        raise NotImplementedError

    @property
    def input_dtype(self) -> np.dtype:
        """The dtype infer() takes; a host array of float32 is always taken (cast where the model wants another)."""
        return np.dtype(np.float32)

    @property
    def output_shape(self) -> Tuple[int, ...]:
        """The first output's shape, as it came out of the blank input load() ran: (1, num_classes)."""
        raise NotImplementedError

    def device_ms(self) -> Dict[str, float]:
        """The last infer()'s device work by stage (`preprocess_gpu`, `infer_gpu`: CUDA-event times), recorded
        beside the wall-clock stages; {} for a backend without a device."""
        return {}

    def close(self) -> None:
        """Free what load() allocated; safe to call twice."""

    def __enter__(self) -> "Backend":
        self.load()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
