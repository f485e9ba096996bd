#!/usr/bin/env python3
"""Build the CUDA preprocessing kernel ahead of time, so the service never runs nvcc.

    scripts/build_kernel.py                          # for this device's GPU, into the kernel dir
    scripts/build_kernel.py --into /var/lib/jetson-edge/kernels --arch sm_87
    scripts/build_kernel.py --fatbin                 # regenerate the shipped CUDA 13.x fatbin (nvcc 13)
    scripts/build_kernel.py --prebuilt               # regenerate the shipped CUDA 11.x / 12.x cubins and
                                                     # 12.x PTX (NVRTC 11.8 / 12.2 from PyPI's pinned wheels:
                                                     # edge/model/prebuilt_kernels.py)

Kernel dir: $EDGE_KERNEL_DIR, else $STATE_DIRECTORY/kernels, else /var/lib/jetson-edge/kernels (where the
service, `edge doctor` and `edge check` all look). nvcc's temporary files go inside the output folder (an
unwritable /tmp is fine). See docs/gpu.md.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edge.cli.common import standalone_main  # noqa: E402
from edge.infer import cuda_kernel  # noqa: E402


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--into", help="output folder (default: the kernel dir)")
    p.add_argument("--arch", help="GPU architecture, e.g. sm_87 (default: this device's CUDA device 0, else the "
                                  "Jetson SoC its device tree names)")
    p.add_argument("--fatbin", action="store_true", help="regenerate the CUDA 13.x fatbin shipped in the package")
    p.add_argument("--prebuilt", action="store_true", help="regenerate the CUDA 11.x and 12.x cubins and the 12.x "
                                                           "PTX shipped in the package, from PyPI's NVRTC wheels")


def build(args: argparse.Namespace) -> int:
    if args.fatbin or args.prebuilt:
        from edge.model.prebuilt_kernels import build_prebuilt

        for entry in ([cuda_kernel.build_fatbin()] if args.fatbin else []) + (build_prebuilt() if args.prebuilt
                                                                               else []):
            print("build_kernel: {}".format(cuda_kernel.describe(entry)))
        return 0
    arch, why = (args.arch, "--arch") if args.arch else cuda_kernel.device_arch()
    path = cuda_kernel.build_cubin(arch, args.into)
    print("build_kernel: {} ({} from {})".format(path, arch, why))
    return 0


if __name__ == "__main__":
    sys.exit(standalone_main("build_kernel.py", __doc__, add_arguments, build))
