"""The three moves of a device's release (edge/fleet/releases.py holds the state): try (arm, switch, restart),
settle (bake, then commit or fall back; or leave a withdrawn release) and withdraw (the kill switch; `fail` is
the same move recording the release failed: the fleet gate's stop)."""

import os
import time
from typing import Any, Callable, Dict, NamedTuple, Optional

from edge.errors import EXIT_FAIL, EdgeError, first_line, one_line
from edge.fleet import health, store
from edge.fleet.releases import Device, check_name, now, short
from edge.fleet.statedir import refuse
from edge.sources.watch import Backoff

LOCK_WAIT_S = 60.0
JOB_STATES = ("activating", "deactivating", "reloading")  # a start, stop, restart or reload of the unit runs


class Switch(NamedTuple):
    outcome: str  # 'switched', 'baking' (already on trial) or 'current' (committed here, standing)
    armed_at: str  # the trial's (its verdict is the GATED that names it)


def metrics_url(dev: Any, release: str) -> str:
    """The daemon's /metrics as the release's config sets it (the bake reads it)."""
    from edge.config import load_config
    from edge.uri import metrics_url as metrics_endpoint

    path = os.path.join(dev.release_dir(release), "config.yaml")
    if os.path.islink(path):
        raise refuse(path, "a symbolic link")
    metrics = load_config(path).service.metrics
    if not metrics.enabled:
        raise EdgeError("release {}: service.metrics.enabled is false; the bake reads the daemon's metrics".format(
            release))
    return metrics_endpoint(metrics.host, metrics.port, local_client=True)


def refusal_line(release: str, rec: Dict[str, Any], sha: str, local: bool) -> str:
    """The one line a refused release is answered with; the record's text is escaped (it may come from anywhere)."""
    other = "" if not local or rec.get("sha256") in (None, "", sha) else "; the files given now differ ({}): a " \
        "new release needs a new name".format(short(sha))
    return "release {} {} ({}, {} by {}, {}){}; retry explicitly: edge release try {} --retry " \
        "(deploy/ansible: -e jetson_edge_retry={})".format(
            release, one_line(str(rec.get("state", "refused")), 20), one_line(str(rec.get("why", "")), 200),
            one_line(str(rec.get("at", "?")), 40), one_line(str(rec.get("by", "?")), 80),
            short(str(rec.get("sha256", ""))), other, release, release)


def check(dev: Device, release: str, retry: bool) -> str:
    """Raise EdgeError when `release` may not be installed here (refused, no retry); returns its sha256."""
    check_name(release)
    if not dev.has_release(release):
        raise EdgeError("{}: no such release (config.yaml missing)".format(dev.release_dir(release)))
    sha = dev.digest(release)
    local = None if retry else dev.refusal(release)
    rec = None if retry else local or store.read(dev.settings.store, release)
    if rec:
        raise EdgeError(refusal_line(release, rec, sha, local is not None))
    return sha


def try_release(dev: Device, release: str, *, retry: bool, by: str) -> Switch:
    """Arm the fallback, switch `current` to `release` and restart the service; the bake runs in the settle unit."""
    with dev.lock(LOCK_WAIT_S) as locked:
        if not locked:
            raise EdgeError("{}: another release change holds the lock".format(dev.state), EXIT_FAIL)
        trial = dev.trial()
        if trial and trial["release"] != release:
            raise EdgeError("release {} is on trial here; wait for its verdict".format(trial["release"]), EXIT_FAIL)
        sha = check(dev, release, retry)
        metrics_url(dev, release)
        running = dev.link("current")
        if trial:
            dev.systemctl("start", "--no-block", dev.settings.settle_unit)
            return Switch("baking", trial.get("armed_at", ""))
        if running == release and dev.gated(release) and dev.refusal(release) is None:
            return Switch("current", "")
        supersedes = _record_key(_store_record(dev, release)) if retry else None
        if retry:
            dev.forget(release)
        fallback = running if running != release else dev.link("previous")
        armed = {"release": release, "fallback": fallback, "sha256": sha, "armed_at": now(), "by": by,
                 "retry": retry, "supersedes": supersedes}
        dev.arm(armed)  # armed before anything changes
        if running and running != release:
            dev.set_link("previous", running)
        dev.audit(by, "switch: {} -> {} (rollout, {}, on trial)".format(running or "nothing", release, short(sha)))
        dev.set_link("current", release)
        # the settle unit is queued before the restart: it waits for this lock, so whatever happens to this
        # command from here on (a dropped connection kills it), the device finishes the trial by itself
        dev.systemctl("start", "--no-block", dev.settings.settle_unit)
        dev.systemctl("restart", dev.settings.service)
        return Switch("switched", armed["armed_at"])


