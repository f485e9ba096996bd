"""One build per engine identity: a shared cache of built artifacts, a folder (NFS, a synced share) or an
http(s):// URL serving such a folder.

The key is the sha256 of what an installed artifact must record to count as built from these inputs on this
kind of board (edge.build.plan.expected_manifest: the source and calibration sha256, precision, format and, for
an engine, board, SM count, compute capability, TensorRT, CUDA). 300 Orins of one module, L4T and TensorRT
share one key, so one canary builds and gates and the others fetch.

    <cache>/<key>/<artifact name>, <stem>.json, <stem>.labels.txt

`fetch` downloads the three files into a temporary folder beside the destination, verifies them (the sha256
of the bytes against the model info, then every expected key) and installs them with edge.artifact.install;
a miss or a corrupt entry is reported and leaves nothing installed (the caller builds locally). `publish`
copies an installed artifact that verifies into a temporary folder of the cache and renames it to its key
(folders only).
"""

import hashlib
import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict

from edge.artifact import companions, install, verify
from edge.build.plan import BuildPlan, expected_manifest
from edge.errors import EdgeError, first_line
from edge.fileio import temp_dir

Log = Callable[..., None]
MAX_BYTES = 2 << 30  # an engine of a large model is hundreds of MB; more is not an artifact


def identity(expected: Dict[str, Any]) -> str:
    """The cache key of an artifact that must match `expected` (canonical JSON, sha256)."""
    return hashlib.sha256(json.dumps(expected, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _is_url(cache: str) -> bool:
    return urllib.parse.urlsplit(cache).scheme in ("http", "https")


def _download(cache: str, key: str, name: str, dest: str) -> bool:
    """Copy `<cache>/<key>/<name>` to `dest`; False when the cache has no such file."""
    if not _is_url(cache):
        src = os.path.join(cache, key, name)
        if not os.path.isfile(src):
            return False
        shutil.copyfile(src, dest)
        return True
    url = "{}/{}/{}".format(cache.rstrip("/"), key, urllib.parse.quote(name))
    try:
        with urllib.request.urlopen(url, timeout=30) as response, open(dest, "wb") as out:
            copied = 0
            for chunk in iter(lambda: response.read(1 << 20), b""):
                copied += len(chunk)
                if copied > MAX_BYTES:
                    raise EdgeError("{}: larger than {} bytes; not an artifact".format(url, MAX_BYTES))
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise EdgeError("engine cache {}: HTTP {}".format(url, exc.code)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise EdgeError("engine cache {}: {}".format(url, first_line(getattr(exc, "reason", exc)))) from None
    return True


def fetch(plan: BuildPlan, cache: str, log: Log = print) -> bool:
    """Install the cached artifact for `plan` (True), or report a miss or a corrupt entry (False)."""
    expected = expected_manifest(plan)
    key = identity(expected)
    folder = os.path.dirname(os.path.abspath(plan.artifact))
    with temp_dir(folder, ".cache-" + key[:16] + ".") as tmp:  # same filesystem: install renames
        staged = [os.path.join(tmp, os.path.basename(path)) for path in companions(plan.artifact)]
        for path in staged:
            if not _download(cache, key, os.path.basename(path), path):
                log("engine cache: miss {} ({})".format(key[:16], os.path.basename(plan.artifact)))
                return False
        try:
            manifest = verify(staged[-1], expected, plan.command)
        except EdgeError as exc:
            log("engine cache: corrupt entry {} ignored: {}".format(key[:16], exc))
            return False
        install(staged[-1], plan.artifact, manifest, staged_labels=staged[0], log=log)
        log("engine cache: hit {}".format(key[:16]))
        return True


def publish(plan: BuildPlan, cache: str, log: Log = print) -> str:
    """Copy the installed artifact of `plan`, once it verifies, into `<cache>/<key>/`; returns that folder."""
    if _is_url(cache):
        raise EdgeError("engine cache {}: publish writes to a folder (serve that folder over HTTP)".format(cache))
    expected = expected_manifest(plan)
    verify(plan.artifact, expected, plan.command)
    key = identity(expected)
    final = os.path.join(cache, key)
    if os.path.isdir(final):
        log("engine cache: {} already holds {}".format(final, os.path.basename(plan.artifact)))
        return final
    with temp_dir(cache, "." + key[:16] + ".") as tmp:
        for path in companions(plan.artifact):
            shutil.copyfile(path, os.path.join(tmp, os.path.basename(path)))
            os.chmod(os.path.join(tmp, os.path.basename(path)), 0o644)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, final)
        except OSError:  # another device published the same key first
            if not os.path.isdir(final):
                raise
    log("engine cache: published {} as {}".format(os.path.basename(plan.artifact), final))
    return final
