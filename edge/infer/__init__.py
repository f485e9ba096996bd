"""Inference on one frame or a batch: preprocess -> backend -> postprocess, timed by the pipeline; GPU siblings
(cuda_preprocess, tensorrt_runner, tensorrt_backend) sit beside their CPU ones and load tensorrt/pycuda lazily."""
