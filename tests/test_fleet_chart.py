"""deploy/helm/jetson-edge with the real tools, offline: Helm 4 (helm-python-sdk) lint and render with the values
schema, kubernetes-validate against 1.33 for six value sets, edge's own config loader and promtool on the
rendered configs, and the rendered probe commands run against a real `edge run` whose camera is down."""

import os
import shutil
import signal
import subprocess
import sys

import pytest
import service_helpers as sh
import yaml

from edge.config import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(REPO, "deploy", "helm", "jetson-edge")
URL = "https://prometheus.example.com/api/v1/write"
BASE = {"agent": {"remoteWrite": {"url": URL}}}

VALUE_SETS = {
    "defaults": BASE,
    "metrics-off": {"metrics": {"enabled": False}},
    "privileged-usb": dict(BASE, devices={"mode": "privileged"}, config={"source": "/dev/video0"}),
    "plugin-usb-secret-source": dict(BASE, devices={"mode": "plugin", "pluginResources": {"squat.ai/video": 1}},
                                     config={"source": "/dev/video0", "sourceSecret": {"name": "cam", "key": "uri"}}),
    "shared-cache-basic-auth": {"agent": {"remoteWrite": {"url": URL, "basicAuth": {
        "username": "fleet", "passwordSecret": {"name": "rw", "key": "pw"}}}},
        "engineCache": {"hostPath": "/data/engines", "shared": "/mnt/engines"}, "release": "0.2.0-model7"},
    "agent3-no-sockets-wave": {"agent": {"remoteWrite": {"url": URL}, "image": {"tag": "v3.5.0"}},
                               "argusSocket": False, "jtopSocket": False, "maxUnavailable": "20%",
                               "nodeSelector": {"jetson-edge/enabled": "true", "jetson-edge/wave": "2"},
                               "engineCache": {"hostPath": "/var/lib/jetson-edge/engines",
                                               "shared": "http://cache.local/engines"}},
}


@pytest.fixture(scope="module")
def helm():
    if sys.version_info < (3, 10):
        pytest.skip("helm-python-sdk needs Python >= 3.10")
    return pytest.importorskip("helm_python", reason="helm-python-sdk not installed (pip install -e '.[fleet]')")


def render(helm, values):
    return helm.Chart.load(CHART).render(values, name="edge", namespace="edge")


def docs(rendered, kind):
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d and d["kind"] == kind]


def pod(rendered):
    ds, = docs(rendered, "DaemonSet")
    return ds["spec"]["template"]["spec"]


def configmap(rendered, suffix):
    return [c for c in docs(rendered, "ConfigMap") if c["metadata"]["name"] == "edge-" + suffix][0]["data"]


