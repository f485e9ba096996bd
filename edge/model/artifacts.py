"""The onnx-qdq format's install check (edge.model.plan.FORMATS): a staged Q/DQ model must load and run.

Reading, verifying, installing and rolling back an artifact is edge.store.artifact's.
"""

import numpy as np

from edge.errors import EXIT_FAIL, EdgeError, first_line, require


def verify_onnx(path: str) -> None:
    """Parse, check and run one inference on zeros; a failure is an EdgeError naming the file."""
    onnx = require("onnx")
    ort = require("onnxruntime")
    try:
        onnx.checker.check_model(path)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        inp = session.get_inputs()[0]
        shape = [d if isinstance(d, int) else 1 for d in inp.shape]
        out = session.run(None, {inp.name: np.zeros(shape, np.float32)})[0]
    except Exception as exc:  # checker, protobuf and ORT raise their own types
        raise EdgeError("{}: verification failed: {}".format(path, first_line(exc)), exit_code=EXIT_FAIL) from None
    if not np.all(np.isfinite(out)):
        raise EdgeError("{}: verification failed: non-finite output".format(path), exit_code=EXIT_FAIL)
