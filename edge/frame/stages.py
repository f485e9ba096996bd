"""Config -> the loaded stages of one model (CPU or GPU), with what was chosen and why.

`build_stages` is the only place stages are made: `edge run` at start and on SIGHUP, `edge check`, `edge demo`
and the rebuild's latency step all go through it. Everything the stages report about themselves (backend,
precision, model identity) is captured here, at load time, so a model file replaced or removed on disk later
never changes what a running service says about the model it serves.
"""

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from edge.artifact import UNTRAINED_WARNING, labels_path, read_model_info
from edge.config import Config
from edge.errors import EdgeError
from edge.frame.backend import Backend
from edge.frame.cuda_session import CudaSession
from edge.frame.postprocess import Prediction, TopK, load_labels
from edge.frame.preprocess import model_preprocess


@dataclass
class Stages:
    preprocess: Callable[[Any], Any]
    backend: Backend  # loaded
    postprocess: TopK
    reason: str  # why this backend and preprocessor were chosen
    model_path: str
    model_info: Dict[str, Any] = field(default_factory=dict)
    sha256: str = "unknown"  # of the bytes actually loaded
    description: Dict[str, Any] = field(default_factory=dict)  # backend.describe() at load time
    session: Optional[CudaSession] = None  # the GPU stages' CUDA session: theirs, released by close(), last

    @property
    def trained(self) -> bool:
        return bool(self.model_info.get("trained"))

    @property
    def warning(self) -> Optional[str]:
        return None if self.trained else UNTRAINED_WARNING

    @property
    def preprocess_name(self) -> str:
        return str(getattr(self.preprocess, "name", "?"))

    @property
    def stale_info_sha256(self) -> Optional[str]:
        """The sidecar's sha256 when it describes other bytes than the ones loaded (a stale .json), else None."""
        declared = self.model_info.get("sha256")
        return declared if isinstance(declared, str) and self.sha256 != "unknown" and declared != self.sha256 \
            else None

    def facts(self) -> Dict[str, Any]:
        """What the start line, reports and the demo say about the model being served."""
        return dict(self.description, preprocess=self.preprocess_name, chosen_because=self.reason,
                    weights=self.model_info.get("weights"), trained=self.trained, sha256=self.sha256)

    def classify(self, image: Any, stage_ms: Optional[Dict[str, float]] = None) -> Prediction:
        """An HxWx3 BGR image -> its top-k: the one preprocess -> infer -> postprocess chain. With `stage_ms`, each
        stage's wall time (ms) and the backend's device times are written into it."""
        t0 = time.monotonic()
        tensor = self.preprocess(image)
        t1 = time.monotonic()
        logits = self.backend.infer(tensor)
        t2 = time.monotonic()
        prediction = self.postprocess(logits)
        if stage_ms is not None:
            stage_ms.update(preprocess=(t1 - t0) * 1e3, infer=(t2 - t1) * 1e3,
                            postprocess=(time.monotonic() - t2) * 1e3, **self.backend.device_ms())
        return prediction

    def classify_batch(self, images: Sequence[Any], stage_ms: Dict[str, float]) -> List[Prediction]:
        """Several BGR images (at most backend.max_batch) as one batch: each preprocessed into its row, one inference,
        each row's top-k. `stage_ms` gets the batch's stage times, which every image of it waited for."""
        t0 = time.monotonic()
        for row, image in enumerate(images):
            self.backend.put_row(row, self.preprocess(image))
        t1 = time.monotonic()
        logits = self.backend.infer_rows(len(images))
        t2 = time.monotonic()
        predictions = [self.postprocess(logits[row]) for row in range(len(images))]
        stage_ms.update(preprocess=(t1 - t0) * 1e3, infer=(t2 - t1) * 1e3,
                        postprocess=(time.monotonic() - t2) * 1e3, **self.backend.device_ms())
        return predictions

    def close(self) -> None:
        close_stages(self.preprocess, self.backend, self.session)


def close_stages(preprocessor: Any, backend: Backend, session: Optional[CudaSession] = None) -> None:
    """The preprocessor, then the backend, then the CUDA session both ran on: each one even if one before fails."""
    with contextlib.ExitStack() as later:
        if session is not None:
            later.callback(session.release)
        later.callback(backend.close)
        close = getattr(preprocessor, "close", None)  # CPU preprocessing holds nothing to free
        if close is not None:
            close()


def choose_devices(cfg: Config) -> Tuple[str, str, str]:
    """(preprocess device, backend kind, reason) for the config's auto/explicit choices."""
    from edge.frame.select import select_devices  # probes only; imports neither tensorrt nor pycuda at module level

    return select_devices(cfg)


