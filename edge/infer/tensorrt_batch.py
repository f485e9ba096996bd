"""Batches on a TensorRT engine with one optimisation profile per size (edge.model.tensorrt_engine): one execution
context per size, each bound to one shared input buffer (rows of the largest size) and one shared output buffer,
and, with backend.cuda_graph, one CUDA graph per size (fixed shapes and addresses: captured once, replayed).

Profile 0 (batch 1) is the EngineRunner's own context (TensorRT gives a profile to one context at a time); this
module runs the sizes above it. A batch of n runs on the smallest size >= n; the rows past n hold stale frames whose
results are not read. Rows arrive one at a time (`put_row`), copied on the session's stream before the
preprocessor writes its next frame: a device tensor device-to-device, an array through pinned host memory.
Needs the session's context pushed (`with session:`).
"""

from typing import TYPE_CHECKING, Any, Dict, List, Optional

import numpy as np

from edge.errors import EXIT_FAIL, EdgeError
from edge.infer.cuda_preprocess import DeviceTensor
from edge.infer.cuda_session import CudaSession
from edge.infer.tensorrt_runner import TensorSpec, shape_of

if TYPE_CHECKING:
    import tensorrt as trt


class BatchRunner:
    """Contexts for profiles 1.. of `engine`; `sizes[i]` is context i's batch."""

    def __init__(self, engine: "trt.ICudaEngine", session: CudaSession, *, inp: TensorSpec, out: TensorSpec,
                 graphs: Any = None) -> None:
        drv, stream = session.drv, session.stream
        self.session, self.graphs = session, graphs  # graphs: the backend's _GraphApi, or None (no CUDA graphs)
        self.sizes = [shape_of(engine.get_tensor_profile_shape(inp.name, p)[1])[0]
                      for p in range(1, engine.num_optimization_profiles)]
        largest = max(self.sizes)
        self.row_bytes = int(np.prod(inp.shape[1:])) * inp.dtype.itemsize
        self.input: Any = drv.mem_alloc(largest * self.row_bytes)
        self.output: Any = drv.mem_alloc(largest * int(np.prod(out.shape[1:])) * out.dtype.itemsize)
        self.host_in: np.ndarray = drv.pagelocked_empty((largest,) + tuple(inp.shape[1:]), inp.dtype)
        self.host_out: np.ndarray = drv.pagelocked_empty((largest,) + tuple(out.shape[1:]), out.dtype)
        self.contexts: List["trt.IExecutionContext"] = []
        self.graph_execs: Dict[int, int] = {}  # batch size -> instantiated CUDA graph
        for profile, size in enumerate(self.sizes, start=1):
            context = engine.create_execution_context()
            self.contexts.append(context)
            if not (context.set_optimization_profile_async(profile, stream.handle)
                    and context.set_input_shape(inp.name, (size,) + tuple(inp.shape[1:]))
                    and context.set_tensor_address(inp.name, int(self.input))
                    and context.set_tensor_address(out.name, int(self.output))):
                raise EdgeError("TensorRT refused profile {} (batch {})".format(profile, size), exit_code=EXIT_FAIL)

    def put_row(self, row: int, tensor: Any) -> None:
        """Queue the copy of one preprocessed (1, 3, H, W) tensor into row `row` of the next batch."""
        drv, stream = self.session.drv, self.session.stream
        dst = int(self.input) + row * self.row_bytes
        if isinstance(tensor, DeviceTensor):
            drv.memcpy_dtod_async(dst, tensor.ptr, self.row_bytes, stream)
        else:
            np.copyto(self.host_in[row], np.asarray(tensor)[0], casting="same_kind")
            drv.memcpy_htod_async(dst, self.host_in[row], stream)

    def size_for(self, n: int) -> int:
        """The index of the smallest size that holds `n` rows."""
        fits = [i for i, size in enumerate(self.sizes) if size >= n]
        if not fits:
            raise ValueError("a batch of {} is over the engine's largest profile ({})".format(n, self.sizes[-1]))
        return fits[0]

    def enqueue(self, n: int) -> None:
        """Queue the batch of `n` rows (its graph when captured) and the copy of its results to the host."""
        i = self.size_for(n)
        stream = self.session.stream
        if self.sizes[i] in self.graph_execs and self.graphs is not None:
            self.graphs.launch(self.graph_execs[self.sizes[i]], stream.handle)
            return
        self._enqueue(i)
        if self.graphs is not None:  # after one direct run, as TensorRT requires; kept for good (fixed addresses)
            stream.synchronize()
            try:
                self.graph_execs[self.sizes[i]] = self.graphs.capture(stream.handle, lambda: self._enqueue(i))
            except Exception:  # capture refused by this TensorRT or driver: this size runs direct
                self.graph_execs.pop(self.sizes[i], None)

    def _enqueue(self, i: int) -> None:
        stream = self.session.stream
        if not self.contexts[i].execute_async_v3(stream.handle):
            raise EdgeError("TensorRT failed to enqueue a batch of {}".format(self.sizes[i]), exit_code=EXIT_FAIL)
        self.session.drv.memcpy_dtoh_async(self.host_out[:self.sizes[i]], int(self.output), stream)

    def result(self, n: int) -> np.ndarray:
        """The first `n` rows' outputs as float32 (a copy), once the stream has passed `enqueue`."""
        return np.asarray(self.host_out[:n]).astype(np.float32)

    def close(self) -> None:
        """Graphs, contexts, then buffers; the session is its owner's."""
        for graph in self.graph_execs.values():
            if self.graphs is not None:
                self.graphs.destroy(graph)
        self.graph_execs.clear()
        self.contexts = []
        for allocation in (self.input, self.output):
            allocation.free()
        for host in (self.host_in, self.host_out):
            base: Any = host.base  # pycuda HostAllocation
            if base is not None:
                base.free()


def batch_runner(engine: "trt.ICudaEngine", session: CudaSession, *, inp: TensorSpec, out: TensorSpec,
                 graphs: Any) -> Optional[BatchRunner]:
    """A BatchRunner for an engine with more than one profile, else None (a batch-1 engine)."""
    if engine.num_optimization_profiles < 2:
        return None
    return BatchRunner(engine, session, inp=inp, out=out, graphs=graphs)
