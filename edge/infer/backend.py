"""Runners and backends, in the spirit of Polygraphy's runners: the lifecycle is checked once, here.

    with OnnxRuntimeBackend(cfg) as backend:    # load() on enter (a LoadedBackend), close() on exit
        logits = backend.infer(tensor)         # (1, 3, H, W) float32 -> (1, num_classes) float32
        backend.put_row(0, a); backend.put_row(1, b)
        logits = backend.infer_rows(2)         # several cameras' frames as one batch (up to max_batch)

A Runner is what to load (a path, options, a borrowed CUDA session) and nothing loaded: `load()` makes the loaded
object, a type of its own whose fields are all there (no Optional narrowed frame by frame); `close()` frees it. The
stages hold the LoadedBackend, and a loaded runner is the gate's callable (`with runner as infer`). An unloaded
runner has no infer: only the loaded object infers.
GPU backends accept, besides a NumPy array, the device tensor their paired GPU preprocessor wrote.
"""

from typing import TYPE_CHECKING, Any, Dict, Generic, Optional, Tuple, TypeVar

import numpy as np

from edge.errors import EXIT_FAIL, EdgeError

if TYPE_CHECKING:
    from edge.store.artifact import ModelSet

INPUT_NAME = "input"  # 1x3x224x224 float32, RGB, ImageNet-normalised
OUTPUT_NAME = "logits"  # 1x1000 float32, before softmax


class Loaded:
    """What every loaded runner has: inference and release."""

    def infer(self, tensor: Any) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, tensor: Any) -> np.ndarray:
        """A loaded runner is the gate's Infer (edge.model.gate): `with runner as infer: infer(x)`."""
        return self.infer(tensor)

    def close(self) -> None:
        """Free what the load allocated; safe to call twice."""


L = TypeVar("L", bound=Loaded)


class Runner(Generic[L]):
    """What to load; `load()` -> the loaded L (once: a second call gives the same), `close()` frees it."""

    name = "runner"
    _loaded: Optional[L] = None

    def _load(self, model: Any) -> L:
        raise NotImplementedError

    def load(self, model: Any = None) -> L:
        if self._loaded is None:
            self._loaded = self._load(model)
        return self._loaded

    def close(self) -> None:
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            loaded.close()

    def __enter__(self) -> L:
        return self.load()

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LoadedBackend(Loaded):
    """A loaded model as the frame path uses it."""

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
        if self._rows is None:
            raise EdgeError("infer_rows({}) before any put_row".format(n), exit_code=EXIT_FAIL)
        return self.infer(self._rows[:n])

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


class Backend(Runner[LoadedBackend]):
    """A backend not yet loaded. `load(model)`: the model's bytes (`model`: read and checked once by
    edge.store.artifact.read_set; None: read here). Refused at load, one line naming the file: an input the pipeline
    cannot feed, a first output that is not one float score per class, or a non-finite output on a blank input."""

    name = "base"

    def load(self, model: Optional["ModelSet"] = None) -> LoadedBackend:
        return super().load(model)
