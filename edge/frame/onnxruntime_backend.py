"""ONNX Runtime on the CPU: the backend that runs everywhere."""

import os
from typing import Any, Dict, Optional, Tuple

import numpy as np

from edge.errors import EdgeError, require
from edge.frame.backend import Backend


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, model_path: str, intra_op_threads: int = 0, spinning: bool = True):
        self.model_path = model_path
        self.intra_op_threads = intra_op_threads  # 0: ORT's default (all cores), measured fastest on 2 cores
        self.spinning = spinning  # idle intra-op threads busy-wait for the next run (ORT's default)
        self.session: Optional[Any] = None

    def load(self) -> None:
        ort = require("onnxruntime")
        if not os.path.isfile(self.model_path):
            raise EdgeError("{}: model file not found (create it with: edge export)".format(self.model_path))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = self.intra_op_threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.spinning else "0")
        options.log_severity_level = 3
        with open(self.model_path, "rb") as fh:
            model_bytes = fh.read()  # one read: the session and what describe() says come from the same bytes
        try:
            self.session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own exception types for bad files
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EdgeError("{}: not a loadable ONNX model: {}".format(self.model_path, first)) from None
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or len(outputs) < 1:
            raise EdgeError("{}: expected one input and at least one output".format(self.model_path))
        self._input_name = inputs[0].name
        self._output_names = [outputs[0].name]
        self._input_shape = tuple(d if isinstance(d, int) else 1 for d in inputs[0].shape)
        graph = require("onnx").load_model_from_string(model_bytes).graph
        self._precision = "int8-qdq" if any(n.op_type == "QuantizeLinear" for n in graph.node) else "fp32"

    @property
    def input_shape(self) -> Tuple[int, ...]:
        return self._input_shape

    def infer(self, tensor: Any) -> np.ndarray:
        assert self.session is not None, "load() first"
        return self.session.run(self._output_names, {self._input_name: tensor})[0]

    def describe(self) -> Dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.model_path,
            "precision": self._precision,
            "threads": self.intra_op_threads or "auto",
            "spinning": self.spinning,
        }

    def close(self) -> None:
        self.session = None

