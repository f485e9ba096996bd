"""A fleet of local hosts for the real deploy/ansible/site.yml: each host is a folder (its own root for /etc, /opt,
/var/lib and its board's /proc/device-tree/model), reached through the `harness` connection plugin (local
execution that can drop off the network on demand, connection_plugins/harness.py), with tests/fleet/systemctl
first on its PATH: on a live host that stand-in runs the real `edge run` of `current` (ONNX Runtime, a synthetic
source) and the real `edge release settle`, detached, as the units would. One more host is an ssh address where
nothing listens (an offline device)."""

import os
import shutil
import subprocess
import sys

from service_helpers import ansible_env, free_port, write_config

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SITE = os.path.join(REPO, "deploy", "ansible", "site.yml")
STATE = "var/lib/jetson-edge-release"
BOARDS = {"orin": ("NVIDIA Jetson Orin Nano Developer Kit", "# R36 (release), REVISION: 4.0, BOARD: generic"),
          "xavier": ("NVIDIA Jetson Xavier NX Developer Kit", "# R35 (release), REVISION: 6.0, BOARD: t186ref")}


def build_wheel(out):
    """The package as the docs ship it (pip wheel --no-deps), built offline from a copy of the sources."""
    src = os.path.join(str(out), "src")
    for rel in ("setup.py", "MANIFEST.in", "README.md", "edge", "calibration/default", "calibration/regression",
                "configs", "systemd", "constraints"):
        source, target = os.path.join(REPO, rel), os.path.join(src, rel)
        if os.path.isdir(source):
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "cache", "imagenet"))
        elif os.path.exists(source):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(source, target)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(out), src], check=True, capture_output=True, timeout=600)
    return [os.path.join(str(out), n) for n in os.listdir(str(out)) if n.endswith(".whl")][0]


