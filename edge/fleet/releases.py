"""A device's releases and the one switch between them: what Mender, RAUC and SWUpdate do for an OS image, done
for a release folder with the tools a Jetson already has (a systemd timer, not a new daemon).

`try_release` arms a fallback before anything changes (trial.json names the release it replaces), switches
`current` and restarts the service: a restart is one systemd job, so the service is never left stopped. `settle`
(jetson-edge-release.service, started by `try` and by its timer) bakes the release against the daemon's own
metrics (edge/fleet/health.py) and commits it, or returns to the fallback by itself: the controller may be gone.
Without a trial it leaves a release that was withdrawn while the device was offline. `withdraw` is the kill
switch on the device. Failed and withdrawn releases are recorded here (refused/) and in the shared store
(edge/fleet/store.py) and never switched to again without an explicit retry.

    <state>/releases/<name>/          a release (deploy/ansible writes it); GATED once a trial of it committed here
    <state>/current, previous, committed   symlinks to releases/<name>, each flipped by edge.store.versions
    <state>/trial.json                the armed fallback {release, fallback, sha256, armed_at, by, retry, supersedes}
    <state>/refused/<name>.json       {release, state: failed | withdrawn, why, sha256, at, by, device}
    <state>/rollout.json              settings (deploy/ansible writes it; Settings below)
    <state>/audit.log                 one line per change: when, who, what, and the content's sha256

Every step is ordered so that a power cut anywhere leaves `current` on the old or the new release, and the next
`settle` finishes what was started.

The settle unit runs as root, so the state is root's alone (/var/lib/jetson-edge-release, 0755; the service user
reads it and writes only each release's engines/ and kernels/). Every file in it is opened through
edge/fleet/statedir.py (no link followed, no folder another user can write; the lock is edge.store.versions', on
the path statedir checked), and every name read from it is checked: a planted link or a forged name is refused in
one line, never followed.
"""

import contextlib
import datetime
import hashlib
import json
import os
import re
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

from edge.errors import EXIT_FAIL, EdgeError, first_line, one_line
from edge.fields import build, setting, show, validate
from edge.fleet import store
from edge.fleet.statedir import StateDir
from edge.store import versions

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
LINK = re.compile("^releases/" + NAME.pattern[1:])  # current, previous, committed, as set_link flips them
UNIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]{0,200}\.service$")
# what a release's sha256 covers (+ its venv's name, the wheel's): the controller's inputs, the same on every device;
# not config.yaml and release.env, which deploy/ansible renders per device (its camera, its port, its paths)
CONTENT = ("models", "calibration")
BUILT = ("engines", "kernels", "calibration/cache")  # what the service user builds in a release: not its content
PROGRAM = ".venv"  # <prefix>/.venv: the installed program the settle unit runs (deploy/ansible links it)
MAX_STATE_BYTES = 1 << 20


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_name(release: Any, where: str = "release") -> str:
    if not isinstance(release, str) or not NAME.match(release):
        raise EdgeError("{} {}: letters, digits and . _ + - (at most 64), starting with a letter or digit".format(
            where, one_line(repr(release), 80)))
    return release


def _unit(value: str, label: str) -> None:
    if not UNIT.match(value):
        raise EdgeError("{} must name a systemd .service unit, got {}".format(label, show(value)))


def _store(value: str, label: str) -> None:
    if not _plain_store(value):
        raise EdgeError("{} must be empty, an absolute folder or an http(s):// URL, got {}".format(label, show(value)))


def _device(value: str, label: str) -> None:
    if len(value) > 253 or not value.isprintable():
        raise EdgeError("{} must be a printable name of at most 253 characters".format(label))


