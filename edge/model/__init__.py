"""The offline build: export, calibration, Q/DQ quantization, the accuracy gate, the engine build, and the one
build chain (steps) that `edge build` and `edge rebuild` run."""
