"""Fused CUDA preprocessing (edge/cuda/preprocess.cu) launched with pycuda.

    pre = CudaPreprocessor(cfg.preprocess, session)   # session: edge.infer.cuda_session.CudaSession, borrowed
    tensor = pre(frame)                               # HxWx3 uint8 BGR -> DeviceTensor, asynchronous
    logits = backend.infer(tensor)                    # a TensorRT backend binds tensor.ptr as its input

The preprocessor writes into its own device buffer; a consumer binds whatever device buffer it is handed
(as Polygraphy's TrtRunner binds a device pointer), so producer and consumer never pair. `write_as` picks the
dtype the consumer takes (float32 or float16). The kernel binary is built ahead of time and loaded when the
preprocessor is made (edge.infer.cuda_kernel): no kernel is a KernelUnavailable at start, never a per-frame
failure.

The frame is staged in page-locked host memory and copied once into device memory, which the kernel reads: on
Jetson, pinned host memory is uncached for the iGPU (CUDA for Tegra, memory types table) while the kernel reads
each source byte many times (triangle taps of neighbouring output pixels overlap). A frame reader asks
`staging_buffers(height, width)` for page-locked buffers to read into (edge.sources.reader): a frame that arrived
in one is copied to the device from there, with no host copy; any other frame is first copied into the
preprocessor's own page-locked buffer (the fallback). Those buffers are plain NumPy memory registered with CUDA
(cuMemHostRegister), so a frame in one stays valid after close() unregisters it.
Geometry comes from edge.infer.preprocess.crop_geometry; the per-pixel math is edge/cuda/preprocess.cuh,
the same code tests/test_cuda_host_math.py compares with CpuPreprocessor.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edge.config import PreprocessConfig
from edge.errors import EdgeError
from edge.infer.cuda_kernel import KERNELS, load_kernel
from edge.infer.cuda_session import CudaSession
from edge.infer.preprocess import Preprocessor, crop_geometry

_BLOCK = (16, 16, 1)
_ARG_FORMAT = "PiiiddiiiffffffP"  # src, w, h, stride, scale x/y, offset x/y, crop, mul[3], add[3], dst
_KERNELS: Dict[np.dtype, str] = {np.dtype(np.float32): KERNELS[0], np.dtype(np.float16): KERNELS[1]}
READER_BUFFERS = 3  # the one being read into, the newest frame waiting, the frame the consumer holds
_PAGE = 4096


_COPY_THREADS = min(4, os.cpu_count() or 1)
_COPY_SPLIT_BYTES = 1 << 20  # below this one thread is faster than handing out the bands
_copiers: Optional[ThreadPoolExecutor] = None


def copy_frame(dst: np.ndarray, src: np.ndarray) -> None:
    """np.copyto(dst, src) in bands of rows on a few threads (NumPy releases the GIL): the fallback staging copy,
    which on one thread took more than half of a 720p call on an H200 (issue 45)."""
    global _copiers
    rows = src.shape[0]
    if src.nbytes < _COPY_SPLIT_BYTES or _COPY_THREADS < 2 or rows < _COPY_THREADS:
        np.copyto(dst, src)
        return
    if _copiers is None:
        _copiers = ThreadPoolExecutor(_COPY_THREADS, thread_name_prefix="edge-stage-copy")
    bands = [slice(rows * i // _COPY_THREADS, rows * (i + 1) // _COPY_THREADS) for i in range(_COPY_THREADS)]
    for done in [_copiers.submit(np.copyto, dst[band], src[band]) for band in bands]:
        done.result()


def page_aligned(shape: Tuple[int, ...]) -> np.ndarray:
    """An empty uint8 array of `shape` starting on a page boundary (what cuMemHostRegister pins)."""
    size = int(np.prod(shape))
    raw = np.empty(size + _PAGE, np.uint8)
    start = -raw.ctypes.data % _PAGE
    return raw[start:start + size].reshape(shape)


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

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """np.asarray(tensor): the download, for a host backend (ONNX Runtime beside `preprocess.device cuda`)."""
        out = self.download()
        return out if dtype is None else out.astype(dtype)


class _Staging:
    """Page-locked host buffer for one frame size and the device buffer it is copied into."""

    def __init__(self, session: CudaSession, height: int, width: int) -> None:
        drv = session.drv
        self.host: np.ndarray = drv.pagelocked_empty((height, width, 3), np.uint8)
        self.device: Any = drv.mem_alloc(self.host.nbytes)

    def free(self) -> None:
        self.device.free()
        allocation: Any = self.host.base  # pycuda HostAllocation
        allocation.free()


class CudaPreprocessor(Preprocessor):
    """Same call shape as edge.infer.preprocess.CpuPreprocessor; returns a DeviceTensor instead of an array."""

    name = "cuda"

    def __init__(self, cfg: PreprocessConfig, session: CudaSession, dtype: Any = np.float32) -> None:
        self.cfg = cfg
        self.session = session
        std = np.asarray(cfg.std, np.float32)
        self.mul: List[float] = [float(v) for v in (1.0 / (255.0 * std)).astype(np.float32)]
        self.add: List[float] = [float(v) for v in (-np.asarray(cfg.mean, np.float32) / std).astype(np.float32)]
        self.shape = (1, 3, cfg.crop, cfg.crop)
        self._staging: Optional[_Staging] = None
        self._output: Optional[Any] = None
        self._dtype = np.dtype(np.float32)
        self._recorded = False
        drv = session.drv
        with session:  # eagerly: a GPU without a loadable kernel fails here, at start
            self._module, self.kernel_source = load_kernel(drv, session.arch)
            self._kernels: Dict[np.dtype, Any] = {
                dt: self._module.get_function(name).prepare(_ARG_FORMAT) for dt, name in _KERNELS.items()}
            self._start: Any = session.event()
            self._end: Any = session.event()
        self._pools: Dict[Tuple[int, int], List[np.ndarray]] = {}  # (height, width) -> buffers readers fill
        self._registered: List[np.ndarray] = []  # pinned buffers, unpinned by close()
        self.pin_failed: Optional[str] = None  # why reader buffers could not be page-locked (fallback copies)
        self._pool_lock = threading.Lock()
        self.copied = 0  # frames that took the fallback host copy (they arrived outside the staging buffers)
        self.write_as(dtype)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def write_as(self, dtype: Any) -> None:
        """Write float32 or float16 from now on (what the consumer's input takes)."""
        dtype = np.dtype(dtype)
        if dtype not in _KERNELS:
            raise EdgeError("the CUDA preprocessor writes float32 or float16, the model input is {}".format(dtype))
        if self._output is not None and dtype == self._dtype:
            return
        with self.session:
            if self._output is not None:
                self.session.stream.synchronize()
                self._output.free()
            self._output = self.session.drv.mem_alloc(int(np.prod(self.shape)) * dtype.itemsize)
        self._dtype = dtype

    def _stage(self, height: int, width: int) -> _Staging:
        staging = self._staging
        if staging is None or staging.host.shape[:2] != (height, width):
            if staging is not None:
                self.session.stream.synchronize()
                staging.free()
            staging = self._staging = _Staging(self.session, height, width)
        return staging

    def staging_buffers(self, height: int, width: int) -> List[np.ndarray]:
        """READER_BUFFERS page-locked HxWx3 uint8 buffers a reader may read frames into, the same ones each call
        for a size (any thread)."""
        with self._pool_lock:
            pool = self._pools.get((height, width))
            if pool is None:
                if self._output is None:
                    raise EdgeError("the CUDA preprocessor is closed")
                pool = [page_aligned((height, width, 3)) for _ in range(READER_BUFFERS)]
                with self.session:
                    outcomes = [(b, self.session.pin(b)) for b in pool]
                self._registered += [b for b, why in outcomes if why is None]
                failed = next((why for _, why in outcomes if why), None)
                if failed:  # frames then arrive in the reader's own arrays and take the fallback copy
                    self.pin_failed, pool = failed, []
                self._pools[(height, width)] = pool
            return pool

    def _pinned(self, frame: np.ndarray) -> Optional[np.ndarray]:
        """The staging buffer `frame` is (it arrived there), else None."""
        pool = self._pools.get(frame.shape[:2], ())
        address = frame.__array_interface__["data"][0]
        return next((b for b in pool if b.ctypes.data == address and b.strides == frame.strides), None)

    def __call__(self, frame: np.ndarray) -> DeviceTensor:
        """Stage the frame and queue the copy and the kernel on the session's stream, between CUDA events."""
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError("expected an HxWx3 uint8 BGR frame, got {} {}".format(frame.shape, frame.dtype))
        stream, drv = self.session.stream, self.session.drv
        assert self._output is not None
        with self.session:
            if self._recorded:
                self._end.synchronize()  # the previous copy may still read the staging buffer
            staging = self._stage(frame.shape[0], frame.shape[1])
            source = self._pinned(frame)
            if source is None:
                copy_frame(staging.host, frame)
                source = staging.host
                self.copied += 1
            g = crop_geometry(frame.shape[1], frame.shape[0], resize=self.cfg.resize, crop=self.cfg.crop)
            self._start.record(stream)
            drv.memcpy_htod_async(staging.device, source, stream)
            grid = ((g.crop + _BLOCK[0] - 1) // _BLOCK[0], (g.crop + _BLOCK[1] - 1) // _BLOCK[1])
            self._kernels[self._dtype].prepared_async_call(
                grid, _BLOCK, stream, int(staging.device), frame.shape[1], frame.shape[0], source.strides[0],
                g.scale_x, g.scale_y, g.offset_x, g.offset_y, g.crop, *(self.mul + self.add), int(self._output))
            self._end.record(stream)
            self._recorded = True
        return DeviceTensor(int(self._output), self.shape, self._dtype, self)

    def device_ms(self) -> Optional[float]:
        """GPU time of the last launch (copy + kernel), once the stream has passed it; else None."""
        if not self._recorded or not self._end.query():
            return None
        return float(self._start.time_till(self._end))

    def close(self) -> None:
        """Free the staging and output buffers; safe to call twice. The session is its owner's to release."""
        if self._output is None:
            return
        with self.session:
            self.session.stream.synchronize()
            if self._staging is not None:
                self._staging.free()
            with self._pool_lock:
                for buffer in self._registered:
                    self.session.unpin(buffer)  # the buffers stay valid NumPy memory, no longer page-locked
                self._registered, self._pools = [], {}
            self._output.free()
            self._start = self._end = self._module = None
            self._kernels.clear()
        self._staging = self._output = None
        self._recorded = False