@dataclass(frozen=True)
class Settings:
    """<state>/rollout.json (deploy/ansible writes it), each key declared once (edge.fields)."""

    service: str = setting("jetson-edge.service", "the unit that runs `current`", check=_unit)
    settle_unit: str = setting("jetson-edge-release.service", "runs `edge release settle` (its timer too)",
                               check=_unit)
    store: str = setting("", "the shared engine cache (an absolute folder or http(s):// URL): rollout records",
                         check=_store)
    bake_s: float = setting(300.0, "seconds of the daemon's metrics a bake judges", low=0, high=1e7)
    start_timeout_s: float = setting(180.0, "seconds a release has to start serving", low=0, high=1e7)
    interval_s: float = setting(5.0, "seconds between two reads of the metrics", low=0, high=1e7)
    max_miss_ratio: float = setting(0.05, "the budget misses per frame a bake allows", low=0, high=1)
    keep: int = setting(3, "releases kept besides current, previous and committed", low=0, high=10 ** 6)
    device: str = setting("", "the device's name in records (the inventory name)", check=_device)


def load_settings(state: StateDir) -> Settings:
    """rollout.json, checked: a bad value is one line naming the file and the key."""
    path = state.where("rollout.json")
    settings = build(Settings, state.load_json("rollout.json", "rollout settings", 1 << 16), path)
    validate(settings, path)
    return settings


def _plain_store(value: str) -> bool:
    if not value:
        return True
    if not value.isprintable() or any(c.isspace() for c in value) or len(value) > 4096:
        return False
    if store.is_url(value):
        return value.startswith(("https://", "http://"))
    return value.startswith("/") and os.path.normpath(value) == value.rstrip("/")


def check_trial(trial: Any, where: str) -> Dict[str, Any]:
    """trial.json, checked: every name in it is a release name (root switches to its `fallback`)."""
    if not isinstance(trial, dict) or not isinstance(trial.get("armed_at", ""), str) or \
            not isinstance(trial.get("sha256", ""), str):
        raise EdgeError("{}: not a trial (an object naming a release and its fallback)".format(where))
    check_name(trial.get("release"), where + ": release")
    if trial.get("fallback") is not None:
        check_name(trial["fallback"], where + ": fallback")
    return trial


