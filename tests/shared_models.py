"""The models a test run makes once and its pytest-xdist workers share, each in a folder of the run's shared folder
(made_once): MobileNetV3-Small and two tiny classifiers exported by the real `edge export` code, the trained digits
model and its Q/DQ model (tests/trained_model.py).

tests/conftest.py starts this file in the background at collection, naming the folders the collected tests need. It
takes all their locks before importing anything else, so no worker starts one meanwhile, and it imports torch once
for all of them (seconds of CPU per process). A fixture waits for its folder, or makes it where nothing started this.
"""

import os
import sys

from made_once import make_in_order

SMALL, TINY, DIGITS, DIGITS_QDQ = "small-model", "tiny-classifiers", "digits", "digits-qdq"
SMALL_NAME = "mobilenet_v3_small.onnx"
TINY_SEEDS = (0, 1)
QDQ_NAME = "digits.int8.onnx"  # the Q/DQ model in DIGITS_QDQ
quiet = lambda *a: None  # noqa: E731


def tiny_paths(folder):
    return [os.path.join(folder, "tiny{}.onnx".format(seed)) for seed in TINY_SEEDS]


def make_small_model(folder):
    """MobileNetV3-Small with seeded random weights."""
    from edge.model.export import export_model

    export_model("mobilenet_v3_small", "random", os.path.join(folder, SMALL_NAME), log=quiet)


def make_tiny_classifiers(folder):
    """Two 10-class classifiers of two strided convolutions (224x224 input, random weights, seeds 0 and 1): an export
    like any other to the build, the rebuild and an install, quantised in a tenth of MobileNetV3-Small's time."""
    import torch

    from edge.model.export import export_onnx

    for seed, path in zip(TINY_SEEDS, tiny_paths(folder)):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4, padding=1), torch.nn.ReLU(),
                                  torch.nn.Conv2d(8, 16, 3, stride=4, padding=1), torch.nn.ReLU(),
                                  torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
        export_onnx(net.eval(), path, [str(i) for i in range(10)], "random(seed={})".format(seed), False, "tiny",
                    log=quiet)


def make_digits(folder):
    from trained_model import train_digits_model

    train_digits_model(folder)


def make_digits_qdq(run):
    """The maker of DIGITS_QDQ from the run's DIGITS."""
    def make(folder):
        from trained_model import load_digits_model, quantize_digits

        quantize_digits(load_digits_model(os.path.join(run, DIGITS)), os.path.join(folder, QDQ_NAME))

    return make


if __name__ == "__main__":  # ARGV[1]: the run's shared folder; the rest: the folders to make, in order
    run, names = sys.argv[1], sys.argv[2:]
    makers = {SMALL: make_small_model, TINY: make_tiny_classifiers, DIGITS: make_digits,
              DIGITS_QDQ: make_digits_qdq(run)}
    make_in_order([(os.path.join(run, name), makers[name]) for name in names])
