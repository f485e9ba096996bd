"""The one stand-in for the `tensorrt` module, for tests without a GPU: the builder API that
edge/model/tensorrt_engine.py drives (tests/test_build.py) and the runtime API that TensorRTBackend drives
(tests/device/test_simulated.py).

Per version it has only what the real API has: 8.5 needs EXPLICIT_BATCH, 11 has no precision flags and no
calibrator. The builder records what it was asked for in `trt.calls` and drives a calibrator as TensorRT does.
The runtime deserializes bytes starting with ENGINE_MAGIC into an engine that computes reference_logits,
reading and writing the memory at the tensor addresses it is given (host memory standing in for device memory).
"""

import ctypes
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

NUM_CLASSES = 10
ENGINE_MAGIC = b"SIMULATED-ENGINE"
WEIGHTS = np.random.default_rng(0).standard_normal((NUM_CLASSES, 3)).astype(np.float32)


def view(ptr: int, shape: Sequence[int], dtype: Any) -> np.ndarray:
    """The memory at address `ptr` as an array."""
    count = int(np.prod(shape))
    raw = (ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype, count).reshape(shape)


def reference_logits(tensor: np.ndarray) -> np.ndarray:
    """What the fake engine computes: a fixed linear map of the per-channel means."""
    return (WEIGHTS @ tensor.reshape(3, -1).astype(np.float32).mean(axis=1))[None, :]


class Logger:
    WARNING = "WARNING"

    def __init__(self, severity: str) -> None:
        self.severity = severity


def fake_tensorrt(version: str = "10.3.0", input_dtype: Any = np.float32, crop: int = 224,
                  batch_sizes: Sequence[int] = ()) -> types.ModuleType:
    """A `tensorrt` module of `version` whose engines take a (1, 3, crop, crop) `input_dtype` tensor; with
    `batch_sizes`, a dynamic batch axis and one optimisation profile per size (min = opt = max)."""
    trt = types.ModuleType("tensorrt")
    trt.__file__ = __file__  # a package with code, not type stubs alone
    trt.__version__ = version
    trt.Logger = Logger
    _add_builder(trt, int(version.split(".")[0]))
    _add_runtime(trt, input_dtype, crop, list(batch_sizes))
    return trt


def _layer(node: Any) -> Any:
    """A network layer as the parser makes it of an ONNX node (QuantizeLinear outputs INT8)."""
    kind = {"QuantizeLinear": "QUANTIZE", "DequantizeLinear": "DEQUANTIZE"}.get(node.op_type, "OTHER")
    inputs = [types.SimpleNamespace(name=name) for name in node.input if name]
    outputs = [types.SimpleNamespace(name=name, dtype="int8" if kind == "QUANTIZE" else "float32")
               for name in node.output]
    return types.SimpleNamespace(name=node.name, type=kind, num_inputs=len(inputs), get_input=inputs.__getitem__,
                                 num_outputs=len(outputs), get_output=outputs.__getitem__, precision=None)


def _add_builder(trt: types.ModuleType, major: int) -> None:
    trt.calls = []
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(EXPLICIT_BATCH=0)
    trt.LayerType = types.SimpleNamespace(QUANTIZE="QUANTIZE", DEQUANTIZE="DEQUANTIZE", OTHER="OTHER")
    trt.float32, trt.int8 = "float32", "int8"
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
    trt.Dims = tuple  # behaves like a tuple in TensorRT too
    trt.BuilderFlag = types.SimpleNamespace(**({} if major >= 11 else {
        "INT8": "INT8", "FP16": "FP16", "OBEY_PRECISION_CONSTRAINTS": "OBEY_PRECISION_CONSTRAINTS"}))

    class IInt8EntropyCalibrator2:
        def __init__(self) -> None:
            pass

    class Error:
        def __init__(self, desc: str, node: str) -> None:
            self._desc, self._node = desc, node

        def desc(self) -> str:
            return self._desc

        def node_name(self) -> str:
            return self._node

    class Network:
        def __init__(self, flags: int) -> None:
            self.flags = flags
            self.layers: List[Any] = []  # a layer per ONNX node: type, inputs and outputs, precision when pinned
            self.inputs: List[Any] = []
            trt.calls.append(("create_network", flags))

        def get_input(self, i: int) -> Any:
            return self.inputs[i]

        @property
        def num_layers(self) -> int:
            return len(self.layers)

        def get_layer(self, i: int) -> Any:
            return self.layers[i]

    class OnnxParser:
        def __init__(self, network: Network, logger: Logger) -> None:
            self.network = network
            self.errors: List[Error] = []

        def parse(self, data: bytes) -> bool:
            import onnx

            try:
                model = onnx.load_from_string(data)
            except Exception:
                self.errors.append(Error("Failed to parse ONNX model from file\nsecond line", "(none)"))
                return False
            self.network.layers = [_layer(n) for n in model.graph.node]
            self.network.inputs = [types.SimpleNamespace(name=i.name, shape=tuple(
                d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim))
                for i in model.graph.input]
            return True

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, i: int) -> Error:
            return self.errors[i]

    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = bytes(data)

        def serialize(self) -> bytes:
            return self.data + b"+"

    class Config:
        def __init__(self) -> None:
            self.flags: List[str] = []
            self.pools: Dict[str, int] = {}
            self.timing: Optional[TimingCache] = None
            if major < 11:
                self.int8_calibrator: Any = None

        def add_optimization_profile(self, profile: Any) -> int:
            trt.calls.append(("profile", dict(profile.shapes)))
            return 0

        def set_calibration_profile(self, profile: Any) -> bool:
            trt.calls.append(("calibration_profile", dict(profile.shapes)))
            return True

        def set_memory_pool_limit(self, pool: str, size: int) -> None:
            self.pools[pool] = size

        def set_flag(self, flag: str) -> None:
            self.flags.append(flag)

        def create_timing_cache(self, data: bytes) -> TimingCache:
            return TimingCache(data)

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            self.timing = cache
            return True

        def get_timing_cache(self) -> Optional[TimingCache]:
            return self.timing

    class Builder:
        def __init__(self, logger: Logger) -> None:
            pass

        def create_network(self, flags: int = 0) -> Network:
            return Network(flags)

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Any:
            profile = types.SimpleNamespace(shapes={})
            profile.set_shape = lambda name, low, opt, high: profile.shapes.__setitem__(name, (low, opt, high))
            return profile

        def build_serialized_network(self, network: Network, config: Config) -> bytes:
            calibrator = getattr(config, "int8_calibrator", None)
            batches = 0
            if calibrator is not None:
                cache = calibrator.read_calibration_cache()
                if cache is None:
                    while calibrator.get_batch(["input"]) is not None:
                        batches += 1
                    calibrator.write_calibration_cache(b"TRT-100300-EntropyCalibration2\ninput: 3c010a14\n")
            trt.calls.append(("build", sorted(config.flags), dict(config.pools), config.timing.data, batches))
            trt.built_network = network
            return b"ENGINE " + " ".join(sorted(config.flags)).encode()

    if major < 11:
        trt.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2
    trt.OnnxParser, trt.Builder = OnnxParser, Builder


