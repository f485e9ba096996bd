"""One CUDA context and one non-default stream: what the GPU stages of one model, or one engine build, run on.

    session = CudaSession()            # made by its owner: Stages (edge.infer.stages), an EngineRunner used
    with session:                      # alone, or the engine build; the owner releases it, after everything
        ...                            # that allocated on it
    session.release()

make_context() makes the context current on the creating thread; it is popped at once and pushed around every
use (`with session:`), so any thread may use it without pycuda's "explicit_context_dependent" errors.
"""

import ctypes
import functools
from typing import Any, Optional

import numpy as np

from edge.errors import EdgeError, require

CU_STREAM_NON_BLOCKING = 0x1  # cuda.h's; pycuda's Stream(flags) has no enum for it


@functools.lru_cache(maxsize=None)
def driver_library() -> Any:
    """The CUDA driver itself (libcuda), for what pycuda does not wrap: stream capture, host memory registration."""
    return ctypes.CDLL("libcuda.so.1")


class CudaSession:
    def __init__(self, device_index: int = 0) -> None:
        self.drv: Any = require("pycuda.driver")
        self.drv.init()
        if self.drv.Device.count() <= device_index:
            raise EdgeError("no CUDA device {} (pycuda sees {})".format(device_index, self.drv.Device.count()))
        self.device: Any = self.drv.Device(device_index)
        # BLOCKING_SYNC: a thread waiting for the GPU sleeps instead of spinning on a CPU core (the default's
        # spin-then-yield costs a core of a Jetson's 6 for every synchronise of every frame)
        self.context: Any = self.device.make_context(self.drv.ctx_flags.SCHED_BLOCKING_SYNC)
        try:
            # NON_BLOCKING: no implicit synchronisation with the legacy default stream, whose work (another
            # library's, a synchronous copy) would otherwise serialise with ours and invalidate a CUDA graph capture
            self.stream: Any = self.drv.Stream(CU_STREAM_NON_BLOCKING)
        finally:
            self.drv.Context.pop()
        self.released = False

    def __enter__(self) -> "CudaSession":
        self.context.push()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drv.Context.pop()

    @property
    def arch(self) -> str:
        major, minor = self.device.compute_capability()
        return "sm_{}{}".format(major, minor)

    def event(self) -> Any:
        """A timing event whose wait sleeps (BLOCKING_SYNC), as the context's synchronise does, not spinning a core."""
        return self.drv.Event(self.drv.event_flags.BLOCKING_SYNC)

    def pin(self, buffer: np.ndarray) -> Optional[str]:
        """Page-lock `buffer` (C-contiguous, starting on a page) for asynchronous copies: None, or why it could not
        be. cuMemHostRegister directly: pycuda's register_host_memory sets the base of an array NumPy already gave
        one, and fails ("Cannot set the NumPy array 'base' dependency more than once"; pycuda 2026.1, an H200)."""
        try:
            status = driver_library().cuMemHostRegister_v2(ctypes.c_void_p(buffer.ctypes.data),
                                                           ctypes.c_size_t(buffer.nbytes), ctypes.c_uint(0))
        except (OSError, AttributeError) as exc:
            return "no CUDA driver library: {}".format(exc)
        return None if status == 0 else "cuMemHostRegister failed with CUDA error {}".format(status)

    def unpin(self, buffer: np.ndarray) -> None:
        """Undo pin(): the memory stays the array's, no longer page-locked (inside `with session:`)."""
        driver_library().cuMemHostUnregister(ctypes.c_void_p(buffer.ctypes.data))

    def gpu_name(self) -> str:
        return str(self.device.name())

    def release(self) -> None:
        """Destroy the stream and the context; safe to call twice. Whatever was allocated on it is freed first."""
        if self.released:
            return
        self.released = True
        with self:
            self.stream = None
        self.context.detach()
