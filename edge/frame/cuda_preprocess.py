"""Fused CUDA preprocessing (edge/cuda/preprocess.cu) launched with pycuda.

    pre = CudaPreprocessor(cfg.preprocess, backend)   # backend: a TensorRTBackend, loaded or not
    tensor = pre(frame)                               # HxWx3 uint8 BGR -> DeviceTensor, asynchronous
    logits = backend.infer(tensor)                    # the kernel wrote straight into the engine's input

The frame is copied once into page-locked, device-mapped host memory: on Jetson (integrated GPU) the
kernel reads it in place (zero-copy); on a discrete GPU one host->device copy precedes the kernel.
Geometry comes from edge.frame.preprocess.crop_geometry; the per-pixel math is edge/cuda/preprocess.cuh,
the same code tests/test_cuda_host_math.py compares with CpuPreprocessor.
"""

import hashlib
import os
import shutil
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edge.config import PreprocessConfig
from edge.errors import EdgeError, require
from edge.frame.preprocess import crop_geometry

CUDA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda")
KERNEL_SOURCES = ("preprocess.cu", "preprocess.cuh")
_BLOCK = (16, 16, 1)
_ARG_FORMAT = "PiiiddiiiffffffP"  # src, w, h, stride, scale x/y, offset x/y, crop, mul[3], add[3], dst
_KERNELS = {np.dtype(np.float32): "edge_preprocess_f32", np.dtype(np.float16): "edge_preprocess_f16"}


class CudaSession:
    """One CUDA context and one non-default stream, shared by a preprocessor and its backend.

    make_context() makes the context current on the creating thread; it is popped at once and pushed
    around every use (`with session:`), so any thread may use it without pycuda's
    "explicit_context_dependent" errors. Reference-counted: the last release() destroys the context.
    """

    def __init__(self, device_index: int = 0) -> None:
        self.drv: Any = require("pycuda.driver")
        self.drv.init()
        if self.drv.Device.count() <= device_index:
            raise EdgeError("no CUDA device {} (pycuda sees {})".format(device_index, self.drv.Device.count()))
        self.device: Any = self.drv.Device(device_index)
        self.context: Any = self.device.make_context(self.drv.ctx_flags.MAP_HOST)
        try:
            self.stream: Any = self.drv.Stream()
        finally:
            self.drv.Context.pop()
        self.integrated = bool(self.device.get_attribute(self.drv.device_attribute.INTEGRATED))
        self._users = 1

    def __enter__(self) -> "CudaSession":
        self.context.push()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drv.Context.pop()

    @property
    def arch(self) -> str:
        major, minor = self.device.compute_capability()
        return "sm_{}{}".format(major, minor)

    def gpu_name(self) -> str:
        return str(self.device.name())

    def acquire(self) -> "CudaSession":
        self._users += 1
        return self

    def release(self) -> None:
        self._users -= 1
        if self._users == 0:
            with self:
                self.stream = None
            self.context.detach()


def find_nvcc() -> str:
    """nvcc on PATH, else JetPack's /usr/local/cuda/bin/nvcc (not on PATH by default)."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.isfile(nvcc):
        raise EdgeError("nvcc not found (needed once per GPU to compile the preprocessing kernel): "
                        "apt install cuda-nvcc-<version>, or add /usr/local/cuda/bin to PATH")
    return nvcc


def kernel_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("EDGE_KERNEL_CACHE") or os.path.join(base, "jetson-edge", "kernels")


def load_kernel_module(session: CudaSession) -> Any:
    """The kernel's cubin for this GPU, compiled by nvcc once and cached by GPU arch, CUDA version and source."""
    drv = session.drv
    digest = hashlib.sha256()
    for name in KERNEL_SOURCES:
        with open(os.path.join(CUDA_DIR, name), "rb") as fh:
            digest.update(fh.read())
    cuda = ".".join(str(v) for v in drv.get_version())
    path = os.path.join(kernel_cache_dir(), "preprocess-{}-cuda{}-driver{}-{}.cubin".format(
        session.arch, cuda, drv.get_driver_version(), digest.hexdigest()[:16]))
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            return drv.module_from_buffer(fh.read())
    compiler = require("pycuda.compiler")
    with open(os.path.join(CUDA_DIR, "preprocess.cu"), "r", encoding="utf-8") as fh:
        source = fh.read()
    try:
        cubin = compiler.compile(source, nvcc=find_nvcc(), options=["-std=c++14"], no_extern_c=True,
                                 arch=session.arch, include_dirs=[CUDA_DIR], cache_dir=False)
    except drv.CompileError as exc:
        raise EdgeError("nvcc failed on edge/cuda/preprocess.cu for {}: {}".format(
            session.arch, str(exc).strip().splitlines()[0])) from None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            out.write(cubin)
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn("kernel cache {} not writable ({}): nvcc will run at every start".format(path, exc.strerror),
                      stacklevel=2)
    return drv.module_from_buffer(cubin)


