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
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from edge.config import Config, with_overrides
from edge.errors import EdgeError
from edge.infer.backend import Backend, LoadedBackend
from edge.infer.cuda_session import CudaSession
from edge.infer.postprocess import Prediction, TopK
from edge.infer.preprocess import Preprocessor, model_preprocess
from edge.store.artifact import read_set
from edge.store.model_info import UNTRAINED_WARNING, provenance, read_model_info

# the config keys the stages read (create_stages and build_stages): a reload builds new stages from the new config,
# so these reload=APPLY keys (edge/config.py) are applied by the swap; the others need an applier in
# edge/service/runtime.py (APPLIERS), which tests/test_config.py checks
STAGE_KEYS = ("model.", "preprocess.", "backend.", "runtime.top_k")


@dataclass
class Stages:
    preprocess: Preprocessor
    backend: LoadedBackend
    postprocess: TopK
    reason: str  # why this backend and preprocessor were chosen
    model_path: str
    model_info: Dict[str, Any] = field(default_factory=dict)
    sha256: str = "unknown"  # of the bytes actually loaded
    description: Dict[str, Any] = field(default_factory=dict)  # backend.describe() at load time
    session: Optional[CudaSession] = None  # the GPU stages' CUDA session: theirs, released by close(), last
    notes: Tuple[str, ...] = ()  # what the model's set says about itself (labels not covered by a sha256)
    degraded: Optional[str] = None  # why these stages stand in for the configured ones (edge.infer.select)

    @property
    def trained(self) -> bool:
        return bool(self.model_info.get("trained"))

    @property
    def warning(self) -> Optional[str]:
        return None if self.trained else UNTRAINED_WARNING

    @property
    def provenance(self) -> str:
        """What a header says about the weights: 'weights: ...', or the untrained warning."""
        return provenance(self.model_info)

    @property
    def preprocess_name(self) -> str:
        return self.preprocess.name

    def facts(self) -> Dict[str, Any]:
        """What the start line, reports and the demo say about the model being served."""
        facts = dict(self.description, preprocess=self.preprocess_name, chosen_because=self.reason,
                     weights=self.model_info.get("weights"), trained=self.trained, sha256=self.sha256)
        return dict(facts, degraded=self.degraded) if self.degraded else facts

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


def close_stages(preprocessor: Preprocessor, backend: Union[Backend, LoadedBackend],
                 session: Optional[CudaSession] = None) -> None:
    """The preprocessor, then the backend, then the CUDA session both ran on: each one even if one before fails."""
    with contextlib.ExitStack() as later:
        if session is not None:
            later.callback(session.release)
        later.callback(backend.close)
        preprocessor.close()


class StageParts(NamedTuple):
    """What a stages factory makes: CPU stages hold no CUDA session."""

    preprocessor: Preprocessor
    backend: Backend  # not yet loaded
    reason: str
    session: Optional[CudaSession] = None


def create_stages(cfg: Config) -> StageParts:
    """The stages `cfg` chooses, not yet loaded. GPU modules are imported only when chosen; GPU stages get one
    CUDA session, made here and handed to the backend and the GPU preprocessor, which both only borrow it."""
    from edge.infer.select import select_devices  # probes only; imports neither tensorrt nor pycuda at module level

    pre_device, backend_kind, reason = select_devices(cfg)
    if backend_kind != "tensorrt":
        from edge.infer.onnxruntime_backend import OnnxRuntimeBackend
        from edge.infer.preprocess import cpu_preprocessor

        backend = OnnxRuntimeBackend(cfg.model.path, cfg.backend.intra_op_threads,
                                     spinning=cfg.backend.intra_op_spinning)
        if pre_device != "cuda":
            return StageParts(cpu_preprocessor(cfg.preprocess), backend, reason)
        session = CudaSession()  # explicit CUDA preprocessing beside ONNX Runtime: a GPU check, the tensor downloaded
    else:
        from edge.infer.tensorrt_backend import TensorRTBackend

        session = CudaSession()
        backend = TensorRTBackend(cfg.model.path, session, cfg.backend.cuda_graph,  # allocates nothing before load()
                                  config_path=cfg.path)
    try:
        preprocessor, reason = preprocessor_on_session(cfg, session, pre_device, reason)
    except BaseException:
        session.release()
        raise
    return StageParts(preprocessor, backend, reason, session)


