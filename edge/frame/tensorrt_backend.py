"""TensorRT on the GPU: the runtime backend over edge.frame.tensorrt_runner.EngineRunner.

    with TensorRTBackend("engines/model.engine") as backend:
        pre = CudaPreprocessor(cfg.preprocess, backend)   # writes straight into the input binding
        logits = backend.infer(pre(frame))                # or backend.infer(numpy_tensor)

Load refuses an engine whose manifest says it was built for another board model, SM count, compute capability,
TensorRT or CUDA (edge.board); a changed L4T alone is kept, with `engine_warning` in describe().
Per frame: (input copy,) enqueue, output copied asynchronously into pinned host memory, one stream
synchronisation. CUDA events time the device work (`last_preprocess_ms`, `last_infer_ms`); the pipeline
keeps its monotonic clock for the whole frame. With `cuda_graph`, inference + output copy (the runner's
enqueue, whose buffers never move) are captured into one CUDA graph after the first frame, kept only if
replaying it is measurably faster. The preprocessor is not part of the graph.
"""

import ctypes
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edge.board import check_engine_manifest
from edge.errors import EdgeError
from edge.frame.backend import Backend
from edge.frame.cuda_preprocess import CudaPreprocessor, CudaSession, DeviceTensor
from edge.frame.tensorrt_runner import EngineRunner, require_tensorrt

_GRAPH_TRIALS = 20  # launches timed each way before deciding on a CUDA graph
_GRAPH_MIN_GAIN = 0.03  # the graph must save at least this fraction of device time


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
        self.runner = EngineRunner(engine_path)
        self.preprocessor: Optional[CudaPreprocessor] = None
        self.last_preprocess_ms: Optional[float] = None  # device time of the paired kernel
        self.last_infer_ms: Optional[float] = None  # device time of enqueue + output copy (the graph if on)
        self.graph_status = "off (backend.cuda_graph: false)" if not cuda_graph else "not tried yet"
        self._manifest: Dict[str, Any] = {}
        self._warnings: List[str] = []
        self._events: Tuple[Any, Any] = (None, None)
        self._graph_api: Optional[_GraphApi] = None
        self._graph = 0

    @property
    def session(self) -> Optional[CudaSession]:
        return self.runner.session

    def attach_preprocessor(self, pre: CudaPreprocessor) -> None:
        """Pair with the CudaPreprocessor that feeds this backend: same context and stream, and it writes
        into the engine's input binding. Closing the backend closes it too."""
        self.preprocessor = pre
        if self.runner.input is not None:
            pre.bind_output(self.runner.input_ptr(), self.runner.input.dtype)

    def load(self) -> None:
        require_tensorrt()
        self._warnings = []
        self._manifest = check_engine_manifest(self.engine_path, warn=self._warnings.append)
        pre = self.preprocessor
        self.runner.session = pre.session if pre is not None else None
        try:
            self.runner.load()
            session = self.runner.session
            assert session is not None
            with session:
                self._events = (session.drv.Event(), session.drv.Event())
        except BaseException:
            self.runner.close()
            if pre is not None:
                pre.close()
            raise
        if pre is not None:
            self.attach_preprocessor(pre)

    @property
    def input_shape(self) -> Tuple[int, ...]:
        assert self.runner.input is not None, "load() first"
        return self.runner.input.shape

    def infer(self, tensor: Any) -> np.ndarray:
        runner, session, inp = self.runner, self.runner.session, self.runner.input
        assert session is not None and inp is not None, "load() first"
        paired = isinstance(tensor, DeviceTensor) and tensor.ptr == runner.input_ptr()
        start, end = self._events
        with session:
            stream = session.stream
            if isinstance(tensor, DeviceTensor) and not paired:
                if tensor.shape != inp.shape or tensor.dtype != inp.dtype:
                    raise ValueError("device tensor {} {} does not match the engine input {} {}".format(
                        tensor.shape, tensor.dtype, inp.shape, inp.dtype))
                session.drv.memcpy_dtod_async(runner.input_ptr(), tensor.ptr, tensor.nbytes, stream)
            elif not paired:
                runner.copy_in(tensor)
            start.record(stream)
            if self._graph and self._graph_api is not None:
                self._graph_api.launch(self._graph, stream.handle)
            else:
                runner.enqueue()
            end.record(stream)
            stream.synchronize()
            self.last_infer_ms = float(start.time_till(end))
            self.last_preprocess_ms = tensor.source.device_ms() if paired else None
            logits = runner.result()
            if self.cuda_graph and self.graph_status == "not tried yet":
                self._try_graph()
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

    def _try_graph(self) -> None:
        """Capture the runner's enqueue (after one direct run, as TensorRT requires); keep it only if faster."""
        assert self.session is not None
        handle, enqueue = self.session.stream.handle, self.runner.enqueue
        try:
            api = self._graph_api = _GraphApi()
            direct_ms = self._time_launches(enqueue)
            self._graph = api.capture(handle, enqueue)
            graph_ms = self._time_launches(lambda: api.launch(self._graph, handle))
        except Exception as exc:  # no libcuda or symbol, capture refused by TensorRT or the driver: run direct
            self._drop_graph()
            self.graph_status = "off (capture failed: {})".format(str(exc).strip().splitlines()[0] if str(exc).strip()
                                                                 else type(exc).__name__)
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
            "model": self.engine_path,
            "precision": self._manifest.get("precision", "unknown"),
            "tensorrt": trt.__version__,
            "gpu": self.session.gpu_name() if self.session is not None else "unknown",
            "cuda_graph": self.graph_status,
            **({"engine_warning": "; ".join(self._warnings)} if self._warnings else {}),
        }

    def close(self) -> None:
        session = self.runner.session
        if session is None:
            return
        with session:
            self._drop_graph()
            self._events = (None, None)
        self.runner.close()
        if self.preprocessor is not None:
            self.preprocessor.close()
