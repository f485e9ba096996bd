"""The one TensorRT engine loader and runner (TensorRT >= 8.5: named tensors and execute_async_v3 only).

    with EngineRunner("engines/model.int8.engine") as engine:   # deserialise, allocate, bind by name: a LoadedEngine
        logits = engine.infer(tensor)                           # NumPy in, float32 NumPy out

Used by the runtime backend (edge.infer.tensorrt_backend), the build's verification and the accuracy gate.
`copy_in`, `enqueue` and `result` are the asynchronous pieces the backend times and captures; they expect
the session's context pushed (`with engine.session:`). tensorrt and pycuda load lazily.
"""

from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from edge.board import tensorrt_probe
from edge.errors import EXIT_FAIL, EdgeError, require
from edge.infer.backend import Loaded, Runner
from edge.infer.cuda_session import CudaSession
from edge.store.artifact import sha256_bytes

if TYPE_CHECKING:
    import tensorrt as trt


class TensorSpec(NamedTuple):
    name: str
    is_input: bool
    shape: Tuple[int, ...]
    dtype: "np.dtype[Any]"


def require_tensorrt() -> str:
    """TensorRT's version; a one-line EdgeError for type stubs alone, nothing, or a TensorRT before 8.5."""
    problem = tensorrt_probe().problem
    if problem is not None:
        raise EdgeError(problem + "; on a Jetson: apt install python3-libnvinfer (JetPack's TensorRT)")
    return str(require("tensorrt").__version__)


def np_dtype(dtype: "trt.DataType") -> "np.dtype[Any]":
    """The NumPy type of a TensorRT I/O tensor (the one table)."""
    import tensorrt as trt

    names = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "BOOL": np.bool_,
             "UINT8": np.uint8, "INT64": np.int64}  # UINT8 since TensorRT 8.5, INT64 since 10.0
    table = {getattr(trt.DataType, name): np_type for name, np_type in names.items() if hasattr(trt.DataType, name)}
    if dtype not in table:
        raise EdgeError("unsupported TensorRT I/O data type {}".format(dtype), exit_code=EXIT_FAIL)
    return np.dtype(table[dtype])


def shape_of(dims: "trt.Dims") -> Tuple[int, ...]:
    return tuple(int(dims[k]) for k in range(len(dims)))


def io_tensors(engine: "trt.ICudaEngine") -> List[TensorSpec]:
    import tensorrt as trt

    specs = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        specs.append(TensorSpec(name, engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                                shape_of(engine.get_tensor_shape(name)), np_dtype(engine.get_tensor_dtype(name))))
    return specs


class EngineRunner(Runner["LoadedEngine"]):
    """An engine file to run on a CudaSession: `load(data)` -> a LoadedEngine. `session`: the one its owner releases
    (the stages'); by default one of its own, made at load and released by the LoadedEngine's close()."""

    name = "engine runner"

    def __init__(self, engine_path: str, session: Optional[CudaSession] = None) -> None:
        self.engine_path = engine_path
        self.session = session

    def _load(self, data: Optional[bytes]) -> "LoadedEngine":
        """Deserialise `data` (an engine's bytes already read and checked), or the file's."""
        require_tensorrt()
        session, own = (self.session, False) if self.session is not None else (CudaSession(), True)
        loaded = LoadedEngine(self.engine_path, session, own_session=own)
        try:
            with session:
                loaded.deserialise(data)
        except BaseException:
            loaded.close()
            raise
        return loaded


