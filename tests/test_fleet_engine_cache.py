"""The per-identity artifact cache (edge/model/engine_cache.py, `edge cache`): one real CPU build is
published, then fetched by a second "device" from a folder and over real HTTP (a pinned digest); a miss, a corrupt
entry (its artifact or its labels changed) and another identity fall back to a local build (nothing installed); a
cache URL that cannot be used is one redacted line, exit 2."""

import errno
import functools
import hashlib
import http.server
import os
import shutil
import threading

import pytest
import yaml

from edge.cli.main import main as cli
from edge.config import load_config
from edge.errors import EdgeError
from edge.model import engine_cache
from edge.model.calibration import import_calibration_set
from edge.model.plan import check_inputs, expected_model_info
from edge.store.artifact import companions, read_model_info, sha256_file, verify

from conftest import REPO, assert_refused, run_edge


def device(tmp_path, name, model, sets, precision="int8"):
    """A device's config: its own engines folder, the shared model and sets."""
    config = tmp_path / (name + ".yaml")
    config.write_text(yaml.safe_dump({
        "model": {"path": model}, "backend": {"kind": "onnxruntime"},
        "build": {"engines_dir": str(tmp_path / name / "engines"), "calibration_dir": sets[0],
                  "regression_dir": sets[1], "min_images": 1, "precision": precision, "method": "minmax"}}),
                  encoding="utf-8")
    return str(config)


def plan_of(config):
    return check_inputs(load_config(config), show_progress=False)


@pytest.fixture(scope="module")
def model(tiny_classifiers):
    """The FP32 export every device builds from (the network does not matter here)."""
    return tiny_classifiers[0]


@pytest.fixture(scope="module")
def canary(model, tmp_path_factory):
    """A canary that built (the real CPU build) and published its artifact into a folder cache."""
    tmp = tmp_path_factory.mktemp("cache")
    images = sorted(f for f in os.listdir(os.path.join(REPO, "calibration", "default")) if f.endswith(".jpg"))
    sets = []
    for name, chosen in (("cal", images[:3]), ("reg", images[3:6])):  # two sets, two sha256
        raw = tmp / ("raw-" + name)
        raw.mkdir()
        for image in chosen:
            shutil.copy(os.path.join(REPO, "calibration", "default", image), str(raw))
        sets.append(str(tmp / name))
        import_calibration_set(str(raw), sets[-1], 1, log=lambda *a: None)
    config = device(tmp, "canary", model, sets)
    assert cli(["build", "--config", config, "--no-progress"]) == 0
    cache = str(tmp / "shared")
    folder = engine_cache.publish(plan_of(config), cache, log=lambda *a: None)
    return tmp, sets, config, cache, folder


def test_publish_keys_the_artifact_by_its_identity(canary):
    tmp, sets, config, cache, folder = canary
    plan = plan_of(config)
    assert os.path.basename(folder) == engine_cache.identity(expected_model_info(plan))
    assert sorted(os.listdir(folder)) == sorted(os.path.basename(p) for p in companions(plan.artifact))
    assert sha256_file(os.path.join(folder, os.path.basename(plan.artifact))) == sha256_file(plan.artifact)
    assert [n for n in os.listdir(cache) if n.startswith(".")] == []  # no temporary folder left


def test_a_published_entry_is_on_the_disk_before_its_name_is(canary, tmp_path, monkeypatch):
    """A power cut after the publish's rename must not leave an entry whose files are still in the page cache."""
    from edge.store import durable, versions

    _, _, config, _, _ = canary
    events = []
    fsync, rename = durable.fsync_path, os.rename
    for module in (durable, versions):  # fsync_tree's, and move's
        monkeypatch.setattr(module, "fsync_path", lambda path: (events.append(("fsync", path)), fsync(path))[1])
    monkeypatch.setattr(os, "rename", lambda src, dest: (events.append(("rename", src, dest)), rename(src, dest))[1])
    cache = str(tmp_path / "cache")
    os.mkdir(cache)
    final = engine_cache.publish(plan_of(config), cache, log=lambda *a: None)
    renamed = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == final]
    assert len(renamed) == 1, events
    staged = events[renamed[0]][1]
    synced_before = {e[1] for e in events[:renamed[0]] if e[0] == "fsync"}
    assert {os.path.join(staged, n) for n in os.listdir(final)} | {staged} <= synced_before, events
    assert ("fsync", cache) in events[renamed[0]:], events