def _add_runtime(trt: types.ModuleType, input_dtype: Any, crop: int, sizes: List[int]) -> None:
    """The named-tensor API with execute_async_v3 (8.5+); with `sizes`, dynamic batch profiles (one context each)."""
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    trt.DataType = types.SimpleNamespace(FLOAT="FLOAT", HALF="HALF", INT8="INT8", INT32="INT32", BOOL="BOOL")
    dtypes = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8}
    trt_dtype = next(name for name, dt in dtypes.items() if np.dtype(dt) == np.dtype(input_dtype))
    batch = -1 if sizes else 1
    tensors = [("input", "INPUT", (batch, 3, crop, crop), trt_dtype),
               ("logits", "OUTPUT", (batch, NUM_CLASSES), "FLOAT")]
    trt.contexts = []  # every context made, with the profile it runs (tests check one per profile)

    class Context:
        def __init__(self) -> None:
            self.addresses: Dict[str, int] = {}
            self.profile = 0
            self.rows = 1 if not sizes else 0  # a dynamic input has no shape until set_input_shape
            trt.contexts.append(self)

        def set_optimization_profile_async(self, index: int, stream_handle: int) -> bool:
            assert all(c.profile != index for c in trt.contexts if c is not self and c.rows), "profile in use"
            self.profile = index
            return True

        def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
            assert name == "input" and sizes[self.profile] == shape[0], (self.profile, shape)
            self.rows = int(shape[0])
            return True

        def get_tensor_shape(self, name: str) -> Tuple[int, ...]:
            return (self.rows,) + tuple(next(t for t in tensors if t[0] == name)[2][1:])

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            self.addresses[name] = ptr
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            assert self.rows, "input shape not set"
            x = view(self.addresses["input"], (self.rows,) + tensors[0][2][1:], dtypes[trt_dtype])
            logits = view(self.addresses["logits"], (self.rows, NUM_CLASSES), np.float32)
            for row in range(self.rows):
                logits[row] = reference_logits(x[row])[0]
            return True

    class Engine:
        num_io_tensors = len(tensors)
        num_optimization_profiles = max(1, len(sizes))

        def get_tensor_name(self, i: int) -> str:
            return tensors[i][0]

        def _find(self, name: str) -> Tuple[str, str, Tuple[int, ...], str]:
            return next(t for t in tensors if t[0] == name)

        def get_tensor_mode(self, name: str) -> str:
            return self._find(name)[1]

        def get_tensor_shape(self, name: str) -> Tuple[int, ...]:
            return self._find(name)[2]

        def get_tensor_dtype(self, name: str) -> str:
            return self._find(name)[3]

        def get_tensor_profile_shape(self, name: str, index: int) -> List[Tuple[int, ...]]:
            shape = (sizes[index],) + tuple(self._find(name)[2][1:])
            return [shape, shape, shape]

        def create_execution_context(self) -> Context:
            return Context()

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, data: bytes) -> Optional[Engine]:
            if not data.startswith(ENGINE_MAGIC):
                return None
            return Engine()

    trt.Runtime = Runtime
