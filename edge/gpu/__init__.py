"""The GPU path: fused CUDA preprocessing (pycuda) and the TensorRT backend (docs/gpu.md).

Every module here imports without TensorRT or pycuda; they load those lazily, when a GPU stage is
created or `select` probes for them, so the CPU path never loads either.
"""
