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
    "gated-per-board-type": dict(
        BASE, engineCache={"hostPath": "/var/lib/jetson-edge/engines", "shared": "/mnt/engines"},
        gate={"boardTypes": [{"name": "orin-nano", "nodeSelector": {"jetson/board": "orin-nano"}},
                             {"name": "xavier-nx", "nodeSelector": {"jetson/board": "xavier-nx"}}]}),
    "agent3-no-sockets-wave": {"agent": {"remoteWrite": {"url": URL}, "image": {"tag": "v3.5.0"}},
                               "priorityClass": {"create": False, "name": "edge-critical", "value": 0},
                               "argusSocket": False, "jtopSocket": False, "maxUnavailable": "20%",
                               "nodeSelector": {"jetson-edge/enabled": "true", "jetson-edge/wave": "2"},
                               "engineCache": {"hostPath": "/var/lib/jetson-edge/engines",
                                               "shared": "https://cache.local/engines"}},
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
    # inline secrets, in every place remote_write takes one
    ({"agent": {"remoteWrite": {"url": URL, "extra": {"headers": {"Authorization": "Bearer x"}}}}}, "Authorization"),
    ({"agent": {"remoteWrite": {"url": URL, "extra": {"bearer_token": "x"}}}}, "extra"),
    ({"agent": {"remoteWrite": {"url": URL, "extra": {"tls_config": {"key": "-----BEGIN"}}}}}, "extra"),
    ({"agent": {"remoteWrite": {"url": "https://fleet:S3cret@prometheus.example.com/api/v1/write"}}}, "url"),
    ({"engineCache": {"hostPath": "/var/lib/jetson-edge/engines", "shared": "https://u:pw@cache.local/e"}}, "shared"),
    ({"engineCache": {"hostPath": "/var/lib/jetson-edge/engines", "shared": "http://cache.local/e"}}, "shared"),
    # host folders: never a system folder, never .. (the chart hands its folder to the pod's user)
    ({"engineCache": {"hostPath": "/"}}, "hostPath"),
    ({"engineCache": {"hostPath": "/etc"}}, "hostPath"),
    ({"engineCache": {"hostPath": "/var/lib/../../etc"}}, "hostPath"),
    ({"engineCache": {"hostPath": "/var/lib"}}, "hostPath"),
    ({"agent": {"remoteWrite": {"url": URL}, "walHostPath": "/"}}, "walHostPath"),
    ({"supplementalGroups": [44, 0]}, "supplementalGroups"),
    ({"supplementalGroups": [27]}, "supplementalGroups"),
    # the config's own ranges (edge/config.py), so a value the daemon refuses never renders into a crash loop
    ({"config": {"fps": 1e308}}, "fps"),
    ({"config": {"budgetMs": 0.0001}}, "budgetMs"),
    ({"gate": {"boardTypes": [{"name": "Orin Nano", "nodeSelector": {"a": "b"}}]}}, "name"),
    # issue 43: no limits, every pod at once, kubelet's own folders, a camera password in the ConfigMap
    # (`limits: {}` keeps the defaults: Helm merges maps; null removes them)
    ({"resources": {"requests": {"cpu": "500m"}, "limits": None}}, "limits"),
    ({"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "4", "memory": None}}}, "memory"),
    ({"resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "4", "memory": "2Gi"}}},
     "memory"),  # the memory request is the limit, not a value of its own
    ({"maxUnavailable": "100%"}, "maxUnavailable"),
    ({"maxUnavailable": "51%"}, "maxUnavailable"),
    ({"engineCache": {"hostPath": "/var/lib/kubelet"}}, "hostPath"),
    ({"engineCache": {"hostPath": "/var/lib/kubelet/pods"}}, "hostPath"),
    ({"engineCache": {"hostPath": "/var/lib/rancher/k3s/storage"}}, "hostPath"),
    ({"agent": {"remoteWrite": {"url": URL}, "walHostPath": "/var/lib/containerd/wal"}}, "walHostPath"),
    ({"config": {"source": "rtsp://admin:S3cret@cam.local/stream"}}, "source"),
    ({"config": {"source": "rtsp://token@cam.local/stream"}}, "source"),
    ({"priorityClass": {"create": True, "name": "", "value": 2000000000}}, "priorityClass/value"),
])
def test_the_schema_refuses_typos_wrong_types_and_inline_secrets(helm, values, problem):
    merged = dict(BASE, **values) if "agent" not in values else values
    with pytest.raises(helm.HelmError, match=problem):
        render(helm, merged)


def test_chart_refuses_to_render_metrics_without_a_remote_write_url(helm):
    with pytest.raises(helm.HelmError, match="agent.remoteWrite.url is required"):
        render(helm, {})
    assert "edge-agent" not in str(render(helm, VALUE_SETS["metrics-off"]))


def test_every_value_set_validates_against_kubernetes_1_33(helm, tmp_path):
    validate = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    if not os.path.exists(validate):
        pytest.skip("kubernetes-validate not installed (pip install -e '.[fleet]')")
    for name, values in VALUE_SETS.items():
        out = tmp_path / (name + ".yaml")
        out.write_text("\n---\n".join(render(helm, values).values()), encoding="utf-8")
        proc = subprocess.run([validate, "-k", "1.33.0", "--strict", str(out)], capture_output=True,
                              encoding="utf-8", errors="replace")
        assert proc.returncode == 0, name + ": " + proc.stdout + proc.stderr
        assert "passed for resource daemonset/edge" in proc.stdout, name
        if "gate" in values:
            assert "passed for resource job/edge-gate-xavier-nx" in proc.stdout


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
    (tmp_path / "config.yaml").write_text(data["config.yaml"], encoding="utf-8")
    cfg = load_config(str(tmp_path / "config.yaml"))
    assert cfg.source.uri == "rtsp://cam.local/s" and cfg.runtime.budget_ms == 25
    assert cfg.model.path == "/var/lib/jetson-edge/engines/mobilenet_v3_large.fp16.engine"
    assert cfg.build.engines_dir == "/var/lib/jetson-edge/engines" and cfg.service.metrics.host == "127.0.0.1"


def test_pod_security_devices_and_socket_folders(helm):
    spec = pod(render(helm, BASE))
    edge = spec["containers"][0]
    assert spec["automountServiceAccountToken"] is False
    # no login user of the host (JetPack's first user is 1000, whose sockets live under the mounted /run and /tmp)
    assert spec["securityContext"]["runAsUser"] == spec["securityContext"]["runAsGroup"] == 10001
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
    (tmp_path / "agent.yml").write_text(configmap(rendered, "agent")["agent.yml"], encoding="utf-8")
    proc = subprocess.run([promtool, "check", "config", "--agent", str(tmp_path / "agent.yml")], capture_output=True,
                          encoding="utf-8", errors="replace", env=dict(os.environ, NODE_NAME="jetson-01"))
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

    with open(str(tmp_path / "daemon.log"), "w", encoding="utf-8") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "edge", "run", "--config", str(config)], cwd=REPO,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        assert sh.wait_until(lambda: run("livenessProbe").returncode == 0, timeout=60, interval=0.5), \
            (tmp_path / "daemon.log").read_text(encoding="utf-8")[-2000:]
        # the camera is down: faults, reconnects
        assert "source_" in (tmp_path / "daemon.log").read_text(encoding="utf-8")
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
                 "jetson_edge_agent_binary": "/opt/prometheus-agent/2.53.4/prometheus",
                 "jetson_edge_agent_version": "2.53.4"}}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play), encoding="utf-8")
    proc = subprocess.run([playbook, "-c", "local", "-i", "localhost,", "-e",
                           "ansible_python_interpreter=" + sys.executable, str(tmp_path / "play.yml")],
                          capture_output=True, encoding="utf-8", errors="replace", timeout=300, cwd=str(tmp_path),
                          env=sh.ansible_env(tmp_path / "tmp"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    chart = configmap(render(helm, VALUE_SETS["shared-cache-basic-auth"]), "agent")["agent.yml"]
    ours = yaml.safe_load((tmp_path / "agent.yml").read_text(encoding="utf-8"))
    # the systemd agent reads its password from its credentials (DynamicUser= cannot read a root-only file)
    assert ours["remote_write"][0]["basic_auth"].pop("password_file") == \
        "/run/credentials/jetson-edge-agent.service/password"
    theirs = yaml.safe_load(chart)
    theirs["remote_write"][0]["basic_auth"].pop("password_file")
    assert ours == theirs
    unit = (tmp_path / "jetson-edge-agent.service").read_text(encoding="utf-8")
    assert "Environment=NODE_NAME=localhost\n" in unit and "--enable-feature=agent,expand-external-labels" in unit
    assert "LoadCredential=password:/etc/prometheus-agent-secrets/password\n" in unit
    assert "ExecStart=/opt/prometheus-agent/2.53.4/prometheus " in unit  # a version's own binary


def test_the_init_container_hands_over_only_a_folder_the_chart_created(helm, tmp_path):
    """The rendered init command, run as root on real folders: an empty root-owned folder (what kubelet creates for
    DirectoryOrCreate) goes to the pod's user; a folder with content, or someone else's, is refused untouched."""
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    init, = pod(render(helm, BASE))["initContainers"]
    script = init["command"][2]
    assert init["command"][4:] == ["/host/engines:10001:10001", "/host/wal:65534:65534"]
    fresh, etc, ours = tmp_path / "fresh", tmp_path / "etc", tmp_path / "ours"
    for folder in (fresh, etc, ours):
        folder.mkdir()
    (etc / "passwd").write_text("root:x:0:0::/root:/bin/sh\n", encoding="utf-8")
    os.chown(str(ours), 10001, 10001)

    def run(*specs):
        return subprocess.run(["sh", "-c", script, "own"] + list(specs), capture_output=True,
                              encoding="utf-8", errors="replace", timeout=30)

    assert run("{}:10001:10001".format(fresh), "{}:10001:10001".format(ours)).returncode == 0
    assert (os.stat(str(fresh)).st_uid, os.stat(str(fresh)).st_gid) == (10001, 10001)
    refused = run("{}:10001:10001".format(etc))
    assert refused.returncode == 1 and "not created by this chart" in refused.stderr
    assert os.stat(str(etc)).st_uid == 0


def test_the_gate_is_a_job_per_board_type_before_the_daemonset_moves(helm):
    rendered = render(helm, VALUE_SETS["gated-per-board-type"])
    jobs = docs(rendered, "Job")
    assert [j["metadata"]["name"] for j in jobs] == ["edge-gate-orin-nano", "edge-gate-xavier-nx"]
    for job in jobs:
        assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert job["spec"]["backoffLimit"] == 0
        spec = job["spec"]["template"]["spec"]
        assert spec["containers"][0]["args"] == ["gate"] and spec["securityContext"]["runAsUser"] == 10001
        # a gate node: labelled (no DaemonSet pod there), tainted or cordoned (nothing else there)
        assert spec["nodeSelector"]["jetson-edge/gate"] == "true"
        assert {"key": "jetson-edge/gate", "operator": "Exists"} in spec["tolerations"]
        assert {"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                "effect": "NoSchedule"} in spec["tolerations"]
    assert jobs[1]["spec"]["template"]["spec"]["nodeSelector"] == {"jetson/board": "xavier-nx",
                                                                   "jetson-edge/gate": "true"}
    gate_config, = [c for c in docs(rendered, "ConfigMap") if c["metadata"]["name"] == "edge-gate-config"]
    assert gate_config["metadata"]["annotations"]["helm.sh/hook-weight"] == "-1"  # before the Jobs that read it
    assert gate_config["data"] == configmap(rendered, "config")  # the config the pods will run
    env = {e["name"]: e.get("value") for e in pod(rendered)["containers"][0]["env"]}
    assert env["EDGE_FETCH_ONLY"] == "1"  # the DaemonSet never builds
    assert "EDGE_FETCH_ONLY" not in str(pod(render(helm, BASE)))
    with pytest.raises(helm.HelmError, match="gate.boardTypes needs engineCache.shared"):
        render(helm, dict(VALUE_SETS["gated-per-board-type"], engineCache={"hostPath": "/var/lib/jetson-edge/e",
                                                                           "shared": "https://cache.local/e"}))


def test_an_agent_config_change_is_applied_without_a_pod_restart(helm):
    spec = pod(render(helm, BASE))
    agent, reloader = spec["containers"][1], spec["containers"][2]
    assert "--web.enable-lifecycle" in agent["args"]
    assert reloader["args"][:2] == ["--watched-dir=/etc/prometheus-agent",
                                    "--reload-url=http://127.0.0.1:9090/-/reload"]
    assert {"name": "agent-config", "mountPath": "/etc/prometheus-agent", "readOnly": True} in reloader["volumeMounts"]


def node_terms(spec):
    return [{e["key"]: (e["operator"], e["values"]) for e in term["matchExpressions"]} for term in
            spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]]


def test_pods_run_only_on_listed_board_types_never_on_a_gate_node(helm):
    not_gate = {"jetson-edge/gate": ("NotIn", ["true"])}
    assert node_terms(pod(render(helm, BASE))) == [not_gate]
    gated = pod(render(helm, VALUE_SETS["gated-per-board-type"]))
    assert node_terms(gated) == [dict(not_gate, **{"jetson/board": ("In", ["orin-nano"])}),
                                 dict(not_gate, **{"jetson/board": ("In", ["xavier-nx"])})]
    assert gated["nodeSelector"] == {"jetson-edge/enabled": "true"}
    assert "jetson-edge/gate" not in str(gated.get("tolerations"))


def test_memory_requested_as_limited_and_a_priority_class(helm):
    """Every container asks for the memory it may use (never evicted for using more than it asked), and the pods
    outrank batch work: the chart's PriorityClass, an existing one by name, or none."""
    rendered = render(helm, dict(BASE, devices={"mode": "plugin", "pluginResources": {"squat.ai/video": 1}}))
    spec = pod(rendered)
    for container in spec["containers"] + spec["initContainers"]:
        limits = container["resources"]["limits"]
        assert container["resources"].get("requests", limits)["memory"] == limits["memory"], container["name"]
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "500m", "memory": "2Gi"},
                                                 "limits": {"cpu": "4", "memory": "2Gi", "squat.ai/video": 1}}
    klass, = docs(rendered, "PriorityClass")
    assert (klass["metadata"]["name"], klass["value"], klass["globalDefault"]) == ("edge-jetson-edge", 1000000, False)
    assert spec["priorityClassName"] == "edge-jetson-edge"
    named = render(helm, VALUE_SETS["agent3-no-sockets-wave"])
    assert pod(named)["priorityClassName"] == "edge-critical" and not docs(named, "PriorityClass")
    kept = pod(render(helm, dict(BASE, resources={"requests": {"cpu": "1"}, "limits": {}})))
    assert kept["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "2Gi"}  # {} merges, keeps them
    none = render(helm, dict(BASE, priorityClass={"create": False, "name": "", "value": 0}))
    assert "priorityClassName" not in pod(none) and not docs(none, "PriorityClass")


def test_no_pod_disruption_budget_and_the_docs_say_why(helm):
    """Issue 43 item 9: a DaemonSet's rolling update and `kubectl drain --ignore-daemonsets` never consult a
    PodDisruptionBudget, so the chart ships none (maxUnavailable, at most 50 %, is the budget) and says why."""
    for values in VALUE_SETS.values():
        assert not docs(render(helm, values), "PodDisruptionBudget")
    with open(os.path.join(REPO, "docs", "fleet.md"), encoding="utf-8") as fh:
        text = " ".join(fh.read().split())
    assert "**No PodDisruptionBudget**, on purpose: a DaemonSet's rolling update does not consult one" in text
