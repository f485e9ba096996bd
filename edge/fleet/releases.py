"""A device's releases and the one switch between them: what Mender, RAUC and SWUpdate do for an OS image, done
for a release folder with the tools a Jetson already has (a systemd timer, not a new daemon).

`try_release` arms a fallback before anything changes (trial.json names the release it replaces), switches
`current` and restarts the service: a restart is one systemd job, so the service is never left stopped. `settle`
(jetson-edge-release.service, started by `try` and by its timer) bakes the release against the daemon's own
metrics (edge/fleet/health.py) and commits it, or returns to the fallback by itself: the controller may be gone.
Without a trial it leaves a release that was withdrawn while the device was offline. `withdraw` is the kill
switch on the device. Failed and withdrawn releases are recorded here (refused/) and in the shared store
(edge/fleet/store.py) and never switched to again without an explicit retry.

    <state>/releases/<name>/          a release (deploy/ansible writes it); GATED once committed here
    <state>/current, previous, committed   symlinks to releases/<name>, each replaced by one rename
    <state>/trial.json                the armed fallback {release, fallback, sha256, by, retry}
    <state>/refused/<name>.json       {release, state: failed | withdrawn, why, sha256, at, by, device}
    <state>/rollout.json              settings (deploy/ansible writes it; DEFAULTS below)
    <state>/audit.log                 one line per change: when, who, what, and the content's sha256

Every step is ordered so that a power cut anywhere leaves `current` on the old or the new release, and the next
`settle` finishes what was started.
"""

import contextlib
import datetime
import fcntl
import hashlib
import os
import re
import shutil
import socket
import subprocess
import time
from typing import Any, Dict, Iterator, List, Optional

from edge.errors import EXIT_FAIL, EdgeError, first_line
from edge.fleet import store
from edge.inputs import load_json
from edge.store.fileio import temp_name, write_json_atomic

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
DEFAULTS: Dict[str, Any] = {
    "service": "jetson-edge.service",  # the unit that runs `current`
    "settle_unit": "jetson-edge-release.service",  # runs `edge release settle` (its timer too)
    "store": "",  # the shared engine cache (folder or http(s):// URL): rollout records
    "bake_s": 300.0, "start_timeout_s": 180.0, "interval_s": 5.0, "max_miss_ratio": 0.05,
    "keep": 3,  # releases kept besides current, previous and committed
    "device": "",  # the device's name in records (the inventory name)
}
CONTENT = ("models", "calibration", "config.yaml", "release.env")  # what a release's sha256 covers (+ its venv)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_name(release: str) -> str:
    if not NAME.match(release or ""):
        raise EdgeError("release {!r}: letters, digits and . _ + - (at most 64), starting with a letter or digit"
                        .format(release[:80] if release else release))
    return release


def load_settings(state: str) -> Dict[str, Any]:
    path = os.path.join(state, "rollout.json")
    given = load_json(path, "rollout settings", 1 << 16) if os.path.exists(path) else {}
    if not isinstance(given, dict) or set(given) - set(DEFAULTS):
        raise EdgeError("{}: an object with the keys {}".format(path, ", ".join(sorted(DEFAULTS))))
    settings = dict(DEFAULTS, **given)
    for key, default in DEFAULTS.items():
        value = settings[key]
        if isinstance(default, str) and not isinstance(value, str):
            raise EdgeError("{}: {} must be a string".format(path, key))
        if not isinstance(default, str) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                             or not 0 <= value < 1e7 or value != value):
            raise EdgeError("{}: {} must be a number >= 0".format(path, key))
    return settings