def _store_record(dev: Device, release: str) -> Optional[Dict[str, Any]]:
    try:
        return store.read(dev.settings.store, release)
    except (EdgeError, OSError):
        return None


def _record_key(rec: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What tells one record from a later one (a retry supersedes the record it was given, not a newer one)."""
    return {k: rec.get(k) for k in ("state", "at", "by", "why")} if rec else None


def verdict(dev: Device, release: str, armed_at: str = "") -> str:
    """Where the trial of `release` stands here: 'baking' while it is armed, then 'committed' (the GATED of the trial
    armed at `armed_at`, any when empty), 'failed' or 'withdrawn' (its record), or 'none' (never committed here)."""
    trial = dev.trial()
    if trial is not None and trial["release"] == check_name(release):
        return "baking"
    rec = dev.refusal(release)
    if rec:
        return str(rec["state"])
    gate = dev.gate_record(release)
    return "committed" if gate is not None and (not armed_at or gate.get("armed_at") == armed_at) else "none"


def wait(dev: Device, release: str, armed_at: str, timeout_s: float) -> Optional[bool]:
    """The verdict on the trial of `release` armed at `armed_at` once it ended: True committed, False failed;
    None: still baking."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = verdict(dev, release, armed_at)
        if state != "baking":
            return bool(armed_at) and state == "committed"
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def settle(dev: Device, by: str) -> str:
    """What the settle unit and its timer run: finish a trial, or leave a withdrawn or failed release."""
    with dev.lock(dev.settings.start_timeout_s + LOCK_WAIT_S) as locked:  # a switch in progress: after it
        if not locked:
            return "busy"
        trial = dev.trial()
        if trial:
            return _settle_trial(dev, trial, by)
        return _leave_refused(dev, by) or _reconcile(dev, by)


def _settle_trial(dev: Device, trial: Dict[str, Any], by: str) -> str:
    """The device's verdict (`by`: the settle unit) on the release `trial` armed."""
    release = trial["release"]
    if dev.link("current") != release:  # a cut between arming and switching, or inside a fallback
        dev.end_trial()
        dev.systemctl("restart", dev.settings.service)
        return "trial of {} dropped: {} is current".format(release, dev.link("current"))
    gate = dev.gate_record(release) or {}
    if trial.get("armed_at") and gate.get("armed_at") == trial["armed_at"]:  # a cut inside this trial's commit
        return _commit(dev, trial, "committed before", by)
    _serve_current(dev, by)  # a cut between the switch and its restart: the bake must see the release
    s = dev.settings
    aborted: Dict[str, Any] = {}
    try:
        verdict = health.bake(metrics_url(dev, release), release, bake_s=s.bake_s,
                              start_timeout_s=s.start_timeout_s, max_miss_ratio=s.max_miss_ratio,
                              interval_s=s.interval_s, abort=lambda: _superseded(dev, trial, aborted))
    except Exception as exc:  # whatever stops the bake fails the release: the trial never stays armed
        verdict = health.Verdict(False, "the bake could not run: {}".format(first_line(exc)))
    if verdict.ok:
        return _commit(dev, trial, verdict.why, by)
    if verdict.ok is None:  # the daemon's metrics were busy (503): not the release's fault
        dev.audit(by, "bake: {} inconclusive ({}); on trial until the timer bakes it again".format(release,
                                                                                                verdict.why))
        return "{} still on trial: {}".format(release, verdict.why)
    state = aborted.get("state", "withdrawn") if verdict.aborted else "failed"
    return fall_back(dev, release, trial.get("fallback"), state, verdict.why, trial.get("sha256", ""), by)


def _superseded(dev: Device, trial: Dict[str, Any], seen: Dict[str, Any]) -> Optional[str]:
    """A reason to stop the bake: a record of the release newer than the one this trial's retry supersedes."""
    try:
        rec = dev.refused(trial["release"])
    except (EdgeError, OSError):  # an unreachable store does not end a bake
        return None
    if not rec or _record_key(rec) == trial.get("supersedes"):
        return None
    seen.update(rec)
    return str(rec.get("why") or rec.get("state"))


def _commit(dev: Device, trial: Dict[str, Any], summary: str, by: str) -> str:
    release, sha = trial["release"], trial.get("sha256", "")
    dev.seal(release, {"release": release, "sha256": sha, "armed_at": trial.get("armed_at", ""), "at": now(),
                       "summary": summary})
    dev.set_link("committed", release)
    if trial.get("retry"):
        store.clear(dev.settings.store, release)  # the explicit retry's bake passed: every device may install it
    dev.end_trial()
    dev.audit(by, "commit: {} ({}, {})".format(release, summary, short(sha)))
    dev.prune(by)
    return "committed {}".format(release)


def fall_back(dev: Device, release: str, to: Optional[str], state: str, why: str, sha: str, by: str) -> str:
    """Record `release` as failed or withdrawn, then serve `to` (or the previous release) if it passed here."""
    dev.record(release, state, why, sha, by)  # first: a cut after this never returns to it
    target = to if to and to != release and dev.gated(to) and not dev.refusal(to) else None
    trial = dev.trial()
    if dev.link("committed") == release:  # the settle unit and the next fallback never take it for good
        dev.set_link("committed", target)
    if target is None:
        dev.audit(by, "{}: {} ({}, {}); no release that passed here to go back to: stays on {}".format(
            state, release, why, short(sha), release))
    else:
        dev.set_link("current", target)
        dev.set_link("previous", None)  # a second fallback must not return to the release just left
        dev.audit(by, "{}: {} ({}, {}), back on {}".format(state, release, why, short(sha), target))
        dev.systemctl("restart", dev.settings.service)
    if trial and trial["release"] == release:
        dev.end_trial()
    return "{} {}{}".format(state, release, ", back on " + target if target else "")


def _leave_refused(dev: Device, by: str) -> Optional[str]:
    """Fall back from a current release that failed or was withdrawn (here, or in the store while offline)."""
    running = dev.link("current")
    if not running:
        return "nothing installed"
    try:
        rec = dev.refused(running)
    except (EdgeError, OSError) as exc:
        return "rollout store unreadable ({}); stays on {}".format(first_line(exc), running)
    if not rec:
        return None
    return fall_back(dev, running, dev.link("previous"), rec.get("state", "withdrawn"), rec.get("why", ""),
                     dev.digest(running), by)


def job_in_flight(active_state: str, *, waited_s: float, limit_s: float) -> bool:
    """Policy (no clock, no I/O): whether to wait before judging which release the daemon serves. While a job of the
    service runs, the old daemon may still answer for the release it leaves (a `try` killed inside its restart frees
    the lock before the restart ends); waited for `limit_s` at most."""
    return active_state in JOB_STATES and waited_s < limit_s


def await_jobs(state: Callable[[], str], *, limit_s: float, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> str:
    """The unit's ActiveState (`state()`) once no job of it runs, or as it is after `limit_s`."""
    backoff = Backoff(0.1, 2.0)
    start = clock()
    while True:
        seen = state()
        waited = clock() - start
        if not job_in_flight(seen, waited_s=waited, limit_s=limit_s):
            return seen
        sleep(min(backoff.next(), limit_s - waited))


def _serve_current(dev: Device, by: str) -> bool:
    """Restart a daemon that answers for another release than `current` (True when it did), once the restart in
    flight, if any, ended."""
    running = dev.link("current") or ""
    await_jobs(lambda: dev.active_state(dev.settings.service), limit_s=dev.settings.start_timeout_s)
    try:
        served = health.scrape(metrics_url(dev, running))
    except EdgeError:  # no metrics to read: nothing to compare
        served = None
    if served is None or served.release == running:
        return False
    dev.audit(by, "restart: the service ran {}, current is {}".format(served.release or "?", running))
    dev.systemctl("restart", dev.settings.service)
    return True


def _reconcile(dev: Device, by: str) -> str:
    """The daemon serves `current` (a switch cut between its rename and its restart is finished here)."""
    running = dev.link("current") or ""
    return "restarted on {}".format(running) if _serve_current(dev, by) else "{} stays".format(running)


def withdraw(dev: Device, release: str, *, why: str, by: str, state: str = "withdrawn") -> str:
    """The kill switch on this device: record `release` withdrawn (`state` failed: the fleet gate's stop), here
    and in the store, then leave it."""
    check_name(release)
    sha = dev.digest(release) if dev.has_release(release) else ""
    dev.record(release, state, why, sha, by)  # a bake of it in progress sees this and falls back
    s = dev.settings
    with dev.lock(s.start_timeout_s + s.bake_s + LOCK_WAIT_S) as locked:
        if not locked:
            raise EdgeError("{}: another release change holds the lock".format(dev.state), EXIT_FAIL)
        trial = dev.trial()
        if dev.link("current") != release:
            if trial and trial["release"] == release:
                dev.end_trial()
            if state == "failed":
                dev.audit(by, "failed: {} ({}, {}), stays on {}".format(release, why, short(sha),
                                                                       dev.link("current") or "nothing"))
            return "{} {}: not running here".format(state, release)
        to = trial.get("fallback") if trial and trial["release"] == release else dev.link("previous")
        return fall_back(dev, release, to, state, why, sha, by)


def fail(dev: Device, release: str, *, why: str, by: str) -> str:
    """Record a release failed (its build, its kernel, the fleet gate): refused from now on, and left here."""
    return withdraw(dev, release, why=why, by=by, state="failed")
