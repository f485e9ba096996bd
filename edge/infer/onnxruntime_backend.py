"""ONNX Runtime on the CPU: the backend that runs everywhere.

An INT8 Q/DQ model runs on ONNX Runtime's fused int8 kernels only where they compute what TensorRT computes;
on a CPU whose kernels saturate (x86 without VNNI: edge.infer.qdq_emulation) it runs emulated, as exact
fake-quantised float operators — the FP32 model's cost plus the rounding — and the start line says so.
"""

from typing import Any, Dict, Optional, Tuple

import numpy as np

from edge.errors import EdgeError, first_line, require
from edge.infer.backend import Backend, LoadedBackend
from edge.infer.postprocess import check_first_output
from edge.infer.qdq_emulation import emulated_model, is_qdq
from edge.store.artifact import ModelSet, read_set

_FLOAT = 1  # onnx.TensorProto.FLOAT
_EXTERNAL = 1  # onnx.TensorProto.EXTERNAL
_SHAPE_ONLY = ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze")  # between a Softmax and the output
# The build's sessions (calibrator, fidelity, gate) run batch-1 inference beside other work (a rebuild beside the
# running service): one intra-op thread, not spinning. The gate of MobileNetV3-Large on 2 cores: 1.2x less CPU,
# 10 % more wall time (benchmarks/offline_spinning.py --threads; docs/build.md).
OFFLINE_THREADS = 1
DYNAMIC_MAX_BATCH = 64  # a model with a dynamic batch axis (edge export --batch dynamic) takes up to this many rows


# x86 without VNNI: ONNX Runtime's u8s8 int8 kernels saturate in 16-bit pair sums; this makes them multiply u8u8
# (slower, exact). No effect on VNNI or ARM, nor on a model without Q/DQ.
X64_QUANT_PRECISION = "session.x64quantprecision"


