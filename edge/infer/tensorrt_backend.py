"""TensorRT on the GPU: the runtime backend over edge.infer.tensorrt_runner.EngineRunner.

    session = CudaSession()                                  # its owner's: edge.infer.stages releases it last
    backend = TensorRTBackend("engines/model.engine", session)
    pre = CudaPreprocessor(cfg.preprocess, session)          # the same session; neither releases it
    with backend:
        logits = backend.infer(pre(frame))                   # binds the device tensor as its input, in place
        logits = backend.infer(numpy_tensor)                 # or copies an array into its own input buffer

Load refuses an engine whose model info says it was built for another board model, SM count, compute capability,
TensorRT or CUDA (edge.store.artifact.check_engine); a changed L4T alone is kept, with `engine_warning` in describe().
The engine's bytes are the ones edge.store.artifact.read_set read and checked (sha256, labels), handed on unread again;
a first output that is not float, or is not finite on a blank input, is refused at load.
Per frame: (input copy,) enqueue, output copied asynchronously into pinned host memory, one stream
synchronisation. CUDA events time the device work (`device_ms()`: `infer_gpu`, and `preprocess_gpu` for a device
tensor); the pipeline keeps its monotonic clock for the whole frame. With `cuda_graph`, inference + output copy
(the runner's enqueue) are captured into one CUDA graph after the first frame, kept only if replaying it is
measurably faster; a new input binding drops it and tries again. The preprocessor is not part of the graph.
An engine with a profile per batch size serves several cameras' frames as one batch (put_row / infer_rows):
batch 1 as above, larger sizes on edge.infer.tensorrt_batch's contexts (a CUDA graph per size with cuda_graph).
"""

import ctypes
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edge.errors import EXIT_FAIL, EdgeError, first_line
from edge.infer.backend import Backend, LoadedBackend
from edge.infer.cuda_preprocess import DeviceTensor
from edge.infer.cuda_session import CudaSession, driver_library
from edge.infer.postprocess import check_first_output
from edge.infer.tensorrt_batch import BatchRunner, batch_runner
from edge.infer.tensorrt_runner import EngineRunner, LoadedEngine, require_tensorrt
from edge.store.artifact import ModelSet, check_engine, lookup, read_set

_GRAPH_TRIALS = 20  # launches timed each way before deciding on a CUDA graph
_GRAPH_MIN_GAIN = 0.03  # the graph must save at least this fraction of device time


class _GraphApi:
    """Stream capture through the CUDA driver (pycuda has no graph API). Symbols exist from CUDA 11.4."""

    CAPTURE_THREAD_LOCAL = 1

    def __init__(self) -> None:
        self.lib = driver_library()
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

    def __init__(self, engine_path: str, session: CudaSession, cuda_graph: bool = False, *,
                 config_path: Optional[str] = None) -> None:
        self.engine_path = engine_path
        self.config_path = config_path  # named in a refusal's remedy
        self.session = session  # its owner's (edge.infer.stages), released after close()
        self.cuda_graph = cuda_graph

    def _load(self, model: Optional[ModelSet]) -> "LoadedTensorRT":
        """Any refusal (no TensorRT, a model info for another board, an engine that does not deserialise) frees
        what was loaded at once; the session's owner still releases it (edge.infer.stages does on every failure
        path, so a refused SIGHUP reload leaves no CUDA context behind)."""
        require_tensorrt()
        warnings: List[str] = []
        model = model or read_set(self.engine_path, required_info=True)
        info = check_engine(model, warn=warnings.append, config_path=self.config_path)
        engine = EngineRunner(self.engine_path, self.session).load(model.data)
        try:
            return LoadedTensorRT(self, engine, model=model, info=info, warnings=warnings)
        except BaseException:
            engine.close()
            raise