class Device:
    """The release state under `state` (/var/lib/jetson-edge-release on a device)."""

    def __init__(self, state: str):
        self.state = os.path.abspath(state)
        try:
            self.dir = StateDir.open(self.state)
        except FileNotFoundError:
            raise EdgeError("{}: no releases/ folder (deploy a release first)".format(self.state)) from None
        if not self.dir.is_dir("releases"):
            raise EdgeError("{}: no releases/ folder (deploy a release first)".format(self.state))
        self.settings = load_settings(self.dir)

    def path(self, *parts: str) -> str:
        return os.path.join(self.state, *parts)

    @contextlib.contextmanager
    def folder(self, *parts: str, make: bool = False) -> Iterator[StateDir]:
        """A checked folder of the state (releases/<name>, refused); `make`: created (0755) when missing."""
        opened: List[StateDir] = []
        try:
            at = self.dir
            for part in parts:
                if make:
                    at.make_dir(part)
                at = at.sub(part)
                opened.append(at)
            yield at
        finally:
            for folder in reversed(opened):
                folder.close()

    def link(self, name: str) -> Optional[str]:
        """The release `name` (current, previous, committed) points at; anything but releases/<name> is refused."""
        target = versions.read_link(self.path(name), LINK, dir_fd=self.dir.fd)
        return None if target is None else target[len("releases/"):]

    def set_link(self, name: str, release: Optional[str]) -> None:
        """Point `name` at releases/`release` by one rename (None: remove it): the one switch, edge.store.versions."""
        target = None if release is None else "releases/" + check_name(release)
        versions.flip(self.state, name, target=target, dir_fd=self.dir.fd)

    def release_dir(self, release: str) -> str:
        return self.path("releases", check_name(release))

    def has_release(self, release: str) -> bool:
        with self.folder("releases") as releases:
            return releases.is_dir(check_name(release))

    def gate_record(self, release: Optional[str]) -> Optional[Dict[str, Any]]:
        """GATED of `release` (None: never committed here); {} for a record without the trial it committed."""
        if not release or not self.has_release(release):
            return None
        with self.folder("releases", release) as folder:
            data = folder.read("GATED", MAX_STATE_BYTES)
        if data is None:
            return None
        try:
            rec = json.loads(data.decode("utf-8"))
        except ValueError:
            return {}  # the one-line GATED of an older edge: committed, by a trial no one can match
        return rec if isinstance(rec, dict) else {}

    def gated(self, release: Optional[str]) -> bool:
        return self.gate_record(release) is not None

    def seal(self, release: str, record: Dict[str, Any]) -> None:
        with self.folder("releases", release) as folder:
            folder.write_json("GATED", record)

    def trial(self) -> Optional[Dict[str, Any]]:
        trial = self.dir.load_json("trial.json", "trial", MAX_STATE_BYTES)
        return None if trial is None else check_trial(trial, self.path("trial.json"))

    def arm(self, trial: Dict[str, Any]) -> None:
        self.dir.write_json("trial.json", check_trial(trial, self.path("trial.json")))

    def end_trial(self) -> None:
        self.dir.unlink("trial.json")

    def refusal(self, release: str) -> Optional[Dict[str, Any]]:
        """This device's record of `release` failing or being withdrawn."""
        name = check_name(release) + ".json"
        if not self.dir.is_dir("refused"):
            return None
        with self.folder("refused") as refused:
            rec = refused.load_json(name, "rollout record", store.MAX_RECORD_BYTES)
        return None if rec is None else store.check_record(rec, self.path("refused", name))

    def refused_names(self) -> List[str]:
        if not self.dir.is_dir("refused"):
            return []
        with self.folder("refused") as refused:
            return [n[:-5] for n in refused.listdir() if n.endswith(".json") and NAME.match(n[:-5])]

    def refused(self, release: str) -> Optional[Dict[str, Any]]:
        """The device's record of `release`, else the shared store's (an unreadable store raises)."""
        return self.refusal(release) or store.read(self.settings.store, release)

    def record(self, release: str, state: str, why: str, sha: str, by: str) -> Dict[str, Any]:
        """Refuse `release` from now on, here and (a folder store) for every device."""
        rec = {"release": check_name(release), "state": state, "why": why, "sha256": sha, "at": now(), "by": by,
               "device": self.settings.device or socket.gethostname()}
        with self.folder("refused", make=True) as refused:
            refused.write_json(release + ".json", rec)
        try:
            store.write(self.settings.store, rec)
        except (EdgeError, OSError) as exc:  # the device's own record holds; the controller writes the store too
            self.audit(by, "note: rollout store not written for {}: {}".format(release, first_line(exc)))
        return rec

    def forget(self, release: str) -> None:
        if self.dir.is_dir("refused"):
            with self.folder("refused") as refused:
                refused.unlink(check_name(release) + ".json")

    def audit(self, by: str, text: str) -> None:
        """One line: when, who, what; control characters (a newline, an ESC) in any part are escaped."""
        self.dir.append("audit.log", "{} {} {}\n".format(now(), one_line(by, 200), one_line(text, 4000)))

    def systemctl(self, *args: str) -> str:
        """Its output; a failure raises EdgeError (EXIT_FAIL)."""
        proc = subprocess.run(["systemctl"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              encoding="utf-8", errors="replace", timeout=300)
        if proc.returncode != 0:
            raise EdgeError("systemctl {}: {}".format(" ".join(args), one_line((proc.stdout.strip().splitlines() or [
                "exit {}".format(proc.returncode)])[-1])), EXIT_FAIL)
        return proc.stdout

    def active_state(self, unit: str) -> str:
        """The unit's ActiveState (active, activating, deactivating, ...); "" when systemctl cannot tell."""
        try:
            shown = self.systemctl("show", unit, "--property=ActiveState")
        except (EdgeError, OSError, subprocess.TimeoutExpired):
            return ""
        return next((line[len("ActiveState="):].strip() for line in shown.splitlines()
                     if line.startswith("ActiveState=")), "")

    def digest(self, release: str) -> str:
        """sha256 of what the release is on every device: its model, its sets and its venv's name (CONTENT)."""
        h = hashlib.sha256()
        with self.folder("releases", release) as folder:
            for top in CONTENT:
                for rel in _files(folder, top):
                    h.update("{}\0".format(rel).encode())
                    with os.fdopen(_open_nested(folder, rel), "rb") as fh:
                        for chunk in iter(lambda: fh.read(1 << 20), b""):  # noqa: B023 (fh of this loop)
                            h.update(chunk)
            venv = folder.readlink("venv")
        h.update("venv\0{}".format(os.path.basename(venv) if venv else "").encode())
        return h.hexdigest()

    @contextlib.contextmanager
    def lock(self, wait_s: float) -> Iterator[bool]:
        """One changer at a time (try, settle, withdraw): the state's versions.lock (this checked path: no folder on it
        another user can write), waited for up to `wait_s`; yields False when it was not free by then."""
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(versions.lock(self.dir.path, "a release change", wait_s=wait_s))
            except versions.Busy:
                yield False
                return
            versions.sweep(self.dir.path)  # what a changer killed inside a flip or a write left
            yield True

    def prune(self, by: str) -> List[str]:
        """Remove releases (and venvs no kept release and no installed program uses) beyond current, previous,
        committed and the newest `keep`: eMMC is 16-64 GB. Records in refused/ stay. Nothing is removed through a
        link: a release is a folder of the state, a venv a folder of <prefix>/venvs checked as the state is."""
        with self.folder("releases") as releases:
            stats = {n: releases.lstat(n) for n in releases.listdir() if NAME.match(n)}
            names = sorted((n for n, st in stats.items() if st and stat.S_ISDIR(st.st_mode)),
                           key=lambda n: stats[n].st_mtime)
            keep = {self.link(n) for n in ("current", "previous", "committed")}
            keep.update(names[-self.settings.keep:] if self.settings.keep else [])
            venvs = {n: self._venv(n) for n in names}
            used = {v for n, v in venvs.items() if n in keep} | {_real(sys.prefix)}
            used.update(_real(os.path.join(os.path.dirname(os.path.dirname(v)), PROGRAM)) for v in venvs.values() if v)
            gone = [n for n in names if n not in keep]
            for name in gone:
                releases.remove_tree(name)
                venv = venvs[name]
                if venv and _real(venv) not in used and os.path.basename(os.path.dirname(venv)) == "venvs":
                    _remove_venv(venv)
        if gone:
            self.audit(by, "prune: removed {}".format(", ".join(gone)))
        return gone

    def _venv(self, release: str) -> Optional[str]:
        with self.folder("releases", release) as folder:
            target = folder.readlink("venv")
        return os.path.normpath(target) if target and os.path.isabs(target) else None


def _files(folder: StateDir, top: str) -> List[str]:
    """The paths (relative to the release) of the files under `top`, sorted; links are not listed."""
    st = folder.lstat(top)
    if st is None or stat.S_ISLNK(st.st_mode):
        return [top] if st is not None else []
    if not stat.S_ISDIR(st.st_mode):
        return [top]
    return sorted(os.path.join(parent, name) for parent, _, files, _ in
                  os.fwalk(top, dir_fd=folder.fd, follow_symlinks=False) for name in files
                  if not any((parent + "/").startswith(b + "/") for b in BUILT))


def _open_nested(folder: StateDir, rel: str) -> int:
    """A descriptor of the file `rel` under `folder`, no component followed through a link."""
    parts = rel.split("/")
    opened: List[StateDir] = []
    try:
        at = folder
        for part in parts[:-1]:
            at = at.sub(part)
            opened.append(at)
        return at.open_file(parts[-1], os.O_RDONLY)
    finally:
        for inner in opened:
            inner.close()


def _real(path: str) -> str:
    return os.path.realpath(path)


def _remove_venv(venv: str) -> None:
    try:
        with StateDir.open(os.path.dirname(venv)) as venvs:
            venvs.remove_tree(os.path.basename(venv))
    except (EdgeError, FileNotFoundError):
        pass  # a venvs folder that is not root's alone keeps what is in it


def short(sha: str) -> str:
    return "sha256 " + one_line(str(sha)[:12], 12)
