"""TensorRT on the GPU: deserialise a checked engine, bind tensors by name, run execute_async_v3.

    with TensorRTBackend("engines/model.engine") as backend:
        pre = CudaPreprocessor(cfg.preprocess, backend)   # writes straight into the input binding
        logits = backend.infer(pre(frame))                # or backend.infer(numpy_tensor)

Per frame: (input copy,) enqueue, output copied asynchronously into pinned host memory, one stream
synchronisation. CUDA events time the device work (`last_preprocess_ms`, `last_infer_ms`); the
pipeline keeps its monotonic clock for the whole frame. With `cuda_graph`, preprocess + inference
are captured into one CUDA graph, kept only if replaying it is measurably faster.
"""

import ctypes
import os
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ..backends.base import Backend
from ..errors import EdgeError, require
from .cuda_preprocess import CudaPreprocessor, CudaSession, DeviceTensor

if TYPE_CHECKING:
    import tensorrt as trt

_GRAPH_TRIALS = 20  # launches timed each way before deciding on a CUDA graph
_GRAPH_MIN_GAIN = 0.03  # the graph must save at least this fraction of device time


class _Tensor(NamedTuple):
    name: str
    is_input: bool
    shape: Tuple[int, ...]
    dtype: np.dtype


def check_engine_manifest(engine_path: str) -> Dict[str, Any]:
    """The engine's manifest. edge.artifacts (imported lazily) raises a one-line EdgeError for an engine
    built for another TensorRT, GPU or L4T; its check_engine_manifest is used when it has one."""
    from .. import artifacts

    check = getattr(artifacts, "check_engine_manifest", None)
    if check is not None:
        check(engine_path)
    else:
        artifacts.check_manifest(engine_path, artifacts.system_expectations("tensorrt-engine"))
    return artifacts.read_manifest(engine_path)


def _np_dtype(dtype: "trt.DataType") -> np.dtype:
    import tensorrt as trt

    table = {trt.DataType.FLOAT: np.float32, trt.DataType.HALF: np.float16, trt.DataType.INT8: np.int8,
             trt.DataType.INT32: np.int32, trt.DataType.BOOL: np.bool_}
    if dtype not in table:
        raise EdgeError("unsupported TensorRT I/O data type {}".format(dtype))
    return np.dtype(table[dtype])


def _io_tensors(engine: "trt.ICudaEngine") -> List[_Tensor]:
    """Inputs and outputs in binding order: the named API (TensorRT >= 8.5), else the binding-index API."""
    import tensorrt as trt

    if hasattr(engine, "num_io_tensors"):
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        dims = [engine.get_tensor_shape(n) for n in names]
        return [_Tensor(n, engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT,
                        tuple(d[i] for i in range(len(d))), _np_dtype(engine.get_tensor_dtype(n)))
                for n, d in zip(names, dims)]
    legacy: Any = engine  # TensorRT 8.4 (JetPack 5.0): not in the 10.x stubs
    return [_Tensor(legacy.get_binding_name(i), bool(legacy.binding_is_input(i)),
                    tuple(legacy.get_binding_shape(i)), _np_dtype(legacy.get_binding_dtype(i)))
            for i in range(legacy.num_bindings)]


class _GraphApi:
    """Stream capture through the CUDA driver (pycuda has no graph API). Symbols exist from CUDA 11.4."""

    CAPTURE_THREAD_LOCAL = 1

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        vp = ctypes.c_void_p
        for name, args in (("cuStreamBeginCapture_v2", [vp, ctypes.c_int]),
                           ("cuStreamEndCapture", [vp, ctypes.POINTER(vp)]),
                           ("cuGraphInstantiateWithFlags", [ctypes.POINTER(vp), vp, ctypes.c_ulonglong]),
                           ("cuGraphLaunch", [vp, vp]), ("cuGraphExecDestroy", [vp]), ("cuGraphDestroy", [vp])):
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int

    def _check(self, name: str, status: int) -> None:
        if status != 0:
            raise EdgeError("{} failed with CUDA error {}".format(name, status))

    def capture(self, stream: int, enqueue: Any) -> int:
        """Instantiated graph of what `enqueue()` queues on `stream`."""
        graph, graph_exec = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("cuStreamBeginCapture", self.lib.cuStreamBeginCapture_v2(stream, self.CAPTURE_THREAD_LOCAL))
        try:
            enqueue()
        except BaseException:
            if self.lib.cuStreamEndCapture(stream, ctypes.byref(graph)) == 0 and graph.value:
                self.lib.cuGraphDestroy(graph)
            raise
        self._check("cuStreamEndCapture", self.lib.cuStreamEndCapture(stream, ctypes.byref(graph)))
        try:
            self._check("cuGraphInstantiate", self.lib.cuGraphInstantiateWithFlags(ctypes.byref(graph_exec), graph, 0))
        finally:
            self.lib.cuGraphDestroy(graph)
        return int(graph_exec.value or 0)

    def launch(self, graph_exec: int, stream: int) -> None:
        self._check("cuGraphLaunch", self.lib.cuGraphLaunch(graph_exec, stream))

    def destroy(self, graph_exec: int) -> None:
        self.lib.cuGraphExecDestroy(graph_exec)