class Device:
    """The release state under `state` (/var/lib/jetson-edge on a device)."""

    def __init__(self, state: str):
        self.state = os.path.abspath(state)
        if not os.path.isdir(os.path.join(self.state, "releases")):
            raise EdgeError("{}: no releases/ folder (deploy a release first)".format(self.state))
        self.settings = load_settings(self.state)

    def path(self, *parts: str) -> str:
        return os.path.join(self.state, *parts)

    def link(self, name: str) -> Optional[str]:
        target = os.readlink(self.path(name)) if os.path.islink(self.path(name)) else None
        return os.path.basename(target) if target else None

    def set_link(self, name: str, release: Optional[str]) -> None:
        """Point `name` at releases/`release` by one rename (None: remove it)."""
        if release is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(name))
            return
        tmp = temp_name(self.state, "." + name + ".")
        os.symlink(os.path.join("releases", release), tmp)
        os.replace(tmp, self.path(name))

    def release_dir(self, release: str) -> str:
        return self.path("releases", release)

    def gated(self, release: Optional[str]) -> bool:
        return bool(release) and os.path.isfile(os.path.join(self.release_dir(release or ""), "GATED"))

    def trial(self) -> Optional[Dict[str, Any]]:
        path = self.path("trial.json")
        return load_json(path, "trial") if os.path.exists(path) else None

    def end_trial(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path("trial.json"))

    def refusal(self, release: str) -> Optional[Dict[str, Any]]:
        """This device's record of `release` failing or being withdrawn."""
        path = self.path("refused", release + ".json")
        return store.load_record(path) if os.path.exists(path) else None

    def refused(self, release: str) -> Optional[Dict[str, Any]]:
        """The device's record of `release`, else the shared store's (an unreadable store raises)."""
        return self.refusal(release) or store.read(self.settings["store"], release)

    def record(self, release: str, state: str, why: str, sha: str, by: str) -> Dict[str, Any]:
        """Refuse `release` from now on, here and (a folder store) for every device."""
        rec = {"release": release, "state": state, "why": why, "sha256": sha, "at": now(), "by": by,
               "device": self.settings["device"] or socket.gethostname()}
        write_json_atomic(self.path("refused", release + ".json"), rec, "rollout record")
        try:
            store.write(self.settings["store"], rec)
        except (EdgeError, OSError) as exc:  # the device's own record holds; the controller writes the store too
            self.audit(by, "note: rollout store not written for {}: {}".format(release, first_line(exc)))
        return rec

    def forget(self, release: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path("refused", release + ".json"))

    def audit(self, by: str, text: str) -> None:
        with open(self.path("audit.log"), "a", encoding="utf-8") as fh:
            fh.write("{} {} {}\n".format(now(), by, text))
            fh.flush()
            os.fsync(fh.fileno())

    def systemctl(self, *args: str) -> None:
        proc = subprocess.run(["systemctl"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              encoding="utf-8", errors="replace", timeout=300)
        if proc.returncode != 0:
            raise EdgeError("systemctl {}: {}".format(" ".join(args), (proc.stdout.strip().splitlines() or ["exit {}"
                            .format(proc.returncode)])[-1]), EXIT_FAIL)

    def digest(self, release: str) -> str:
        """sha256 of what the release is: its model, sets, config and environment files and its venv's name."""
        root = self.release_dir(release)
        h = hashlib.sha256()
        for top in CONTENT:
            for path in sorted(_files(os.path.join(root, top))):
                h.update("{}\0".format(os.path.relpath(path, root)).encode())
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
        venv = os.path.join(root, "venv")
        h.update("venv\0{}".format(os.path.basename(os.readlink(venv)) if os.path.islink(venv) else "").encode())
        return h.hexdigest()

    @contextlib.contextmanager
    def lock(self, wait_s: float) -> Iterator[bool]:
        """One changer at a time (try, settle, withdraw); yields False when `wait_s` passed first."""
        fd = os.open(self.path(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.2)
            yield True
        finally:
            os.close(fd)

    def prune(self, by: str) -> List[str]:
        """Remove releases (and venvs no kept release uses) beyond current, previous, committed and the newest
        `keep`: eMMC is 16-64 GB. Records in refused/ stay."""
        names = sorted(os.listdir(self.path("releases")), key=lambda n: os.path.getmtime(self.release_dir(n)))
        keep = {self.link(n) for n in ("current", "previous", "committed")}
        keep.update(names[-int(self.settings["keep"]):] if self.settings["keep"] else [])
        venvs = {n: _venv(self.release_dir(n)) for n in names}
        used = {v for n, v in venvs.items() if n in keep}
        gone = [n for n in names if n not in keep]
        for name in gone:
            shutil.rmtree(self.release_dir(name), ignore_errors=True)
            venv = venvs[name]
            if venv and venv not in used and os.path.basename(os.path.dirname(venv)) == "venvs":
                shutil.rmtree(venv, ignore_errors=True)
        if gone:
            self.audit(by, "prune: removed {}".format(", ".join(gone)))
        return gone


def _files(path: str) -> Iterator[str]:
    if os.path.isfile(path):
        yield path
    for parent, dirs, files in os.walk(path):
        dirs.sort()
        for name in files:
            yield os.path.join(parent, name)


def _venv(release_dir: str) -> Optional[str]:
    link = os.path.join(release_dir, "venv")
    return os.path.realpath(link) if os.path.islink(link) else None


def short(sha: str) -> str:
    return "sha256 " + sha[:12]
