"""Overload: N synthetic cameras against one camera under a budget no frame can make (issue 39 item 12).

`edge run`'s Runtime and loop, in process, on a torchvision model exported with a batch axis (seeded random weights:
latency is real), ONNX Runtime on this CPU, 1280x720 synthetic cameras at 30 fps. Prints the results per second of
one camera and of N, their ratio (at least 0.5 is the issue's bar: N cameras served best effort, not one probe a
second), the misses and the frames expired.

    .venv/bin/python benchmarks/overload.py [--cameras 3] [--budget-ms 1] [--seconds 10] [--model mobilenet_v3_large]
"""

import argparse
import io
import os
import tempfile
import threading
import time

from edge.config import load_config
from edge.model.export import export_model
from edge.service.log import JsonLog
from edge.service.loop import run
from edge.service.runtime import Runtime
from edge.service.signals import StopFlag


def served_per_second(model, cameras, budget_ms, seconds):
    """(results/s, report) of `cameras` synthetic cameras for `seconds` after start."""
    overrides = {"model.path": model, "backend.kind": "onnxruntime", "preprocess.device": "cpu",
                 "runtime.budget_ms": budget_ms, "runtime.warmup": 0, "service.telemetry.enabled": False,
                 "service.metrics.enabled": False, "source.width": 1280, "source.height": 720, "source.fps": 30.0}
    if cameras > 1:
        overrides["sources"] = [{"name": "cam{}".format(i)} for i in range(cameras)]
    stop = StopFlag()
    runtime = Runtime(load_config(None, overrides), log=JsonLog(stream=io.StringIO()))
    started = {}

    class Clock:  # the window starts with the first result (after the start-up's cost measurements)
        def on_result(self, result):
            if not started:
                started["at"] = time.monotonic()
                threading.Timer(seconds, stop.request, ("window over",)).start()

        def close(self):
            pass

    runtime.sinks.append(Clock())
    report = run(runtime, stop)
    return report["frames"] / (time.monotonic() - started["at"]), report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=3)
    parser.add_argument("--budget-ms", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--model", default="mobilenet_v3_large", help="a torchvision classifier edge export knows")
    args = parser.parse_args()
    model = os.path.join(tempfile.mkdtemp(prefix="edge-overload-"), args.model + ".onnx")
    export_model(args.model, "random", model, log=lambda *a: None, batch="dynamic")
    one, one_report = served_per_second(model, 1, args.budget_ms, args.seconds)
    many, many_report = served_per_second(model, args.cameras, args.budget_ms, args.seconds)
    print("{} (random weights), ONNX Runtime, {} cores, 1280x720 at 30 fps, budget {:g} ms, {:g} s each".format(
        args.model, os.cpu_count(), args.budget_ms, args.seconds))
    for n, rate, report in ((1, one, one_report), (args.cameras, many, many_report)):
        expired = sum(c["expired"] for c in report.get("cameras", {}).values()) or report.get("expired", 0)
        print("{} camera(s): {:.1f} results/s, {} of {} results missed, {} frames expired".format(
            n, rate, report["misses"], report["frames"], expired))
    print("ratio {}/1: {:.2f} (at least 0.5 wanted)".format(args.cameras, many / one))


if __name__ == "__main__":
    main()