def preprocessor_on_session(cfg: Config, session: CudaSession, device: str, reason: str) -> Tuple[Any, str]:
    """(preprocessor, reason) for stages holding a CUDA session: CUDA when chosen and its kernel loads, else the
    CPU."""
    from edge.infer.preprocess import cpu_preprocessor

    if device == "cuda":
        from edge.infer.cuda_kernel import KernelUnavailable
        from edge.infer.cuda_preprocess import CudaPreprocessor

        try:  # loads the kernel now: no kernel is decided at start, never frame by frame
            return CudaPreprocessor(cfg.preprocess, session), reason
        except KernelUnavailable as exc:
            if cfg.preprocess.device == "cuda":
                raise KernelUnavailable("preprocess.device cuda: {}".format(exc)) from None
            reason += "; preprocessing on the CPU (preprocess.device auto): {}".format(exc)
    return cpu_preprocessor(cfg.preprocess), reason


def check_fit(cfg: Config, backend: LoadedBackend, labels_file: str, labels: int) -> None:
    """A model that does not fit the config is refused at load (exit 2, naming the file), not frame by frame."""
    shape = tuple(backend.input_shape)
    crop = cfg.preprocess.crop
    # ONNX Runtime reports a dynamic dimension as 1: only fixed ones are checked.
    if len(shape) != 4 or shape[1] not in (1, 3) or any(d not in (1, crop) for d in shape[2:]) or \
            any(d > 1 for d in shape[:1]):
        raise EdgeError("{}: the model takes input {}, the pipeline gives 1x3x{}x{} (preprocess.crop: {}); "
                        "use a model for that size or set preprocess.crop/resize".format(
                            cfg.model.path, "x".join(str(d) for d in shape), crop, crop, crop))
    values = int(np.prod(backend.output_shape))  # the first output, as it came out of load()'s blank input
    if values != labels:
        raise EdgeError("{}: {} labels, but the model {} gives {} scores (first output {}); one score per "
                        "label".format(labels_file, labels, cfg.model.path, values,
                                       "x".join(str(d) for d in backend.output_shape)))


def config_for_model(cfg: Config, info: Dict[str, Any], model_path: str) -> Config:
    """`cfg` with the preprocessing the model's info records: its own constants win over config defaults, a
    conflict is refused. The one merge: the runtime's stages and the build's plan."""
    return dataclasses.replace(cfg, preprocess=model_preprocess(cfg.preprocess, info, model_path,
                                                                cfg.path or "<defaults>"))


def build_stages(cfg: Config, factory: Callable[[Config], Any] = create_stages) -> Stages:
    """Choose, create and load the stages for `cfg`; they are closed again if loading or anything after fails.
    The stages are chosen first (with the model info's preprocessing), then the model's set is read once
    (edge.store.artifact.read_set: bytes, model info and labels checked together) and its bytes handed to the backend.
    `factory` lets tests put a hanging or failing backend behind the same path. An engine this machine cannot
    serve is replaced by an ONNX of its folder on the CPU, degraded (edge.infer.select.engine_fallback)."""
    from edge.infer.select import engine_fallback

    fallback = engine_fallback(cfg)
    if fallback is not None:
        cfg = with_overrides(cfg, {"model.path": fallback[0], "backend.kind": "onnxruntime",
                                   "preprocess.device": "cpu"})
    info = read_model_info(cfg.model.path)
    cfg = config_for_model(cfg, info, cfg.model.path)
    preprocessor, backend, reason, session = StageParts(*factory(cfg))
    try:
        model = read_set(cfg.model.path, labels=cfg.model.labels)
        if model.info != info:  # an install or rollback switched the set in between
            raise EdgeError("{}: its set changed while it was being loaded; load it again".format(cfg.model.path))
        loaded = backend.load(model)
        preprocessor.write_as(loaded.input_dtype)  # a GPU preprocessor writes the engine's input dtype
        if model.labels is None:
            raise EdgeError("{}: labels file not found".format(model.labels_path))
        check_fit(cfg, loaded, model.labels_path, len(model.labels))
        postprocess = TopK(model.labels, cfg.runtime.top_k, loaded.probabilities)
        return Stages(preprocessor, loaded, postprocess, reason, cfg.model.path, model.info, model.sha256,
                      dict(loaded.describe()), session, model.notes, fallback[1] if fallback else None)
    except BaseException:
        close_stages(preprocessor, backend, session)
        raise