class TensorRTBackend(Backend):
    name = "tensorrt"

    def __init__(self, engine_path: str, cuda_graph: bool = False) -> None:
        self.engine_path = engine_path
        self.cuda_graph = cuda_graph
        self.session: Optional[CudaSession] = None
        self.preprocessor: Optional[CudaPreprocessor] = None
        self.last_preprocess_ms: Optional[float] = None  # device time of the paired kernel (None inside a graph)
        self.last_infer_ms: Optional[float] = None  # device time of enqueue + output copy (whole graph if on)
        self.graph_status = "off (backend.cuda_graph: false)" if not cuda_graph else "not tried yet"
        self._manifest: Dict[str, Any] = {}
        self._logger: Optional["trt.Logger"] = None
        self._runtime: Optional["trt.Runtime"] = None
        self._engine: Optional["trt.ICudaEngine"] = None
        self._context: Optional["trt.IExecutionContext"] = None
        self._input: Optional[_Tensor] = None
        self._output: Optional[_Tensor] = None
        self._device: Dict[str, Any] = {}  # tensor name -> pycuda DeviceAllocation
        self._in_host: Optional[np.ndarray] = None
        self._out_host: Optional[np.ndarray] = None
        self._bindings: List[int] = []  # execute_async_v2 only
        self._events: Tuple[Any, Any] = (None, None)
        self._graph_api: Optional[_GraphApi] = None
        self._graph = 0
        self._graph_key: Optional[Tuple[int, int, int]] = None

    def attach_preprocessor(self, pre: CudaPreprocessor) -> None:
        """Pair with the CudaPreprocessor that feeds this backend: same context and stream, and it writes
        into the engine's input binding. Closing the backend closes it too."""
        self.preprocessor = pre
        if self._input is not None:
            pre.bind_output(int(self._device[self._input.name]), self._input.dtype)

    def load(self) -> None:
        if getattr(require("tensorrt"), "__file__", None) is None:
            raise EdgeError("tensorrt here is only type stubs, not TensorRT: apt install python3-libnvinfer")
        require("pycuda.driver")
        if not os.path.isfile(self.engine_path):
            raise EdgeError("{}: engine file not found (build it on this device with: edge build)".format(
                self.engine_path))
        self._manifest = check_engine_manifest(self.engine_path)
        pre = self.preprocessor
        self.session = pre.session.acquire() if pre is not None else CudaSession()
        try:
            self._load()
        except BaseException:
            self.close()
            raise
        if pre is not None:
            self.attach_preprocessor(pre)

    def _load(self) -> None:
        import tensorrt as trt

        session = self.session
        assert session is not None
        with session:
            self._logger = trt.Logger(trt.Logger.WARNING)  # must outlive the runtime
            self._runtime = trt.Runtime(self._logger)
            with open(self.engine_path, "rb") as fh:
                engine: Optional[trt.ICudaEngine] = self._runtime.deserialize_cuda_engine(fh.read())
            if engine is None:
                raise EdgeError("{}: TensorRT {} cannot deserialise it (built for another TensorRT version or GPU?"
                                " rebuild it on this device)".format(self.engine_path, trt.__version__))
            self._engine = engine
            self._context = engine.create_execution_context()
            tensors = _io_tensors(engine)
            inputs = [t for t in tensors if t.is_input]
            outputs = [t for t in tensors if not t.is_input]
            if len(inputs) != 1 or not outputs:
                raise EdgeError("{}: expected one input and at least one output, got {} and {}".format(
                    self.engine_path, len(inputs), len(outputs)))
            self._input, self._output = inputs[0], outputs[0]
            if any(d < 0 for t in tensors for d in t.shape):
                raise EdgeError("{}: dynamic shapes are not supported; build the engine for a fixed 1x3xHxW "
                                "input".format(self.engine_path))
            drv = session.drv
            for t in tensors:
                self._device[t.name] = drv.mem_alloc(max(1, int(np.prod(t.shape)) * t.dtype.itemsize))
            self._in_host = drv.pagelocked_empty(self._input.shape, self._input.dtype)
            self._out_host = drv.pagelocked_empty(self._output.shape, self._output.dtype)
            if hasattr(self._context, "execute_async_v3"):
                for t in tensors:
                    self._context.set_tensor_address(t.name, int(self._device[t.name]))
            else:
                self._bindings = [int(self._device[t.name]) for t in tensors]
            self._events = (drv.Event(), drv.Event())

    @property
    def input_shape(self) -> Tuple[int, ...]:
        assert self._input is not None, "load() first"
        return self._input.shape

    def _enqueue(self) -> None:
        """Queue inference and the output copy on the session stream (context pushed)."""
        assert self.session is not None and self._context is not None and self._output is not None
        stream = self.session.stream
        if self._bindings:
            legacy: Any = self._context  # TensorRT < 8.5 has no execute_async_v3
            ok = legacy.execute_async_v2(bindings=self._bindings, stream_handle=stream.handle)
        else:
            ok = self._context.execute_async_v3(stream.handle)
        if not ok:
            raise EdgeError("{}: TensorRT failed to enqueue inference".format(self.engine_path))
        self.session.drv.memcpy_dtoh_async(self._out_host, self._device[self._output.name], stream)

    def infer(self, tensor: Any) -> np.ndarray:
        assert self.session is not None and self._input is not None and self._out_host is not None, "load() first"
        session, inp = self.session, self._input
        in_ptr = int(self._device[inp.name])
        paired = isinstance(tensor, DeviceTensor) and tensor.ptr == in_ptr
        start, end = self._events
        with session:
            stream = session.stream
            if paired and tensor.pending and tensor.frame_key == self._graph_key:
                start.record(stream)
                assert self._graph_api is not None
                self._graph_api.launch(self._graph, stream.handle)
            else:
                if paired and tensor.pending:  # frame size changed under a graph: drop it, run directly
                    self._drop_graph()
                    tensor.source.enqueue(timed=True)
                elif isinstance(tensor, DeviceTensor) and not paired:
                    if tensor.shape != inp.shape or tensor.dtype != inp.dtype:
                        raise ValueError("device tensor {} {} does not match the engine input {} {}".format(
                            tensor.shape, tensor.dtype, inp.shape, inp.dtype))
                    session.drv.memcpy_dtod_async(in_ptr, tensor.ptr, tensor.nbytes, stream)
                elif not paired:
                    array, staging = np.asarray(tensor), self._in_host
                    assert staging is not None
                    if array.shape != inp.shape:
                        raise ValueError("expected input {} {}, got {}".format(inp.shape, inp.dtype, array.shape))
                    np.copyto(staging, array, casting="same_kind")
                    session.drv.memcpy_htod_async(in_ptr, staging, stream)
                start.record(stream)
                self._enqueue()
            end.record(stream)
            stream.synchronize()
            self.last_infer_ms = float(start.time_till(end))
            self.last_preprocess_ms = tensor.source.device_ms() if paired else None
            logits = self._out_host.astype(np.float32)
            if paired and self.cuda_graph and tensor.frame_key != self._graph_key and not tensor.pending:
                self._try_graph(tensor)
        return logits

    def _time_launches(self, launch: Any) -> float:
        start, end = self._events
        assert self.session is not None
        start.record(self.session.stream)
        for _ in range(_GRAPH_TRIALS):
            launch()
        end.record(self.session.stream)
        end.synchronize()
        return float(start.time_till(end)) / _GRAPH_TRIALS

    def _try_graph(self, tensor: DeviceTensor) -> None:
        """Capture preprocess + inference for this frame size; keep the graph only if it is faster."""
        assert self.session is not None
        pre, handle = tensor.source, self.session.stream.handle
        self._drop_graph()
        self._graph_key = tensor.frame_key  # tried for this frame size, whatever the outcome

        def direct() -> None:
            pre.enqueue(timed=False)
            self._enqueue()

        try:
            self._graph_api = self._graph_api or _GraphApi()
            direct_ms = self._time_launches(direct)
            self._graph = self._graph_api.capture(handle, direct)
            api = self._graph_api
            graph_ms = self._time_launches(lambda: api.launch(self._graph, handle))
        except Exception as exc:  # no libcuda or symbol, capture refused by TensorRT or the driver: run direct
            self._drop_graph()
            self.graph_status = "off (capture failed: {})".format(str(exc).strip().splitlines()[0] if str(exc).strip()
                                                                 else type(exc).__name__)
            return
        if graph_ms < direct_ms * (1.0 - _GRAPH_MIN_GAIN):
            pre.deferred = True
            self.graph_status = "on ({:.3f} ms vs {:.3f} ms direct)".format(graph_ms, direct_ms)
        else:
            self._drop_graph()
            self.graph_status = "off (no gain: {:.3f} ms vs {:.3f} ms direct)".format(graph_ms, direct_ms)

    def _drop_graph(self) -> None:
        if self._graph and self._graph_api is not None:
            self._graph_api.destroy(self._graph)
        self._graph = 0
        if self.preprocessor is not None:
            self.preprocessor.deferred = False

    def describe(self) -> Dict[str, Any]:
        import tensorrt as trt

        return {
            "backend": self.name,
            "model": self.engine_path,
            "precision": self._manifest.get("precision", "unknown"),
            "tensorrt": trt.__version__,
            "gpu": self.session.gpu_name() if self.session is not None else "unknown",
            "cuda_graph": self.graph_status,
        }

    def close(self) -> None:
        session = self.session
        if session is None:
            return
        with session:
            session.stream.synchronize()
            self._drop_graph()
            for alloc in self._device.values():
                alloc.free()
            for host in (self._in_host, self._out_host):
                allocation: Any = None if host is None else host.base  # pycuda HostAllocation
                if allocation is not None:
                    allocation.free()
            self._device.clear()
            self._in_host = self._out_host = None
            self._events = (None, None)
            self._context = self._engine = self._runtime = None
        self._input = self._output = None
        self._bindings = []
        self._graph_key = None
        self.session = None
        if self.preprocessor is not None:
            self.preprocessor.close()
        session.release()
