"""jetson-edge: batch-1 image classification on NVIDIA Jetson inside a hard latency budget."""

__version__ = "0.1.0"
