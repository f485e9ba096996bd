from setuptools import find_packages, setup

setup(
    name="jetson-edge",
    version="0.1.0",
    description="Batch-1 image classification on NVIDIA Jetson inside a hard latency budget: "
                "INT8 TensorRT build with calibration, timed runtime daemon, jtop telemetry.",
    python_requires=">=3.8",
    packages=find_packages(include=["edge", "edge.*"]),
    package_data={"edge": ["cuda/*.cuh", "cuda/*.cu", "cuda/*.cpp"]},
    install_requires=["numpy>=1.19", "pyyaml>=5.3", "onnx>=1.12"],
    extras_require={
        "cpu": ["onnxruntime>=1.12", "opencv-python-headless>=4.5", "tqdm>=4"],
        # TensorRT and a GStreamer-enabled OpenCV come from JetPack's apt packages, not PyPI.
        "jetson": ["pycuda>=2021.1", "jetson-stats>=4.2"],
        "export": ["torch>=1.12", "torchvision>=0.13"],
        "service": ["prometheus-client>=0.12", "sdnotify>=0.3.2", "psutil>=5.8"],
        "check": ["matplotlib>=3.3"],
        "dev": ["pytest>=7", "scikit-image>=0.19", "scikit-learn>=1.0", "pillow>=8", "mypy>=1.14", "jetson-stats>=4.2",
                "ruff>=0.4", "vermin>=1.5", "tqdm>=4"],
    },
    entry_points={"console_scripts": ["edge=edge.commands.cli:main"]},
)
