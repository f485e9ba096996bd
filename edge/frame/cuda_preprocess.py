"""Fused CUDA preprocessing (edge/cuda/preprocess.cu) launched with pycuda.

    pre = CudaPreprocessor(cfg.preprocess, backend)   # backend: a TensorRTBackend, loaded or not
    tensor = pre(frame)                               # HxWx3 uint8 BGR -> DeviceTensor, asynchronous
    logits = backend.infer(tensor)                    # the kernel wrote straight into the engine's input

The kernel binary is built ahead of time and loaded when the preprocessor is made (edge.frame.cuda_kernel):
no kernel is a KernelUnavailable at start, never a per-frame failure.

Frame transfer (`transfer`): the frame is staged in page-locked host memory, then
  copy    (default) one host->device copy, and the kernel reads device memory;
  mapped  the kernel reads the pinned buffer in place through its device pointer (zero-copy).
On Jetson, pinned host memory is uncached for the iGPU (CUDA for Tegra, memory types table) while the
kernel reads each source byte many times (triangle taps of neighbouring output pixels overlap), so the
default is one copy into device memory, which the iGPU caches; tests/device/test_cuda_kernel.py times both.
Geometry comes from edge.frame.preprocess.crop_geometry; the per-pixel math is edge/cuda/preprocess.cuh,
the same code tests/test_cuda_host_math.py compares with CpuPreprocessor.
"""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edge.config import PreprocessConfig
from edge.errors import EdgeError, require
from edge.frame.cuda_kernel import KERNELS, load_kernel
from edge.frame.preprocess import crop_geometry

TRANSFERS = ("copy", "mapped")
_BLOCK = (16, 16, 1)
_ARG_FORMAT = "PiiiddiiiffffffP"  # src, w, h, stride, scale x/y, offset x/y, crop, mul[3], add[3], dst
_KERNELS: Dict[np.dtype, str] = {np.dtype(np.float32): KERNELS[0], np.dtype(np.float16): KERNELS[1]}


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


class DeviceTensor:
    """A (1, 3, C, C) tensor in device memory that a CudaPreprocessor writes on its session's stream."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], dtype: np.dtype, source: "CudaPreprocessor") -> None:
        self.ptr = ptr
        self.shape = shape
        self.dtype = dtype
        self.source = source

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
    """Page-locked host buffer for one frame size, and where the kernel reads it (see `transfer` above)."""

    def __init__(self, session: CudaSession, height: int, width: int, mapped: bool) -> None:
        drv = session.drv
        self.host: np.ndarray = drv.pagelocked_empty((height, width, 3), np.uint8,
                                                     mem_flags=drv.host_alloc_flags.DEVICEMAP if mapped else 0)
        self.allocation: Any = self.host.base  # pycuda HostAllocation
        self.device: Optional[Any] = None if mapped else drv.mem_alloc(self.host.nbytes)
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

    def __init__(self, cfg: PreprocessConfig, backend: Optional[Any] = None, dtype: Any = np.float32,
                 transfer: str = "copy") -> None:
        if transfer not in TRANSFERS:
            raise EdgeError("transfer {!r}: one of {}".format(transfer, ", ".join(TRANSFERS)))
        self.cfg = cfg
        self.transfer = transfer
        std = np.asarray(cfg.std, np.float32)
        self.mul: List[float] = [float(v) for v in (1.0 / (255.0 * std)).astype(np.float32)]
        self.add: List[float] = [float(v) for v in (-np.asarray(cfg.mean, np.float32) / std).astype(np.float32)]
        self.shape = (1, 3, cfg.crop, cfg.crop)
        backend_session = getattr(backend, "session", None)
        self.session = backend_session.acquire() if backend_session is not None else CudaSession()
        self._closed = False
        self._staging: Optional[_Staging] = None
        self._own_output: Optional[Any] = None
        self._output_ptr = 0
        self._dtype = np.dtype(dtype)
        drv = self.session.drv
        try:
            with self.session:  # eagerly: a GPU without a loadable kernel fails here, at start
                self._module, self.kernel_source = load_kernel(drv, self.session.arch)
                self._kernels: Dict[np.dtype, Any] = {
                    dt: self._module.get_function(name).prepare(_ARG_FORMAT) for dt, name in _KERNELS.items()}
                self._start: Any = drv.Event()
                self._end: Any = drv.Event()
        except BaseException:
            self.session.release()
            raise
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
                staging = self._staging = _Staging(self.session, height, width, self.transfer == "mapped")
        return staging.host

    def __call__(self, frame: np.ndarray) -> DeviceTensor:
        """Stage the frame and queue (the copy and) the kernel on the session's stream, between CUDA events."""
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError("expected an HxWx3 uint8 BGR frame, got {} {}".format(frame.shape, frame.dtype))
        stream, drv = self.session.stream, self.session.drv
        with self.session:
            if self._recorded:
                self._end.synchronize()  # the previous kernel may still read the staging buffer
            host = self.frame_buffer(frame.shape[0], frame.shape[1])
            if frame.ctypes.data != host.ctypes.data:
                np.copyto(host, frame)
            staging = self._staging
            assert staging is not None
            g = crop_geometry(frame.shape[1], frame.shape[0], self.cfg.resize, self.cfg.crop)
            self._start.record(stream)
            if staging.device is not None:
                drv.memcpy_htod_async(staging.device, host, stream)
            grid = ((g.crop + _BLOCK[0] - 1) // _BLOCK[0], (g.crop + _BLOCK[1] - 1) // _BLOCK[1])
            self._kernels[self._dtype].prepared_async_call(
                grid, _BLOCK, stream, staging.ptr, frame.shape[1], frame.shape[0], host.strides[0],
                g.scale_x, g.scale_y, g.offset_x, g.offset_y, g.crop, *(self.mul + self.add), self._output())
            self._end.record(stream)
            self._recorded = True
        return DeviceTensor(self._output(), self.shape, self._dtype, self)

    def device_ms(self) -> Optional[float]:
        """GPU time of the last launch (copy + kernel), once the stream has passed it; else None."""
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