class DeviceTensor:
    """A (1, 3, C, C) tensor in device memory that a CudaPreprocessor writes on its session's stream.

    `frame_key` names the staging buffer and frame size the kernel reads; `pending` means the kernel
    has not been launched yet (the backend replays it inside a CUDA graph).
    """

    def __init__(self, ptr: int, shape: Tuple[int, ...], dtype: np.dtype, source: "CudaPreprocessor",
                 frame_key: Tuple[int, int, int], pending: bool) -> None:
        self.ptr = ptr
        self.shape = shape
        self.dtype = dtype
        self.source = source
        self.frame_key = frame_key
        self.pending = pending

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def download(self) -> np.ndarray:
        """Wait for the kernel and copy the tensor to the host (tests and debugging; the backend never does)."""
        session = self.source.session
        out = np.empty(self.shape, self.dtype)
        with session:
            session.drv.memcpy_dtoh_async(out, self.ptr, session.stream)
            session.stream.synchronize()
        return out


class _Staging:
    """Page-locked, device-mapped host buffer for one frame size, and where the kernel reads it."""

    def __init__(self, session: CudaSession, height: int, width: int) -> None:
        drv = session.drv
        self.host: np.ndarray = drv.pagelocked_empty((height, width, 3), np.uint8,
                                                     mem_flags=drv.host_alloc_flags.DEVICEMAP)
        self.allocation: Any = self.host.base  # pycuda HostAllocation
        self.device: Optional[Any] = None if session.integrated else drv.mem_alloc(self.host.nbytes)
        self.ptr = int(self.allocation.get_device_pointer()) if self.device is None else int(self.device)

    def free(self) -> None:
        if self.device is not None:
            self.device.free()
        self.allocation.free()


