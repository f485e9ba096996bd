"""The per-frame path: sources -> preprocess -> backend -> postprocess, timed by the pipeline; GPU siblings
(cuda_preprocess, tensorrt_runner, tensorrt_backend) sit beside their CPU ones and load tensorrt/pycuda lazily."""
