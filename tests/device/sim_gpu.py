"""A stand-in for pycuda that runs on the CPU, for tests/device/test_simulated.py (tensorrt's is
tests/fake_tensorrt.py).

"Device memory" is host memory, so pointers are real addresses. The kernel launch calls the host build of
edge/cuda/preprocess.cuh (edge/cuda/host_preprocess.cpp) with the arguments the launcher packed, after
checking them against the prepared format; module loads take the real prebuilt images (a cubin or the
shipped fatbin) and can be made to fail like a driver without a matching image. The fake records the context
stack and live allocations.
"""

import ctypes
import os
import types
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from fake_tensorrt import view

CUDA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "edge", "cuda")
FATBIN_MAGIC = b"\x50\xed\x55\xba"


def address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, np.uint8).ctypes.data)


class Allocation(bytearray):
    """Device or pinned host memory: the numpy array's base, with pycuda's methods."""

    live: Dict[int, "Allocation"] = {}

    def __init__(self, nbytes: int) -> None:
        super().__init__(max(nbytes, 1))
        Allocation.live[id(self)] = self

    def __int__(self) -> int:
        return address(self)

    def get_device_pointer(self) -> int:
        return address(self)

    def free(self) -> None:
        Allocation.live.pop(id(self), None)


class Sim:
    """Per-test state: the fake modules, the context stack, compile calls, kernel launches."""

    def __init__(self, host_lib: ctypes.CDLL, integrated: bool) -> None:
        self.host_lib, self.integrated = host_lib, integrated
        self.stack: List[Any] = []
        self.stream_flags: List[int] = []  # of every Stream made, then every Event: what the code asked for
        self.event_flags: List[int] = []
        self.loads: List[bytes] = []  # images given to module_from_buffer
        self.load_error: Optional[str] = None  # set: every module load fails with this (pycuda's LogicError)
        self.launches: List[Tuple[str, Tuple[Any, ...]]] = []
        self.context_flags: Optional[int] = None
        self.registered: Set[int] = set()  # addresses of host memory registered with CUDA
        Allocation.live.clear()
        self.driver = self._driver()

    def _launch(self, name: str, fmt: str, grid: Tuple[int, ...], block: Tuple[int, ...],
                args: Tuple[Any, ...]) -> None:
        kinds = {"P": int, "i": int, "d": float, "f": float}
        assert len(args) == len(fmt) and all(isinstance(a, kinds[c]) for a, c in zip(args, fmt)), (fmt, args)
        src, w, h, stride, sx, sy, ox, oy, crop = args[:9]
        mul, add, dst = args[9:12], args[12:15], args[15]
        assert grid[0] * block[0] >= crop and grid[1] * block[1] >= crop
        self.launches.append((name, args))
        out = np.empty((1, 3, crop, crop), np.float32)
        fp = ctypes.POINTER(ctypes.c_float)
        self.host_lib.edge_preprocess_host(
            ctypes.c_void_p(src), w, h, stride, ctypes.c_double(sx), ctypes.c_double(sy), ox, oy, crop,
            np.asarray(mul, np.float32).ctypes.data_as(fp), np.asarray(add, np.float32).ctypes.data_as(fp),
            out.ctypes.data_as(fp))
        dtype = np.float16 if name.endswith("f16") else np.float32
        view(dst, out.shape, dtype)[...] = out

    def _driver(self) -> types.ModuleType:
        sim = self
        drv = types.ModuleType("pycuda.driver")

        class Context:
            def __init__(self) -> None:
                self.detached = False

            def push(self) -> None:
                sim.stack.append(self)

            @staticmethod
            def pop() -> None:
                sim.stack.pop()

            def detach(self) -> None:
                assert self not in sim.stack
                self.detached = True

        class Device:
            @staticmethod
            def count() -> int:
                return 1

            def __init__(self, index: int) -> None:
                self.index = index

            def make_context(self, flags: int = 0) -> Context:
                sim.context_flags = flags
                ctx = Context()
                ctx.push()
                sim.context = ctx
                return ctx

            def get_attribute(self, attribute: str) -> int:
                return {"INTEGRATED": int(sim.integrated), "MULTIPROCESSOR_COUNT": 16}[attribute]

            def compute_capability(self) -> Tuple[int, int]:
                return (8, 7)

            def name(self) -> str:
                return "Simulated Orin"

        class Stream:
            handle = 1234

            def __init__(self, flags: int = 0) -> None:  # pycuda's: cuStreamCreate's flags, an int
                assert isinstance(flags, int) and flags in (0, 1), flags
                sim.stream_flags.append(flags)

            def synchronize(self) -> None:
                assert sim.stack, "stream used without a current context"

        class Event:
            def __init__(self, flags: int = 0) -> None:  # pycuda's: CUevent_flags
                assert flags in (0, 1, 2, 3), flags
                sim.event_flags.append(flags)

            def record(self, stream: Any = None) -> "Event":
                assert sim.stack, "event recorded without a current context"
                return self

            def synchronize(self) -> "Event":
                return self

            def query(self) -> bool:
                return True

            def time_till(self, other: "Event") -> float:
                return 0.25

        class Function:
            def __init__(self, name: str) -> None:
                self.name, self.fmt = name, ""

            def prepare(self, fmt: str) -> "Function":
                self.fmt = fmt
                return self

            def prepared_async_call(self, grid: Tuple[int, ...], block: Tuple[int, ...], stream: Any,
                                    *args: Any) -> None:
                assert sim.stack, "kernel launched without a current context"
                sim._launch(self.name, self.fmt, grid, block, args)

        class Module:
            def __init__(self, image: bytes) -> None:
                assert sim.stack, "module loaded without a current context"
                assert image[:4] in (b"\x7fELF", FATBIN_MAGIC), "neither a cubin nor a fatbin"
                sim.loads.append(image)
                if sim.load_error is not None:
                    raise RuntimeError(sim.load_error)
                self.cubin = image

            def get_function(self, name: str) -> Function:
                assert name.encode() in self.cubin, name
                return Function(name)

        def pagelocked_empty(shape: Sequence[int], dtype: Any, order: str = "C", mem_flags: int = 0) -> np.ndarray:
            return np.ndarray(shape, dtype, buffer=Allocation(int(np.prod(shape)) * np.dtype(dtype).itemsize))

        def host_register(address: ctypes.c_void_p, size: ctypes.c_size_t, flags: ctypes.c_uint) -> int:
            assert sim.stack, "register without a current context"
            assert address.value % 4096 == 0, "cuMemHostRegister wants page-aligned memory here"
            sim.registered.add(address.value)
            return 0

        def host_unregister(address: ctypes.c_void_p) -> int:
            assert sim.stack, "unregister without a current context"
            sim.registered.remove(address.value)
            return 0

        # libcuda's entry points the code calls through ctypes (edge.infer.cuda_session.driver_library)
        self.driver_library = types.SimpleNamespace(cuMemHostRegister_v2=host_register,
                                                    cuMemHostUnregister=host_unregister)

        def memcpy(dst: int, src: int, size: int) -> None:
            assert sim.stack, "copy without a current context"
            ctypes.memmove(dst, src, size)

        drv.init = lambda: None
        drv.Device, drv.Context, drv.Stream, drv.Event = Device, Context, Stream, Event
        drv.ctx_flags = types.SimpleNamespace(MAP_HOST=8, SCHED_BLOCKING_SYNC=4)
        drv.event_flags = types.SimpleNamespace(DEFAULT=0, BLOCKING_SYNC=1, DISABLE_TIMING=2)
        drv.device_attribute = types.SimpleNamespace(INTEGRATED="INTEGRATED",
                                                     MULTIPROCESSOR_COUNT="MULTIPROCESSOR_COUNT")
        drv.host_alloc_flags = types.SimpleNamespace(DEVICEMAP=2)
        drv.get_version = lambda: (11, 4, 0)
        drv.get_driver_version = lambda: 11040
        drv.module_from_buffer = Module
        drv.mem_alloc = Allocation
        drv.pagelocked_empty = pagelocked_empty
        drv.memcpy_htod_async = lambda dst, src, stream=None: memcpy(int(dst), src.ctypes.data, src.nbytes)
        drv.memcpy_dtoh_async = lambda dst, src, stream=None: memcpy(dst.ctypes.data, int(src), dst.nbytes)
        drv.memcpy_dtod_async = lambda dst, src, size, stream=None: memcpy(int(dst), int(src), size)
        return drv