class LoadedEngine(Loaded):
    """A deserialised engine with one input, its first output, device buffers bound by name, pinned host copies.
    `bind_input` makes the engine read another device buffer (a preprocessor's output) in place."""

    def __init__(self, engine_path: str, session: CudaSession, *, own_session: bool) -> None:
        self.engine_path = engine_path
        self.session = session
        self._own_session = own_session  # a session made by the runner is released by close()
        self.sha256 = "unknown"  # of the engine bytes it read itself (load(data): the caller has it)
        self._device: Dict[str, Any] = {}  # tensor name -> pycuda DeviceAllocation
        self._host: List[np.ndarray] = []  # pinned input and output staging
        self._objects: List[Any] = []  # logger, runtime, engine, context: released in reverse
        self._input_ptr = 0  # the device buffer the input tensor is bound to

    def deserialise(self, data: Optional[bytes]) -> None:
        """The engine, its context, tensors and buffers (the session pushed); only load() calls it."""
        import tensorrt as trt

        logger = trt.Logger(trt.Logger.WARNING)  # must outlive the runtime
        runtime = trt.Runtime(logger)
        self._objects = [logger, runtime]
        if data is None:
            with open(self.engine_path, "rb") as fh:
                data = fh.read()
            self.sha256 = sha256_bytes(data)
        engine: Optional[trt.ICudaEngine] = runtime.deserialize_cuda_engine(data)
        if engine is None:
            raise EdgeError("{}: TensorRT {} cannot deserialise it (built for another TensorRT version or GPU? "
                            "rebuild it on this device)".format(self.engine_path, trt.__version__))
        self.engine: "trt.ICudaEngine" = engine  # a batch engine's other profiles get their own contexts
        self.context: "trt.IExecutionContext" = engine.create_execution_context()
        self._objects += [engine, self.context]
        tensors = io_tensors(engine)
        inputs = [t for t in tensors if t.is_input]
        outputs = [t for t in tensors if not t.is_input]
        if len(inputs) != 1 or not outputs:
            raise EdgeError("{}: expected one input and at least one output, got {} and {}".format(
                self.engine_path, len(inputs), len(outputs)))
        if any(d < 0 for t in tensors for d in t.shape):
            tensors = self._batch_one(tensors)
            inputs, outputs = [t for t in tensors if t.is_input], [t for t in tensors if not t.is_input]
        self.input, self.output = inputs[0], outputs[0]
        drv = self.session.drv
        for t in tensors:
            self._device[t.name] = drv.mem_alloc(max(1, int(np.prod(t.shape))) * t.dtype.itemsize)
            self.context.set_tensor_address(t.name, int(self._device[t.name]))
        self._input_ptr = int(self._device[self.input.name])
        self._host = [drv.pagelocked_empty(t.shape, t.dtype) for t in (self.input, self.output)]

    def _batch_one(self, tensors: List[TensorSpec]) -> List[TensorSpec]:
        """An engine with a dynamic batch axis and one profile per size (edge.model.tensorrt_engine): this
        context runs profile 0, batch 1 (the other sizes are edge.infer.tensorrt_batch's); the shapes it resolves."""
        inp = next(t for t in tensors if t.is_input)
        first = shape_of(self.engine.get_tensor_profile_shape(inp.name, 0)[1])
        if any(d < 0 for d in inp.shape[1:]) or first[0] != 1 or not self.context.set_input_shape(inp.name, first):
            raise EdgeError("{}: dynamic shapes other than a batch axis whose first profile is batch 1 are not "
                            "supported; rebuild it with edge build".format(self.engine_path))
        return [TensorSpec(t.name, t.is_input, shape_of(self.context.get_tensor_shape(t.name)), t.dtype)
                for t in tensors]

    def input_ptr(self) -> int:
        """The device buffer the input tensor is bound to now."""
        return self._input_ptr

    def bind_input(self, ptr: int) -> bool:
        """Bind the input tensor to device memory at `ptr` (the runner's own buffer: 0); True if it changed."""
        ptr = ptr or int(self._device[self.input.name])
        if ptr == self._input_ptr:
            return False
        if not self.context.set_tensor_address(self.input.name, ptr):
            raise EdgeError("{}: TensorRT refused the input buffer".format(self.engine_path), exit_code=EXIT_FAIL)
        self._input_ptr = ptr
        return True

    def copy_in(self, tensor: Any) -> None:
        """Queue a host->device copy of a NumPy tensor into the runner's own input buffer, and bind that."""
        array = np.asarray(tensor)
        if array.shape != self.input.shape:
            raise ValueError("expected input {} {}, got {}".format(self.input.shape, self.input.dtype, array.shape))
        self.bind_input(0)
        np.copyto(self._host[0], array, casting="same_kind")
        self.session.drv.memcpy_htod_async(self._input_ptr, self._host[0], self.session.stream)

    def enqueue(self) -> None:
        """Queue inference and the output copy into pinned host memory on the session's stream."""
        if not self.context.execute_async_v3(self.session.stream.handle):
            raise EdgeError("{}: TensorRT failed to enqueue inference".format(self.engine_path), exit_code=EXIT_FAIL)
        self.session.drv.memcpy_dtoh_async(self._host[1], self._device[self.output.name], self.session.stream)

    def result(self) -> np.ndarray:
        """The output as float32 (a copy), once the stream has passed `enqueue`."""
        return np.asarray(self._host[1]).astype(np.float32)

    def infer(self, tensor: Any) -> np.ndarray:
        with self.session:
            self.copy_in(tensor)
            self.enqueue()
            self.session.stream.synchronize()
            return self.result()

    def close(self) -> None:
        """Free buffers and TensorRT objects, and release the session if it is the runner's own; safe to call
        twice."""
        if not (self._device or self._objects or self._own_session):
            return
        with self.session:
            self.session.stream.synchronize()
            for alloc in self._device.values():
                alloc.free()
            for host in self._host:
                allocation: Any = host.base  # pycuda HostAllocation
                if allocation is not None:
                    allocation.free()
            self._device.clear()
            self._host = []
            while self._objects:
                self._objects.pop()
        self._input_ptr = 0
        if self._own_session:
            self._own_session = False
            self.session.release()


def verify_engine(engine_path: str) -> None:
    """Deserialise and run one inference on zeros; non-finite output is a failure."""
    with EngineRunner(engine_path) as engine:
        out = engine.infer(np.zeros(engine.input.shape, np.float32))
    if not np.all(np.isfinite(out)):
        raise EdgeError("{}: verification failed: non-finite output".format(engine_path), exit_code=EXIT_FAIL)
