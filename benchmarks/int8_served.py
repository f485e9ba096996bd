"""What `edge run` serves for an INT8 Q/DQ model on this CPU, side by side in one run: the FP32 model, the Q/DQ model
emulated (what the gate judges), as the backend chooses to run it (emulated where ONNX Runtime's fused int8 kernels
saturate), and forced onto the fused kernels with session.x64quantprecision on (every session of ours) and off.
Top-1 on the labelled ImageNet set, top-1 agreement with the emulated model, the largest logit difference from it
(relative to its largest logit) and milliseconds per image.

    .venv/bin/python benchmarks/int8_served.py [--model engines/efficientnet_lite0.onnx]

Needs `edge export --arch efficientnet_lite0` (or another trained export) and calibration/imagenet
(scripts/bootstrap.sh makes it).
"""

import argparse
import contextlib
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from edge.config import PreprocessConfig  # noqa: E402
from edge.infer import onnxruntime_backend  # noqa: E402
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend  # noqa: E402
from edge.infer.preprocess import CpuPreprocessor  # noqa: E402
from edge.infer.qdq_emulation import int8_kernels_saturate  # noqa: E402
from edge.model.calibration import load_calibration_set  # noqa: E402
from edge.model.quantize import quantize_qdq  # noqa: E402
from edge.store.artifact import read_model_info  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.join(ROOT, "engines", "efficientnet_lite0.onnx"))
    parser.add_argument("--set", default=os.path.join(ROOT, "calibration", "imagenet"))
    args = parser.parse_args()
    info = read_model_info(args.model)
    pre = PreprocessConfig(**{k: info["preprocess"][k] for k in ("resize", "crop", "mean", "std")})
    images = load_calibration_set(args.set)
    prep = CpuPreprocessor(pre)
    data = [(prep(images.read(n)).copy(), int(images.label_of(n) or -1)) for n in images.files]
    print("int8 kernels saturate on this CPU: {}".format(int8_kernels_saturate()))
    with tempfile.TemporaryDirectory() as work:
        qdq = os.path.join(work, "model.int8.onnx")
        quantize_qdq(args.model, qdq, load_calibration_set(os.path.join(ROOT, "calibration", "default")), pre,
                     "minmax", True, show_progress=False, log=print)
        judged = None
        for name, runner, precision in (
                ("fp32", OnnxRuntimeBackend(args.model), "1"),
                ("int8 emulated (judged)", OnnxRuntimeBackend(qdq, emulate_int8=True), "1"),
                ("int8 as served", OnnxRuntimeBackend(qdq), "1"),
                ("int8 fused, x64quantprecision", OnnxRuntimeBackend(qdq, emulate_int8=False), "1"),
                ("int8 fused, without it", OnnxRuntimeBackend(qdq, emulate_int8=False), "0")):
            with precision_option(precision), runner as backend:
                started = time.monotonic()
                out = np.stack([np.asarray(backend.infer(x), np.float64).reshape(-1) for x, _ in data])
                ms = (time.monotonic() - started) / len(data) * 1e3
                int8 = backend.describe().get("int8", "")
            top1 = np.mean(out.argmax(1) == np.asarray([y for _, y in data]))
            judged = out if judged is None and "judged" in name else judged
            if judged is None or name == "fp32":
                versus = ""
            else:
                difference = np.abs(out - judged).max(1) / np.abs(judged).max(1)
                versus = "agreement with judged {:6.1%}, max relative difference {:.2e}".format(
                    np.mean(out.argmax(1) == judged.argmax(1)), difference.max())
            print("{:<30} top-1 {:6.1%} on {} images, {:6.1f} ms/image  {}  {}".format(
                name, top1, len(data), ms, versus, int8))


@contextlib.contextmanager
def precision_option(value):
    """Every session of ours with session.x64quantprecision set to `value`."""
    real = onnxruntime_backend.session_options

    def options(*args):
        made = real(*args)
        made.add_session_config_entry(onnxruntime_backend.X64_QUANT_PRECISION, value)
        return made

    onnxruntime_backend.session_options = options
    try:
        yield
    finally:
        onnxruntime_backend.session_options = real


if __name__ == "__main__":
    main()
