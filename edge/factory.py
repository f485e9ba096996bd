"""Config -> the stage implementations (CPU or GPU), saying which were chosen and why."""

from typing import Any, Callable, Tuple

from .config import Config


def choose_devices(cfg: Config) -> Tuple[str, str, str]:
    """(preprocess device, backend kind, reason) for the config's auto/explicit choices."""
    from .gpu.select import select_devices  # probes only; imports neither tensorrt nor pycuda at module level

    return select_devices(cfg)


def create_stages(cfg: Config) -> Tuple[Callable[[Any], Any], Any, str]:
    """(preprocessor, backend (not yet loaded), reason). GPU modules are imported only when chosen."""
    pre_device, backend_kind, reason = choose_devices(cfg)
    if backend_kind == "tensorrt":
        from .gpu.tensorrt_backend import TensorRTBackend

        backend: Any = TensorRTBackend(cfg.model.path, cuda_graph=cfg.backend.cuda_graph)
    else:
        from .backends.onnxruntime_backend import OnnxRuntimeBackend

        backend = OnnxRuntimeBackend(cfg.model.path, cfg.backend.intra_op_threads, cfg.backend.intra_op_spinning)
    if pre_device == "cuda":
        from .gpu.cuda_preprocess import CudaPreprocessor

        preprocessor: Any = CudaPreprocessor(cfg.preprocess, backend)
    else:
        from .preprocess import CpuPreprocessor

        preprocessor = CpuPreprocessor(cfg.preprocess)
    return preprocessor, backend, reason