class Fleet:
    def __init__(self, base, boards, model, calibration, regression, live=True, wheel=""):
        """`boards`: [board type, ...], one host each, in inventory order (the first of a type is its canary)."""
        self.base = str(base)
        self.hosts = ["jetson-{:02d}".format(i) for i in range(len(boards))]
        self.boards = dict(zip(self.hosts, boards))
        self.ports = {h: free_port() for h in self.hosts}
        self.pause_file = os.path.join(self.base, "ROLLOUT_PAUSED")
        self.cache = os.path.join(self.base, "engine-cache")
        os.makedirs(self.cache, exist_ok=True)
        for host in self.hosts:
            self._make_host(host, live)
        constraints = os.path.join(self.base, "constraints.txt")  # the harness's venv has them all
        open(constraints, "w", encoding="utf-8").close()
        self.common = {
            "ansible_become": False, "jetson_edge_system": False, "jetson_edge_backend": "onnxruntime",
            "jetson_edge_source": "synthetic", "jetson_edge_width": 160, "jetson_edge_height": 120,
            "jetson_edge_fps": 20, "jetson_edge_budget_ms": 10000, "jetson_edge_min_images": 1,
            "jetson_edge_model": model, "jetson_edge_calibration_dir": calibration,
            "jetson_edge_regression_dir": regression, "jetson_edge_engine_cache": self.cache,
            "jetson_edge_pause_file": self.pause_file, "jetson_edge_operator": "alice",
            "jetson_edge_bake_s": 2, "jetson_edge_start_timeout_s": 120, "jetson_edge_bake_interval_s": 0.25,
            "jetson_edge_wheel": wheel, "jetson_edge_extras": "", "jetson_edge_constraints": constraints,
            "jetson_edge_venv_command": os.path.join(HERE, "make-venv") + " -m venv"}

    def root(self, host):
        return os.path.join(self.base, "hosts", host)

    def _make_host(self, host, live):
        root = self.root(host)
        os.makedirs(os.path.join(root, "bin"))
        shutil.copy(os.path.join(HERE, "systemctl"), os.path.join(root, "bin", "systemctl"))
        python = os.path.join(root, "python")
        with open(python, "w", encoding="utf-8") as fh:
            fh.write('#!/bin/sh\nPATH="{}:$PATH" exec {} "$@"\n'.format(os.path.join(root, "bin"), sys.executable))
        os.chmod(python, 0o755)
        os.makedirs(os.path.join(root, "opt", "jetson-edge"))
        os.symlink(sys.prefix, os.path.join(root, "opt", "jetson-edge", ".venv"))  # without a wheel: installed
        model, l4t = BOARDS[self.boards[host]]
        for rel, text in (("proc/device-tree/model", model + "\0"), ("etc/nv_tegra_release", l4t + "\n")):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as fh:
                fh.write(text)
        if live:
            open(os.path.join(root, "live"), "w", encoding="utf-8").close()

    def inventory(self, offline=None):
        hosts = {h: {"ansible_connection": "harness", "ansible_host": self.root(h), "jetson_edge_root": self.root(h),
                     "ansible_python_interpreter": os.path.join(self.root(h), "python"),
                     "jetson_edge_metrics_port": self.ports[h]} for h in self.hosts}
        if offline:
            hosts[offline] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": free_port(),
                              "ansible_ssh_common_args": "-o ConnectTimeout=5 -o StrictHostKeyChecking=no"}
        return write_config(os.path.join(self.base, "inventory.yml"), {"jetsons": {"hosts": hosts}})

    def command(self, release, *args, offline=None, forks=10, site=SITE, **extra):
        """The ansible-playbook command line and environment for `release` (`site`: another copy of the playbook);
        extra keyword arguments are jetson_edge_* variables."""
        extra_vars = dict(self.common, jetson_edge_release=release,
                          **{"jetson_edge_" + k: v for k, v in extra.items()})
        vars_file = write_config(os.path.join(self.base, "vars-{}.yml".format(os.getpid())), extra_vars)
        playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
        env = ansible_env(os.path.join(self.base, "tmp"), ANSIBLE_REMOTE_TMP=os.path.join(self.base, "tmp"),
                          ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_FORKS=str(forks), ANSIBLE_PIPELINING="1",
                          ANSIBLE_CONNECTION_PLUGINS=os.path.join(HERE, "connection_plugins"),
                          EDGE_HARNESS_PYTHON=sys.executable)
        argv = [playbook, "-i", self.inventory(offline), site, "-e", "@" + vars_file] + list(args)
        return argv, env

    def play(self, release, *args, timeout=1200, **kwargs):
        argv, env = self.command(release, *args, **kwargs)
        return subprocess.run(argv, capture_output=True,
                              encoding="utf-8", errors="replace", cwd=self.base, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=env)

    def start(self, release, *args, **kwargs):
        """The play in the background (a rollout in flight): a Popen writing to <base>/play-<release>.log."""
        argv, env = self.command(release, *args, **kwargs)
        log = open(os.path.join(self.base, "play-{}.log".format(release)), "w", encoding="utf-8")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.base,
                                stdin=subprocess.DEVNULL, env=env)

    def stop_services(self):
        for host in self.hosts:
            subprocess.run([os.path.join(self.root(host), "bin", "systemctl"), "stop", "jetson-edge.service"],
                           timeout=60)

    # -- what a device shows ------------------------------------------------------------------------------

    def current(self, host):
        link = os.path.join(self.root(host), STATE, "current")
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else None

    def serving(self, host):
        """The release the host's daemon reports on its metrics endpoint (None: nothing serves)."""
        from edge.fleet.health import scrape

        sample = scrape("http://127.0.0.1:{}/metrics".format(self.ports[host]))
        return sample.release if sample else None

    def settled(self, host):
        return not os.path.exists(os.path.join(self.root(host), STATE, "trial.json"))

    def service_log(self, host):
        return [line for line in self._lines(os.path.join(self.root(host), "service.log")) if line != "daemon-reload"]

    def audit(self, host):
        return self._lines(os.path.join(self.root(host), STATE, "audit.log"))

    def release_file(self, host, release, name):
        return os.path.join(self.root(host), STATE, "releases", release, name)

    def fault(self, host, kind, at):
        """kind 'drop-at' (go offline) or 'hold-at' (wait) when the stand-in systemctl runs `at`."""
        with open(os.path.join(self.root(host), kind), "w", encoding="utf-8") as fh:
            fh.write(at + "\n")

    def online(self, host):
        for name in ("drop-at", "hold-at", "OFFLINE", "held"):
            path = os.path.join(self.root(host), name)
            if os.path.exists(path):
                os.unlink(path)

    @staticmethod
    def _lines(path):
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()