class CudaPreprocessor:
    """Same call shape as edge.frame.preprocess.CpuPreprocessor; returns a DeviceTensor instead of an array.

    Paired with a TensorRT backend, the kernel writes into the engine's input binding (float32 or
    float16, whatever the engine takes); alone, into its own `dtype` buffer.
    """

    name = "cuda"

    def __init__(self, cfg: PreprocessConfig, backend: Optional[Any] = None, dtype: Any = np.float32) -> None:
        self.cfg = cfg
        std = np.asarray(cfg.std, np.float32)
        self.mul: List[float] = [float(v) for v in (1.0 / (255.0 * std)).astype(np.float32)]
        self.add: List[float] = [float(v) for v in (-np.asarray(cfg.mean, np.float32) / std).astype(np.float32)]
        self.shape = (1, 3, cfg.crop, cfg.crop)
        self.deferred = False  # set by the backend while a CUDA graph replays the kernel
        backend_session = getattr(backend, "session", None)
        self.session = backend_session.acquire() if backend_session is not None else CudaSession()
        self._module: Any = None
        self._kernels: Dict[np.dtype, Any] = {}
        self._closed = False
        self._staging: Optional[_Staging] = None
        self._own_output: Optional[Any] = None
        self._output_ptr = 0
        self._dtype = np.dtype(dtype)
        drv = self.session.drv
        with self.session:
            self._start: Any = drv.Event()
            self._end: Any = drv.Event()
        self._recorded = False
        if backend is not None:
            backend.attach_preprocessor(self)

    def bind_output(self, ptr: int, dtype: Any) -> None:
        """Write into `ptr` (the engine's input binding, 1x3xCxC of `dtype`) from now on."""
        self._output_ptr, self._dtype = ptr, np.dtype(dtype)
        if self._dtype not in _KERNELS:
            raise EdgeError("the CUDA preprocessor writes float32 or float16, the engine input is {}".format(
                self._dtype))

    def _output(self) -> int:
        if self._output_ptr:
            return self._output_ptr
        if self._own_output is None:
            self._own_output = self.session.drv.mem_alloc(int(np.prod(self.shape)) * self._dtype.itemsize)
        return int(self._own_output)

    def frame_buffer(self, height: int, width: int) -> np.ndarray:
        """The pinned HxWx3 buffer the kernel reads: a source that decodes into it saves the host copy."""
        staging = self._staging
        if staging is None or staging.host.shape[:2] != (height, width):
            with self.session:
                if staging is not None:
                    self.session.stream.synchronize()
                    staging.free()
                staging = self._staging = _Staging(self.session, height, width)
        return staging.host

    def __call__(self, frame: np.ndarray) -> DeviceTensor:
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError("expected an HxWx3 uint8 BGR frame, got {} {}".format(frame.shape, frame.dtype))
        with self.session:
            if self._recorded:
                self._end.synchronize()  # the previous kernel may still read the staging buffer
            host = self.frame_buffer(frame.shape[0], frame.shape[1])
            if frame.ctypes.data != host.ctypes.data:
                np.copyto(host, frame)
            if not self.deferred:
                self.enqueue(timed=True)
        assert self._staging is not None
        key = (self._staging.ptr, frame.shape[0], frame.shape[1])
        return DeviceTensor(self._output(), self.shape, self._dtype, self, key, self.deferred)

    def enqueue(self, timed: bool) -> None:
        """Queue (host->device copy on a discrete GPU and) the kernel for the staged frame; context pushed.

        `timed` brackets it with CUDA events; off while a CUDA graph is being captured."""
        staging, stream, drv = self._staging, self.session.stream, self.session.drv
        assert staging is not None, "call the preprocessor with a frame first"
        kernel = self._kernels.get(self._dtype)
        if kernel is None:
            if not self._kernels:
                self._module = load_kernel_module(self.session)
            kernel = self._kernels[self._dtype] = self._module.get_function(_KERNELS[self._dtype]).prepare(_ARG_FORMAT)
        height, width = staging.host.shape[:2]
        g = crop_geometry(width, height, self.cfg.resize, self.cfg.crop)
        if timed:
            self._start.record(stream)
        if staging.device is not None:
            drv.memcpy_htod_async(staging.device, staging.host, stream)
        grid = ((g.crop + _BLOCK[0] - 1) // _BLOCK[0], (g.crop + _BLOCK[1] - 1) // _BLOCK[1])
        kernel.prepared_async_call(grid, _BLOCK, stream, staging.ptr, width, height, staging.host.strides[0],
                                   g.scale_x, g.scale_y, g.offset_x, g.offset_y, g.crop,
                                   *(self.mul + self.add), self._output())
        if timed:
            self._end.record(stream)
        self._recorded = timed

    def device_ms(self) -> Optional[float]:
        """GPU time of the last timed launch (copy + kernel), once the stream has passed it; else None."""
        if not self._recorded or not self._end.query():
            return None
        return float(self._start.time_till(self._end))

    def close(self) -> None:
        """Free the staging and output buffers and release the CUDA session; safe to call twice."""
        if self._closed:
            return
        with self.session:
            self.session.stream.synchronize()
            if self._staging is not None:
                self._staging.free()
            if self._own_output is not None:
                self._own_output.free()
            self._start = self._end = self._module = None
            self._kernels.clear()
        self._staging = self._own_output = None
        self._recorded, self._closed = False, True
        self.session.release()