class StageParts(NamedTuple):
    """What a stages factory makes: CPU stages hold no CUDA session."""

    preprocessor: Callable[[Any], Any]
    backend: Any  # not yet loaded
    reason: str
    session: Optional[CudaSession] = None


def create_stages(cfg: Config) -> StageParts:
    """The stages `cfg` chooses, not yet loaded. GPU modules are imported only when chosen; GPU stages get one
    CUDA session, made here and handed to the backend and the GPU preprocessor, which both only borrow it."""
    pre_device, backend_kind, reason = choose_devices(cfg)
    if backend_kind != "tensorrt":
        from edge.frame.onnxruntime_backend import OnnxRuntimeBackend
        from edge.frame.preprocess import cpu_preprocessor

        return StageParts(cpu_preprocessor(cfg.preprocess), OnnxRuntimeBackend(
            cfg.model.path, cfg.backend.intra_op_threads, cfg.backend.intra_op_spinning), reason)
    from edge.frame.tensorrt_backend import TensorRTBackend

    session = CudaSession()
    backend = TensorRTBackend(cfg.model.path, session, cfg.backend.cuda_graph)  # allocates nothing before load()
    try:
        preprocessor, reason = preprocessor_for_tensorrt(cfg, session, pre_device, reason)
    except BaseException:
        session.release()
        raise
    return StageParts(preprocessor, backend, reason, session)


def preprocessor_for_tensorrt(cfg: Config, session: CudaSession, device: str, reason: str) -> Tuple[Any, str]:
    """(preprocessor, reason) beside a TensorRT backend: CUDA when chosen and its kernel loads, else the CPU."""
    from edge.frame.preprocess import cpu_preprocessor

    if device == "cuda":
        from edge.frame.cuda_kernel import KernelUnavailable
        from edge.frame.cuda_preprocess import CudaPreprocessor

        try:  # loads the kernel now: no kernel is decided at start, never frame by frame
            return CudaPreprocessor(cfg.preprocess, session), reason
        except KernelUnavailable as exc:
            if cfg.preprocess.device == "cuda":
                raise KernelUnavailable("preprocess.device cuda: {}".format(exc)) from None
            reason += "; preprocessing on the CPU (preprocess.device auto): {}".format(exc)
    return cpu_preprocessor(cfg.preprocess), reason


def check_fit(cfg: Config, backend: Backend, labels_file: str, labels: int) -> None:
    """A model that does not fit the config is refused at load (exit 2, naming the file), not frame by frame."""
    shape = tuple(backend.input_shape)
    crop = cfg.preprocess.crop
    # ONNX Runtime reports a dynamic dimension as 1: only fixed ones are checked.
    if len(shape) != 4 or shape[1] not in (1, 3) or any(d not in (1, crop) for d in shape[2:]) or \
            any(d > 1 for d in shape[:1]):
        raise EdgeError("{}: the model takes input {}, the pipeline gives 1x3x{}x{} (preprocess.crop: {}); "
                        "use a model for that size or set preprocess.crop/resize".format(
                            cfg.model.path, "x".join(str(d) for d in shape), crop, crop, crop))
    classes = backend.output_shape[-1] if backend.output_shape else 1
    if classes > 1 and classes != labels:  # 1: a dynamic class dimension, known only when it runs
        raise EdgeError("{}: {} labels, but the model {} has {} classes".format(
            labels_file, labels, cfg.model.path, classes))


def build_stages(cfg: Config, factory: Callable[[Config], Any] = create_stages) -> Stages:
    """Choose, create and load the stages for `cfg`; they are closed again if loading or anything after fails.
    `factory` lets tests put a hanging or failing backend behind the same path."""
    info = read_model_info(cfg.model.path)
    # The model's own preprocessing constants (its model info) win over config defaults; a conflict is refused.
    cfg = dataclasses.replace(cfg, preprocess=model_preprocess(cfg.preprocess, info, cfg.model.path,
                                                               cfg.path or "<defaults>"))
    preprocessor, backend, reason, session = StageParts(*factory(cfg))
    try:
        backend.load()
        write_as = getattr(preprocessor, "write_as", None)  # a GPU preprocessor writes the engine's input dtype
        if write_as is not None:
            write_as(backend.input_dtype)
        labels_file = labels_path(cfg.model.path, cfg.model.labels)
        labels = load_labels(labels_file)
        check_fit(cfg, backend, labels_file, len(labels))
        postprocess = TopK(labels, cfg.runtime.top_k)
        return Stages(preprocessor, backend, postprocess, reason, cfg.model.path, info, backend.sha256,
                      dict(backend.describe()), session)
    except BaseException:
        close_stages(preprocessor, backend, session)
        raise