def session_options(ort: Any, threads: int, spinning: bool) -> Any:
    """Every inference session of ours: all graph optimisations, `threads` intra-op threads (0: ONNX Runtime's
    default, one per core), idle threads spinning or not, int8 kernels that do not saturate (X64_QUANT_PRECISION),
    ONNX Runtime's warnings quiet."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.add_session_config_entry(X64_QUANT_PRECISION, "1")
    options.log_severity_level = 3
    return options


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, model_path: str, intra_op_threads: int = 0, *, spinning: bool = True,
                 emulate_int8: bool = True):
        self.model_path = model_path
        self.intra_op_threads = intra_op_threads  # 0: ORT's default (all cores), measured fastest on 2 cores
        self.spinning = spinning  # idle intra-op threads busy-wait for the next run (ORT's default)
        # Q/DQ models: True serves TensorRT's arithmetic emulated in float, exactly what the accuracy gate judged
        # on any CPU, and faster than the fused int8 kernels on AVX2 and VNNI (benchmarks/int8_served.py); False:
        # ONNX Runtime's fused int8 kernels (the gate's this_cpu_int8_kernels figure, the benchmark)
        self.emulate_int8 = emulate_int8

    def _load(self, model: Optional[ModelSet]) -> "LoadedOnnxRuntime":
        ort, onnx = require("onnxruntime"), require("onnx")
        model = model or read_set(self.model_path)
        model_bytes = model.data  # read once: the session, the checks and the sha256 see the same bytes
        try:
            graph_model = onnx.load_model_from_string(model_bytes)
        except Exception as exc:  # protobuf's DecodeError
            raise EdgeError("{}: not a loadable ONNX model: {}".format(self.model_path, first_line(exc))) from None
        self._check_model(graph_model)
        int8 = "none"
        if is_qdq(graph_model):
            int8 = "emulated" if self.emulate_int8 else "onnxruntime-kernels"
            if self.emulate_int8:
                model_bytes = emulated_model(graph_model).SerializeToString()
        try:
            session = ort.InferenceSession(model_bytes, session_options(ort, self.intra_op_threads, self.spinning),
                                           providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own exception types for bad files
            raise EdgeError("{}: not a loadable ONNX model: {}".format(self.model_path, first_line(exc))) from None
        return LoadedOnnxRuntime(self, session, sha256=model.sha256, probabilities=ends_in_softmax(graph_model.graph),
                                 int8=int8)

    def _check_model(self, model: Any) -> None:
        """Refused at load, naming the file: what would otherwise fail every frame or read other bytes."""
        graph = model.graph
        if any(i.data_location == _EXTERNAL for i in graph.initializer):
            raise EdgeError("{}: weights in external data files are not supported (they would be read relative to "
                            "the working folder); re-export as one file".format(self.model_path))
        initializers = {i.name for i in graph.initializer}
        inputs = [i for i in graph.input if i.name not in initializers]
        if len(inputs) != 1 or not graph.output:
            raise EdgeError("{}: expected one input and at least one output".format(self.model_path))
        tensor = inputs[0].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        batch_ok = not dims or dims[0] in (None, 1)
        if tensor.elem_type != _FLOAT or len(dims) != 4 or not batch_ok or dims[1] not in (None, 3):
            elem = require("onnx").TensorProto.DataType.Name(tensor.elem_type).lower()
            raise EdgeError("{}: input '{}' is {} {}; the pipeline gives float32 [1, 3, H, W]".format(
                self.model_path, inputs[0].name, elem, [d if d is not None else "?" for d in dims]))


class LoadedOnnxRuntime(LoadedBackend):
    """An ONNX Runtime session that ran once on a blank input (refused at load, naming the file, if it cannot)."""

    name = OnnxRuntimeBackend.name

    def __init__(self, runner: OnnxRuntimeBackend, session: Any, *, sha256: str, probabilities: bool,
                 int8: str) -> None:
        self.runner, self.session = runner, session
        self.sha256, self.probabilities, self._int8 = sha256, probabilities, int8
        inputs, outputs = session.get_inputs(), session.get_outputs()
        self._input_name = inputs[0].name
        self._output_names = [outputs[0].name]
        self.max_batch = 1 if isinstance(inputs[0].shape[0], int) else DYNAMIC_MAX_BATCH
        self._input_shape = tuple(d if isinstance(d, int) else 1 for d in inputs[0].shape)
        try:
            blank = np.asarray(self.infer(np.zeros(self._input_shape, np.float32)))
        except Exception as exc:  # a model that cannot run here fails every frame: refuse it now
            raise EdgeError("{}: does not run on a blank input: {}".format(runner.model_path, first_line(exc))) \
                from None
        check_first_output(blank, runner.model_path)
        self._output_shape = tuple(blank.shape)

    @property
    def input_shape(self) -> Tuple[int, ...]:
        return self._input_shape

    @property
    def output_shape(self) -> Tuple[int, ...]:
        return self._output_shape

    def infer(self, tensor: Any) -> np.ndarray:
        return self.session.run(self._output_names, {self._input_name: np.asarray(tensor)})[0]  # a DeviceTensor too

    def describe(self) -> Dict[str, Any]:
        runner = self.runner
        described: Dict[str, Any] = {
            "backend": self.name,
            "model": runner.model_path,
            "precision": "fp32" if self._int8 == "none" else "int8-qdq",
            "threads": runner.intra_op_threads or "auto",
            "spinning": runner.spinning,
        }
        if self._int8 != "none":
            described["int8"] = self._int8
        return described

    def close(self) -> None:
        self.session = None  # ONNX Runtime frees it with its last reference


def ends_in_softmax(graph: Any) -> bool:
    """True when the first output is a Softmax's (through reshapes): the model already gives probabilities."""
    producers = {out: node for node in graph.node for out in node.output}
    node = producers.get(graph.output[0].name) if graph.output else None
    while node is not None and node.op_type in _SHAPE_ONLY and node.input:
        node = producers.get(node.input[0])
    return node is not None and node.op_type == "Softmax"