def test_hit_from_a_folder_installs_the_verified_artifact(canary, tmp_path, model):
    _, sets, config, cache, _ = canary
    logged = []
    plan = plan_of(device(tmp_path, "jetson-07", model, sets))
    assert engine_cache.fetch(plan, cache, log=logged.append) is True
    assert "engine cache: hit" in logged[-1]
    verify(plan.artifact, expected_model_info(plan))
    assert read_model_info(plan.artifact)["built_at"] == read_model_info(plan_of(config).artifact)["built_at"]
    names = sorted(os.path.basename(p) for p in companions(plan.artifact))
    sets = os.path.basename(plan.artifact) + ".sets"  # the artifact's own sets
    assert sorted(os.listdir(os.path.dirname(plan.artifact))) == sorted(names + [sets])  # no temporary
    assert sorted(os.listdir(os.path.join(os.path.dirname(plan.artifact), sets, "0001"))) == names


def test_miss_and_another_identity_install_nothing(canary, tmp_path, model):
    _, sets, _, cache, _ = canary
    logged = []
    plan = plan_of(device(tmp_path, "empty", model, sets))
    assert engine_cache.fetch(plan, str(tmp_path / "no-cache"), log=logged.append) is False
    assert "engine cache: miss" in logged[-1] and not os.path.exists(plan.artifact)
    other = plan_of(device(tmp_path, "other", model, sets[::-1]))  # other calibration: other identity
    assert engine_cache.fetch(other, cache, log=logged.append) is False
    assert "miss" in logged[-1] and os.listdir(os.path.dirname(other.artifact)) == []