def test_chart_lints_strictly_for_kubernetes_1_33(helm):
    report = helm.lint(CHART, BASE, strict=True, kube_version="v1.33.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


@pytest.mark.parametrize("values, problem", [
    ({"privilegd": True}, "privilegd"),  # a typo is refused, not ignored
    ({"config": {"budgetMs": "30\n      frames: 5"}}, "budgetMs"),
    ({"config": {"metricsPort": "9108'); import os; os.system('id"}}, "metricsPort"),
    ({"config": {"width": "1280\n  uri: rtsp://evil"}}, "width"),
    ({"devices": {"mode": "hostpath"}}, "mode"),
    ({"config": {"source": "rtsp://cam/s\nruntime:\n  frames: 5"}}, "source"),
    ({"agent": {"remoteWrite": {"url": URL, "extra": {"basic_auth": {"password": "inline"}}}}}, "extra"),
])
def test_the_schema_refuses_typos_wrong_types_and_inline_secrets(helm, values, problem):
    merged = dict(BASE, **values) if "agent" not in values else values
    with pytest.raises(helm.HelmError, match=problem):
        render(helm, merged)


def test_chart_refuses_to_render_metrics_without_a_remote_write_url(helm):
    with pytest.raises(helm.HelmError, match="agent.remoteWrite.url is required"):
        render(helm, {})
    assert "edge-agent" not in str(render(helm, VALUE_SETS["metrics-off"]))


def test_six_value_sets_validate_against_kubernetes_1_33(helm, tmp_path):
    validate = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    if not os.path.exists(validate):
        pytest.skip("kubernetes-validate not installed (pip install -e '.[fleet]')")
    for name, values in VALUE_SETS.items():
        out = tmp_path / (name + ".yaml")
        out.write_text("\n---\n".join(render(helm, values).values()))
        proc = subprocess.run([validate, "-k", "1.33.0", "--strict", str(out)], capture_output=True, text=True)
        assert proc.returncode == 0, name + ": " + proc.stdout + proc.stderr
        assert "passed for resource daemonset/edge" in proc.stdout, name


def test_string_values_stay_values(helm):
    """Quoting: a string with newlines and YAML syntax lands in its field, adds no key."""
    hostile = 'rtsp://cam.local/s?a=1 # {{ .Release.Name }} "x": [y], runtime: {frames: 5}\''
    data = configmap(render(helm, dict(BASE, config={"source": hostile})), "config")
    cfg = yaml.safe_load(data["config.yaml"])
    assert cfg["source"]["uri"] == hostile and cfg["runtime"] == {"budget_ms": 30}
    assert sorted(cfg) == ["backend", "build", "model", "runtime", "service", "source"]


def test_rendered_config_is_accepted_by_edge(helm, tmp_path):
    data = configmap(render(helm, dict(BASE, config={"source": "rtsp://cam.local/s", "budgetMs": 25,
                                                      "precision": "fp16"})), "config")
    (tmp_path / "config.yaml").write_text(data["config.yaml"])
    cfg = load_config(str(tmp_path / "config.yaml"))
    assert cfg.source.uri == "rtsp://cam.local/s" and cfg.runtime.budget_ms == 25
    assert cfg.model.path == "/var/lib/jetson-edge/engines/mobilenet_v3_large.fp16.engine"
    assert cfg.build.engines_dir == "/var/lib/jetson-edge/engines" and cfg.service.metrics.host == "127.0.0.1"


def test_pod_security_devices_and_socket_folders(helm):
    spec = pod(render(helm, BASE))
    edge = spec["containers"][0]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert edge["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                       "readOnlyRootFilesystem": True}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["host-tmp"]["hostPath"] == {"path": "/tmp", "type": "Directory"}  # folders, never Socket
    assert volumes["host-run"]["hostPath"] == {"path": "/run", "type": "Directory"}
    assert all(v.get("hostPath", {}).get("type") not in ("Socket", "CharDevice") for v in spec["volumes"])
    assert volumes["agent-wal"]["hostPath"]["path"] == "/var/lib/jetson-edge/agent-wal"  # not an emptyDir
    privileged = pod(render(helm, VALUE_SETS["privileged-usb"]))["containers"][0]["securityContext"]
    assert privileged["privileged"] is True
    plugin = pod(render(helm, VALUE_SETS["plugin-usb-secret-source"]))["containers"][0]
    assert plugin["resources"]["limits"]["squat.ai/video"] == 1
    ds, = docs(render(helm, BASE), "DaemonSet")
    assert ds["spec"]["minReadySeconds"] == 60


def test_secrets_come_from_secrets_and_the_agent_config_is_out_of_the_checksum(helm, tmp_path):
    rendered = render(helm, VALUE_SETS["shared-cache-basic-auth"])
    spec = pod(rendered)
    agent = yaml.safe_load(configmap(rendered, "agent")["agent.yml"])
    assert agent["remote_write"][0]["basic_auth"] == {
        "username": "fleet", "password_file": "/etc/prometheus-agent-secrets/password"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["agent-secrets"]["secret"]["secretName"] == "rw"
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][1]["volumeMounts"]}
    assert mounts["agent-secrets"] == "/etc/prometheus-agent-secrets"
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["EDGE_RELEASE"]["value"] == "0.2.0-model7" and env["EDGE_ENGINE_CACHE"]["value"] == "/mnt/engines"
    source = pod(render(helm, VALUE_SETS["plugin-usb-secret-source"]))["containers"][0]["env"]
    assert {"name": "EDGE_SOURCE_URI", "valueFrom": {"secretKeyRef": {"name": "cam", "key": "uri"}}} in source
    def checksum(rendered):
        return docs(rendered, "DaemonSet")[0]["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    other_agent = render(helm, {"agent": {"remoteWrite": {"url": URL + "2"}, "scrapeInterval": "30s"}})
    assert checksum(other_agent) == checksum(render(helm, BASE))  # an agent change does not restart inference
    assert checksum(render(helm, dict(BASE, config={"budgetMs": 25}))) != checksum(render(helm, BASE))
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    (tmp_path / "agent.yml").write_text(configmap(rendered, "agent")["agent.yml"])
    proc = subprocess.run([promtool, "check", "config", "--agent", str(tmp_path / "agent.yml")], capture_output=True,
                          text=True, env=dict(os.environ, NODE_NAME="jetson-01"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_liveness_survives_a_camera_outage_and_readiness_does_not(helm, tmp_path, small_model):
    """The rendered probe commands, run as kubelet would (exec in the pod), against a real `edge run` whose RTSP
    camera is down: the daemon keeps reconnecting, so it is alive but not ready."""
    port = sh.free_port()
    spec = pod(render(helm, dict(BASE, config={"metricsPort": port})))
    edge = spec["containers"][0]
    assert edge["startupProbe"]["timeoutSeconds"] >= 2
    config = sh.write_config(tmp_path / "edge.yaml", {
        "model": {"path": small_model}, "source": {"uri": "rtsp://127.0.0.1:{}/down".format(sh.free_port()),
                                                   "timeout_s": 2},
        "backend": {"kind": "onnxruntime"}, "preprocess": {"device": "cpu"},
        "service": {"metrics": {"enabled": True, "host": "127.0.0.1", "port": port},
                    "telemetry": {"enabled": False}}})
    def run(probe):
        return subprocess.run(edge[probe]["exec"]["command"], capture_output=True, timeout=10)

    with open(str(tmp_path / "daemon.log"), "w") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "edge", "run", "--config", str(config)], cwd=REPO,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        assert sh.wait_until(lambda: run("livenessProbe").returncode == 0, timeout=60, interval=0.5), \
            (tmp_path / "daemon.log").read_text()[-2000:]
        assert "source_" in (tmp_path / "daemon.log").read_text()  # the camera is down: faults, reconnects
        assert run("startupProbe").returncode == 0
        assert run("readinessProbe").returncode != 0  # no frame: not ready, still alive
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    assert run("livenessProbe").returncode != 0  # a dead process is not alive


def test_the_ansible_agent_ships_the_charts_agent_config(helm, tmp_path):
    """The systemd fleet's agent (deploy/ansible role template) and the chart's sidecar get one config: the same
    scrape, the device label from NODE_NAME (the unit sets it to the inventory name) and the password file."""
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    if not os.path.exists(playbook):
        pytest.skip("ansible-core not installed (pip install -e '.[fleet]')")
    role = os.path.join(REPO, "deploy", "ansible", "roles", "jetson_edge")
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{
        "ansible.builtin.template": {"src": os.path.join(role, "templates", name + ".j2"),
                                     "dest": str(tmp_path / name), "mode": "0644"},
        } for name in ("agent.yml", "jetson-edge-agent.service")],
        "vars": {"jetson_edge_agent_remote_write_url": URL, "jetson_edge_agent_username": "fleet",
                 "jetson_edge_agent_password_file": "/etc/prometheus-agent-secrets/password",
                 "jetson_edge_agent_scrape_interval": "15s", "jetson_edge_metrics_port": 9108,
                 "jetson_edge_agent_binary": "/opt/prometheus-agent/prometheus",
                 "jetson_edge_agent_version": "2.53.4"}}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    proc = subprocess.run([playbook, "-c", "local", "-i", "localhost,", "-e",
                           "ansible_python_interpreter=" + sys.executable, str(tmp_path / "play.yml")],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                          env=dict(os.environ, ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp")))
    assert proc.returncode == 0, proc.stdout[-3000:]
    chart = configmap(render(helm, VALUE_SETS["shared-cache-basic-auth"]), "agent")["agent.yml"]
    assert yaml.safe_load((tmp_path / "agent.yml").read_text()) == yaml.safe_load(chart)
    unit = (tmp_path / "jetson-edge-agent.service").read_text()
    assert "Environment=NODE_NAME=localhost\n" in unit and "--enable-feature=agent,expand-external-labels" in unit
