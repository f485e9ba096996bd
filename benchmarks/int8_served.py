"""What `edge run` serves for an INT8 Q/DQ model on this CPU, side by side in one run: the FP32 model, the Q/DQ model
as the backend chooses to run it (emulated where ONNX Runtime's fused int8 kernels saturate), and the same model
forced onto the fused kernels. Top-1 on the labelled ImageNet set and milliseconds per image.

    .venv/bin/python benchmarks/int8_served.py [--model engines/efficientnet_lite0.onnx]

Needs `edge export --arch efficientnet_lite0` (or another trained export) and calibration/imagenet
(scripts/bootstrap.sh makes it).
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from edge.artifact import read_model_info  # noqa: E402
from edge.build.calibration import load_calibration_set  # noqa: E402
from edge.build.quantize import quantize_qdq  # noqa: E402
from edge.config import PreprocessConfig  # noqa: E402
from edge.frame.onnxruntime_backend import OnnxRuntimeBackend  # noqa: E402
from edge.frame.preprocess import CpuPreprocessor  # noqa: E402
from edge.frame.qdq_emulation import int8_kernels_saturate  # noqa: E402


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
        for name, backend in (("fp32", OnnxRuntimeBackend(args.model)),
                              ("int8 as served", OnnxRuntimeBackend(qdq)),
                              ("int8 fused kernels", OnnxRuntimeBackend(qdq, emulate_int8=False))):
            with backend:
                started = time.monotonic()
                top1 = np.mean([np.argmax(backend.infer(x)) == y for x, y in data])
                ms = (time.monotonic() - started) / len(data) * 1e3
            print("{:<20} top-1 {:6.1%} on {} images, {:6.1f} ms/image  {}".format(
                name, top1, len(data), ms, backend.describe().get("int8", "")))


if __name__ == "__main__":
    main()