def test_corrupt_entry_is_refused_and_nothing_installed(canary, tmp_path, model):
    _, sets, config, cache, folder = canary
    broken = str(tmp_path / "broken")
    shutil.copytree(cache, broken)
    cached = os.path.join(broken, os.path.basename(folder), os.path.basename(plan_of(config).artifact))
    with open(cached, "r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    logged = []
    plan = plan_of(device(tmp_path, "jetson-08", model, sets))
    assert engine_cache.fetch(plan, broken, log=logged.append) is False
    assert "corrupt entry" in logged[-1] and "sha256" in logged[-1]
    assert os.listdir(os.path.dirname(plan.artifact)) == []


def entry_digest(folder, plan):
    with open(os.path.join(folder, os.path.basename(companions(plan.artifact)[1])), "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_changed_labels_in_an_entry_are_refused_and_nothing_installed(canary, tmp_path, model):
    """Two class names swapped in the cache: the labels are part of the verified set."""
    _, sets, config, cache, folder = canary
    broken = str(tmp_path / "broken")
    shutil.copytree(cache, broken)
    labels = os.path.join(broken, os.path.basename(folder), os.path.basename(companions(plan_of(config).artifact)[0]))
    names = open(labels, encoding="utf-8").read().splitlines()
    names[0], names[1] = names[1], names[0]
    open(labels, "w", encoding="utf-8").write("\n".join(names) + "\n")
    logged = []
    plan = plan_of(device(tmp_path, "jetson-10", model, sets))
    assert engine_cache.fetch(plan, broken, log=logged.append) is False
    assert "corrupt entry" in logged[-1] and "labels" in logged[-1], logged[-1]
    assert not os.path.exists(plan.artifact)


@pytest.fixture
def served_cache(canary):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=canary[3])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:{}/".format(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_hit_and_miss_over_http_with_a_pinned_digest_and_the_cli_exit_codes(canary, served_cache, tmp_path, model):
    _, sets, canary_config, cache, folder = canary
    url = served_cache
    digest = entry_digest(folder, plan_of(canary_config))
    config = device(tmp_path, "jetson-09", model, sets)
    missed = run_edge("cache", "fetch", url, "--digest", digest, "--config", device(tmp_path, "x", model, sets[::-1]))
    assert missed.returncode == 1 and "engine cache: miss" in missed.stdout, missed.stdout + missed.stderr
    hit = run_edge("cache", "fetch", url, "--digest", digest, "--config", config)
    assert hit.returncode == 0 and "engine cache: hit" in hit.stdout, hit.stdout + hit.stderr
    verify(plan_of(config).artifact, expected_model_info(plan_of(config)))
    wrong = run_edge("cache", "fetch", url, "--digest", "0" * 64, "--config", device(tmp_path, "y", model, sets))
    assert wrong.returncode == 1 and "not the pinned --digest" in wrong.stdout, wrong.stdout + wrong.stderr
    assert_refused(run_edge("cache", "publish", url, "--config", config), url, code=2)
    # plain http without a pin: the model info that vouches for the artifact and labels travels unprotected
    assert_refused(run_edge("cache", "fetch", url, "--config", device(tmp_path, "z", model, sets)), "--digest",
                   "https://")
    assert not os.path.exists(plan_of(device(tmp_path, "z", model, sets)).artifact)


HOSTILE_CACHE_URLS = [  # (cache URL, what the one line says); the password must never show
    ("http://admin:S3cretPW@127.0.0.1/cache", "in the clear"),
    ("https://admin:S3cretPW@127.0.0.1:abc/cache", "not a well-formed URL"),
    ("https://admin:S3cretPW@[::1/cache", "not a well-formed URL"),
    ("https://admin:S3cret PW@127.0.0.1:99999/cache", "not a well-formed URL"),
    ("ftp://admin:S3cretPW@127.0.0.1/cache", "expected a folder or an https://"),
    ("https://admin:S3cretPW@127.0.0.1:9/cache?token=S3cretPW#S3cretPW", "127.0.0.1:9"),  # nothing listens
]


@pytest.mark.parametrize("url,says", HOSTILE_CACHE_URLS)
def test_a_cache_url_that_cannot_be_used_is_one_redacted_line(canary, tmp_path, model, url, says):
    _, sets, _, _, _ = canary
    proc = run_edge("cache", "fetch", url, "--config", device(tmp_path, "d", model, sets))
    assert_refused(proc, says, code=2)
    assert "S3cretPW" not in proc.stdout + proc.stderr


def test_credentials_go_as_basic_auth_and_the_query_stays_last():
    url, headers = engine_cache._endpoint("https://ad%20min:pa:ss@cache.example:8443/c/?token=t", None)
    assert url == "https://cache.example:8443/c?token=t"
    assert headers == {"Authorization": "Basic " + __import__("base64").b64encode(b"ad min:pa:ss").decode()}
    assert engine_cache._url(url, "k" * 64, "m.int8.onnx") == \
        "https://cache.example:8443/c/{}/m.int8.onnx?token=t".format("k" * 64)


def test_a_full_disk_here_is_exit_2_naming_the_destination_not_a_miss(canary, tmp_path, model, monkeypatch):
    from edge.store import versions as artifact_store

    _, sets, _, cache, _ = canary

    def full(src, dst, link):
        raise OSError(errno.ENOSPC, "No space left on device", dst)

    monkeypatch.setattr(artifact_store, "_place", full)
    plan = plan_of(device(tmp_path, "full", model, sets))
    with pytest.raises(EdgeError) as err:
        engine_cache.fetch(plan, cache, log=lambda *a: None)
    assert err.value.exit_code == 2 and plan.artifact in str(err.value) and "No space left" in str(err.value)
    assert not os.path.exists(plan.artifact)


def self_signed(folder, ip):
    """A certificate for `ip` and its key, written as PEM files into `folder`: (cert, key)."""
    import datetime
    import ipaddress

    x509 = pytest.importorskip("cryptography.x509", reason="cryptography comes with ansible-core (Python 3.10+)")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cache")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    paths = folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest.fixture
def https_cache(canary, tmp_path):
    """The canary's folder cache served over https on IPv6 loopback ([::1]) behind basic auth (user `fleet`, a
    password with a reserved character), by a certificate the clients trust through SSL_CERT_FILE. Yields the URL
    with the user:password in it, the environment, and the Authorization headers the server saw."""
    import base64
    import socket
    import ssl

    cert, key = self_signed(tmp_path, "::1")
    expected = "Basic " + base64.b64encode(b"fleet:S3cret/PW").decode()
    seen = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=canary[3], **kwargs)

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            if self.headers.get("Authorization") != expected:
                self.send_error(401)
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

    try:
        server = Server(("::1", 0), Handler)
    except OSError as exc:  # a machine without IPv6 loopback
        pytest.skip("no IPv6 loopback here: {}".format(exc))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "https://fleet:S3cret%2FPW@[::1]:{}/".format(server.server_address[1]), {"SSL_CERT_FILE": str(cert)}, seen
    server.shutdown()
    server.server_close()


def test_a_follower_fetches_over_https_from_an_ipv6_host_with_its_user_and_password(canary, https_cache, tmp_path,
                                                                                     model):
    _, sets, _, _, _ = canary
    url, env, seen = https_cache
    config = device(tmp_path, "follower", model, sets)
    hit = run_edge("cache", "fetch", url, "--config", config, env=env)
    assert hit.returncode == 0 and "engine cache: hit" in hit.stdout, hit.stdout + hit.stderr
    verify(plan_of(config).artifact, expected_model_info(plan_of(config)))
    assert seen and set(seen) == {"Basic " + __import__("base64").b64encode(b"fleet:S3cret/PW").decode()}
    assert "S3cret" not in hit.stdout + hit.stderr
    wrong = url.replace("S3cret%2FPW", "nope")
    refused = run_edge("cache", "fetch", wrong, "--config", device(tmp_path, "other", model, sets), env=env)
    line = assert_refused(refused, "HTTP 401", "[::1]", code=2)
    assert "nope" not in refused.stdout + refused.stderr, line
    assert not os.path.exists(plan_of(device(tmp_path, "other", model, sets)).artifact)
