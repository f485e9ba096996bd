"""A fleet of local hosts for the real deploy/ansible/site.yml: each host is a folder (its own root for /etc,
/opt and /var/lib), a Python wrapper that puts tests/fleet/systemctl first on its PATH, and the real `edge` of
this checkout as its venv. One more host is an ssh address where nothing listens (an offline device)."""

import os
import shutil
import socket
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SITE = os.path.join(REPO, "deploy", "ansible", "site.yml")
STATE = "var/lib/jetson-edge"


def closed_port():
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    def __init__(self, base, hosts, model, calibration, regression):
        self.base = str(base)
        self.hosts = ["jetson-{:02d}".format(i) for i in range(hosts)]
        self.pause_file = os.path.join(self.base, "ROLLOUT_PAUSED")
        self.cache = os.path.join(self.base, "engine-cache")
        for host in self.hosts:
            self._make_host(host)
        self.common = {
            "ansible_become": False, "jetson_edge_system": False, "jetson_edge_backend": "onnxruntime",
            "jetson_edge_source": "synthetic", "jetson_edge_width": 320, "jetson_edge_height": 240,
            "jetson_edge_budget_ms": 10000, "jetson_edge_min_images": 1, "jetson_edge_check_frames": 2,
            "jetson_edge_check_warmup": 1,
            "jetson_edge_model": model, "jetson_edge_calibration_dir": calibration,
            "jetson_edge_regression_dir": regression, "jetson_edge_engine_cache": self.cache,
            "jetson_edge_pause_file": self.pause_file, "jetson_edge_operator": "alice"}

    def root(self, host):
        return os.path.join(self.base, "hosts", host)

    def _make_host(self, host):
        root = self.root(host)
        os.makedirs(os.path.join(root, "bin"))
        shutil.copy(os.path.join(HERE, "systemctl"), os.path.join(root, "bin", "systemctl"))
        python = os.path.join(root, "python")
        with open(python, "w") as fh:
            fh.write('#!/bin/sh\nPATH="{}:$PATH" exec {} "$@"\n'.format(os.path.join(root, "bin"), sys.executable))
        os.chmod(python, 0o755)
        os.makedirs(os.path.join(root, "opt", "jetson-edge"))
        os.symlink(sys.prefix, os.path.join(root, "opt", "jetson-edge", ".venv"))  # the package, installed

    def inventory(self, offline=None):
        hosts = {h: {"ansible_connection": "local", "jetson_edge_root": self.root(h),
                     "ansible_python_interpreter": os.path.join(self.root(h), "python")} for h in self.hosts}
        if offline:
            hosts[offline] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": closed_port(),
                              "ansible_ssh_common_args": "-o ConnectTimeout=5 -o StrictHostKeyChecking=no"}
        path = os.path.join(self.base, "inventory.yml")
        with open(path, "w") as fh:
            yaml.safe_dump({"jetsons": {"hosts": hosts}}, fh)
        return path

    def play(self, release, *args, offline=None, **extra):
        """ansible-playbook site.yml for `release`; extra keyword arguments are jetson_edge_* variables."""
        extra_vars = dict(self.common, jetson_edge_release=release,
                          **{"jetson_edge_" + k: v for k, v in extra.items()})
        vars_file = os.path.join(self.base, "vars.yml")
        with open(vars_file, "w") as fh:
            yaml.safe_dump(extra_vars, fh)
        playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
        env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=os.path.join(self.base, "tmp"),
                   ANSIBLE_REMOTE_TMP=os.path.join(self.base, "tmp"), ANSIBLE_HOST_KEY_CHECKING="False",
                   ANSIBLE_FORKS="10", ANSIBLE_PIPELINING="1")
        return subprocess.run([playbook, "-i", self.inventory(offline), SITE, "-e", "@" + vars_file] + list(args),
                              capture_output=True, text=True, cwd=self.base, timeout=900,
                              stdin=subprocess.DEVNULL, env=env)

    # -- what a device shows ------------------------------------------------------------------------------

    def current(self, host):
        link = os.path.join(self.root(host), STATE, "current")
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else None

    def service_log(self, host):
        return self._lines(os.path.join(self.root(host), "service.log"))

    def audit(self, host):
        return self._lines(os.path.join(self.root(host), STATE, "audit.log"))

    def release_file(self, host, release, name):
        return os.path.join(self.root(host), STATE, "releases", release, name)

    @staticmethod
    def _lines(path):
        if not os.path.exists(path):
            return []
        with open(path) as fh:
            return fh.read().splitlines()
