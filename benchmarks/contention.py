"""The tail under contention: `edge run` on a 1280x720 video, quiet and beside one busy loop per core, at the CPU
priorities a systemd unit can give it, side by side in one run (rounds interleave the variants; these machines are
noisy). Each variant is a real `edge run --frames N` process; the busy loops run at the default priority, as
another service or a user's job on the device would.

    sudo .venv/bin/python benchmarks/contention.py [--rounds 3] [--frames 300]

Variants (what systemd/jetson-edge.service sets, and why, is in docs/throughput.md):
  quiet                      no load, default priority
  loaded                     busy loops, default priority (the unit before: no Nice=, no CPUWeight=)
  loaded, nice -10           busy loops, Nice=-10
  loaded, one core           busy loops, CPUAffinity= to one core (the loops still run there too)
  other unit, weight 1000    the loops in a sibling cgroup of weight 100, the service's of weight 1000: CPUWeight=1000
                             against another service's load
  other unit, nice -10       the same cgroups at weight 100 each, the service at Nice=-10: nice does not cross cgroups
  user slice, weight 1000    the service (weight 1000) inside a "system" cgroup of weight 100, the loops in a "user"
                             cgroup of weight 100: a unit's CPUWeight= cannot lift it above its slice's share
The cgroup variants use the cgroup v1 cpu controller's cpu.shares (what CPUWeight= sets there: weight x 1024 / 100)
or cgroup v2's cpu.weight; they are left out where neither can be made. Negative nice and cgroups need root (as
systemd has when it starts the unit).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipeline_speed import photo_video  # noqa: E402

from edge.model.export import export_model  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name: (busy loops, nice, CPU affinity, the service's cgroup path and weight chain, the loops' cgroup chain)
ONE_CORE = {(os.cpu_count() or 1) - 1}
VARIANTS = {
    "quiet": (False, 0, None, None, None),
    "loaded": (True, 0, None, None, None),
    "loaded, nice -10": (True, -10, None, None, None),
    "loaded, one core": (True, 0, ONE_CORE, None, None),
    "other unit, weight 1000": (True, 0, None, [("service", 1000)], [("loops", 100)]),
    "other unit, nice -10": (True, -10, None, [("service", 100)], [("loops", 100)]),
    "user slice, weight 1000": (True, 0, None, [("system", 100), ("service", 1000)], [("user", 100), ("loops", 100)]),
}
BENCH_CGROUP = "edge-contention"


def cgroup_root():
    """(root folder, v1 or v2) of a cpu controller this benchmark can make groups in, else None."""
    if os.path.isfile("/sys/fs/cgroup/cpu/cpu.shares"):
        return "/sys/fs/cgroup/cpu", 1
    controllers = "/sys/fs/cgroup/cgroup.controllers"
    if os.path.isfile(controllers) and "cpu" in open(controllers, encoding="utf-8").read().split():
        return "/sys/fs/cgroup", 2
    return None


def make_cgroup(chain):
    """The cgroup folder for [(name, weight), ...] below BENCH_CGROUP, made with those weights."""
    root, version = cgroup_root()
    path = os.path.join(root, BENCH_CGROUP)
    for name, weight in [("", None)] + list(chain):
        path = os.path.join(path, name) if name else path
        os.makedirs(path, exist_ok=True)
        if version == 2:
            with open(os.path.join(os.path.dirname(path), "cgroup.subtree_control"), "w", encoding="utf-8") as fh:
                fh.write("+cpu")
        if weight is not None:
            name, value = ("cpu.shares", weight * 1024 // 100) if version == 1 else ("cpu.weight", weight)
            with open(os.path.join(path, name), "w", encoding="utf-8") as fh:
                fh.write(str(value))
    return path


def join(path, pid):
    with open(os.path.join(path, "cgroup.procs"), "w", encoding="utf-8") as fh:
        fh.write(str(pid))


def remove_cgroups():
    found = cgroup_root()
    if found is None:
        return
    top = os.path.join(found[0], BENCH_CGROUP)
    for folder, _, _ in sorted(os.walk(top), key=lambda entry: -entry[0].count(os.sep)):
        os.rmdir(folder)


def run_edge(model, video, frames, nice, cpus, cgroup):
    def prioritise():
        if cgroup:
            join(cgroup, os.getpid())
        if nice:
            os.nice(nice)
        if cpus:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.run([sys.executable, "-m", "edge", "run", "--model", model, "--source", video, "--frames",
                           str(frames), "--backend", "onnxruntime", "--preprocess", "cpu"], cwd=REPO,
                          capture_output=True, encoding="utf-8", errors="replace", preexec_fn=prioritise, timeout=600)
    report = [json.loads(line) for line in proc.stdout.splitlines() if '"event":"report"' in line]
    if proc.returncode != 0 or not report:
        raise SystemExit("edge run failed: " + proc.stderr[-500:])
    return report[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frames", type=int, default=300)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: a negative nice needs it (systemd has it when it starts the unit)")
    work = tempfile.mkdtemp(prefix="edge-contention-")
    model = os.path.join(work, "mobilenet_v3_large.onnx")
    export_model("mobilenet_v3_large", "random", model, log=lambda *a: None)
    video = os.path.join(work, "frames.avi")
    photo_video(video, frames=90)
    variants = {k: v for k, v in VARIANTS.items() if v[3] is None or cgroup_root() is not None}
    results = {name: [] for name in variants}
    try:
        for r in range(args.rounds):
            for name, (loaded, nice, cpus, service, others) in variants.items():
                group = make_cgroup(others) if others else None
                loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 1)] \
                    if loaded else []
                try:
                    for loop in loops:
                        if group:
                            join(group, loop.pid)
                    results[name].append(run_edge(model, video, args.frames, nice, cpus,
                                                  make_cgroup(service) if service else None))
                finally:
                    for loop in loops:
                        loop.kill()
                        loop.wait()
                    remove_cgroups()
            print("round {}/{} done".format(r + 1, args.rounds), flush=True)
    finally:
        remove_cgroups()
    print("\nMobileNetV3-Large, 1280x720 video, {} cores, {} rounds x {} frames, end to end ms (budget 30 ms)".format(
        os.cpu_count(), args.rounds, args.frames))
    print("  {:<20}{:>8}{:>8}{:>8}{:>10}".format("variant", "p50", "p99", "max", "misses"))
    for name, reports in results.items():
        p50, p99, top = (np.median([rep["stages_ms"]["end_to_end"][q] for rep in reports]) for q in ("p50", "p99",
                                                                                                     "max"))
        misses = sum(rep["misses"] for rep in reports)
        print("  {:<20}{:>8.2f}{:>8.2f}{:>8.2f}{:>6} of {}".format(name, p50, p99, top, misses,
                                                                  sum(rep["frames"] for rep in reports)))
    print("(p50, p99 and max: the median over the rounds)")


if __name__ == "__main__":
    main()