class LoadedTensorRT(LoadedBackend):
    """A loaded engine that ran once on a blank input, its CUDA events, and the batch contexts of an engine with a
    profile per size."""

    name = TensorRTBackend.name

    def __init__(self, backend: TensorRTBackend, engine: LoadedEngine, *, model: ModelSet, info: Dict[str, Any],
                 warnings: List[str]) -> None:
        self.backend, self.engine, self.session = backend, engine, backend.session
        self.sha256, self._info, self._warnings = model.sha256, info, warnings
        self.probabilities = lookup(model.info, "output.softmax") is True
        self.cuda_graph = backend.cuda_graph
        self.graph_status = "off (backend.cuda_graph: false)" if not self.cuda_graph else "not tried yet"
        self._device_ms: Dict[str, float] = {}
        self._graph_api: Optional[_GraphApi] = None
        self._graph = 0
        self._row0: Any = None
        inp = engine.input
        if inp.dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise EdgeError("{}: input '{}' is {} {}; jetson-edge feeds float32 or float16 1x3xHxW".format(
                backend.engine_path, inp.name, inp.dtype, "x".join(str(d) for d in inp.shape)))
        check_first_output(engine.infer(np.zeros(inp.shape, np.float32)), backend.engine_path, engine.output.dtype)
        with self.session:
            self._events: Tuple[Any, Any] = (self.session.event(), self.session.event())
            # sizes above 1 of an engine with a profile per size
            self.batch: Optional[BatchRunner] = batch_runner(engine.engine, self.session, inp=inp, out=engine.output,
                                                             graphs=self._batch_graphs())

    def _batch_graphs(self) -> Any:
        if not self.cuda_graph:
            return None
        try:
            return _GraphApi()
        except Exception:  # no libcuda or symbol: batches run direct
            return None

    @property
    def max_batch(self) -> int:  # type: ignore[override]
        return self.batch.sizes[-1] if self.batch is not None else 1

    def put_row(self, row: int, tensor: Any) -> None:
        if row == 0:
            self._row0 = tensor  # a batch of one runs as infer() does (profile 0, in place)
        if self.batch is not None:
            with self.session:
                self.batch.put_row(row, tensor)

    def infer_rows(self, n: int) -> np.ndarray:
        if n == 1:
            return self.infer(self._row0)
        if self.batch is None:
            raise EdgeError("{}: a batch-1 engine takes one row, not {}".format(self.backend.engine_path, n),
                            exit_code=EXIT_FAIL)
        start, end = self._events
        with self.session:
            stream = self.session.stream
            start.record(stream)
            self.batch.enqueue(n)
            end.record(stream)
            stream.synchronize()
            self._device_ms = {"infer_gpu": float(start.time_till(end))}
            return self.batch.result(n)

    @property
    def input_shape(self) -> Tuple[int, ...]:
        return self.engine.input.shape

    @property
    def input_dtype(self) -> np.dtype:
        return self.engine.input.dtype

    @property
    def output_shape(self) -> Tuple[int, ...]:
        return self.engine.output.shape

    def device_ms(self) -> Dict[str, float]:
        return dict(self._device_ms)

    def _bind(self, tensor: Any) -> None:
        """A device tensor is bound as the input in place; an array is copied into the runner's own buffer."""
        engine, inp = self.engine, self.engine.input
        if isinstance(tensor, DeviceTensor):
            if tensor.shape != inp.shape or tensor.dtype != inp.dtype:
                raise ValueError("device tensor {} {} does not match the engine input {} {}".format(
                    tensor.shape, tensor.dtype, inp.shape, inp.dtype))
            rebound = engine.bind_input(tensor.ptr)
        else:
            rebound = engine.bind_input(0)
            engine.copy_in(tensor)
        if rebound and self._graph:  # the graph reads the old buffer: capture again
            self._drop_graph()
            self.graph_status = "not tried yet"

    def infer(self, tensor: Any) -> np.ndarray:
        engine, session = self.engine, self.session
        start, end = self._events
        with session:
            stream = session.stream
            self._bind(tensor)
            start.record(stream)
            if self._graph and self._graph_api is not None:
                self._graph_api.launch(self._graph, stream.handle)
            else:
                engine.enqueue()
            end.record(stream)
            stream.synchronize()
            self._device_ms = {"infer_gpu": float(start.time_till(end))}
            preprocess_ms = tensor.source.device_ms() if isinstance(tensor, DeviceTensor) else None
            if preprocess_ms is not None:
                self._device_ms["preprocess_gpu"] = preprocess_ms
            logits = engine.result()
            if self.cuda_graph and self.graph_status == "not tried yet":
                self._try_graph()
        return logits

    def _time_launches(self, launch: Any) -> float:
        start, end = self._events
        start.record(self.session.stream)
        for _ in range(_GRAPH_TRIALS):
            launch()
        end.record(self.session.stream)
        end.synchronize()
        return float(start.time_till(end)) / _GRAPH_TRIALS

    def _try_graph(self) -> None:
        """Capture the runner's enqueue (after one direct run, as TensorRT requires); keep it only if faster."""
        handle, enqueue = self.session.stream.handle, self.engine.enqueue
        try:
            api = self._graph_api = _GraphApi()
            direct_ms = self._time_launches(enqueue)
            self._graph = api.capture(handle, enqueue)
            graph_ms = self._time_launches(lambda: api.launch(self._graph, handle))
        except Exception as exc:  # no libcuda or symbol, capture refused by TensorRT or the driver: run direct
            self._drop_graph()
            self.graph_status = "off (capture failed: {})".format(first_line(exc))
            return
        if graph_ms < direct_ms * (1.0 - _GRAPH_MIN_GAIN):
            self.graph_status = "on ({:.3f} ms vs {:.3f} ms direct)".format(graph_ms, direct_ms)
        else:
            self._drop_graph()
            self.graph_status = "off (no gain: {:.3f} ms vs {:.3f} ms direct)".format(graph_ms, direct_ms)

    def _drop_graph(self) -> None:
        if self._graph and self._graph_api is not None:
            self._graph_api.destroy(self._graph)
        self._graph = 0

    def describe(self) -> Dict[str, Any]:
        import tensorrt as trt

        return {
            "backend": self.name,
            "model": self.backend.engine_path,
            "precision": self._info.get("precision", "unknown"),
            "tensorrt": trt.__version__,
            "gpu": self.session.gpu_name(),
            "cuda_graph": self.graph_status,
            "context_memory_mb": self._context_memory_mb(),
            **({"engine_warning": "; ".join(self._warnings)} if self._warnings else {}),
        }

    def _context_memory_mb(self) -> Optional[float]:
        """The device memory the engine's execution contexts hold (one per batch size): on a Jetson, shared RAM."""
        engine = self.engine.engine
        size = getattr(engine, "device_memory_size_v2", None) or getattr(engine, "device_memory_size", None)
        if size is None:  # TensorRT 8.5 through 10.x have one of the two; anything else: not reported
            return None
        contexts = 1 + (len(self.batch.contexts) if self.batch is not None else 0)
        return round(int(size) * contexts / 2 ** 20, 1)

    def close(self) -> None:
        """Free the CUDA graph, the batch contexts, the events and the engine; safe to call twice. The session stays
        its owner's."""
        if self._events[0] is None:  # closed already
            return
        with self.session:
            if self.batch is not None:
                self.batch.close()
                self.batch = None
            self._drop_graph()
            self._events = (None, None)
        self.engine.close()
