"""One build per engine identity: a shared cache of built artifacts, a folder (NFS, a synced share) or an
https:// URL serving such a folder.

The key is the sha256 of what an installed artifact must record to count as built from these inputs on this
kind of board (edge.model.plan.expected_model_info: the source and calibration sha256, precision, format and, for
an engine, board, SM count, compute capability, TensorRT, CUDA). 300 Orins of one module, L4T and TensorRT
share one key, so one canary builds and gates and the others fetch.

    <cache>/<key>/<artifact name>, <stem>.json, <stem>.labels.txt

`fetch` downloads the three files into a temporary folder beside the destination, verifies them as a set (the
sha256 of the artifact and of the labels against the model info, then every expected key) and installs them with
edge.store.artifact.install; a miss or a corrupt entry is reported and leaves nothing installed (the caller builds
locally). Over plain http:// anything on the path could change all three files together, so it is refused unless
`digest` pins the entry's model info (its sha256, which `publish` prints). A URL's user:password is sent as HTTP
basic auth, over https only, and never shown. `publish` copies an installed artifact that verifies into a
temporary folder of the cache and renames it to its key (folders only).
"""

import base64
import hashlib
import http.client
import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Optional, Tuple

from edge.errors import EdgeError, first_line
from edge.model.plan import BuildPlan, expected_model_info
from edge.store.artifact import MAX_ARTIFACT_BYTES, companions, install, read_set, sha256_file, verify, writing
from edge.store.durable import fsync_tree
from edge.store.fileio import temp_dir
from edge.store.versions import move
from edge.uri import redact

Log = Callable[..., None]
_SHA256_CHARS = set("0123456789abcdef")


def identity(expected: Dict[str, Any]) -> str:
    """The cache key of an artifact that must match `expected` (canonical JSON, sha256)."""
    return hashlib.sha256(json.dumps(expected, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _is_url(cache: str) -> bool:
    return "://" in cache


def _endpoint(cache: str, digest: Optional[str]) -> Tuple[str, Dict[str, str]]:
    """(the URL without its user:password, the request headers) for an http(s) cache; anything malformed,
    credentials over plain http, or plain http without a pinned digest is one line with the URL redacted."""
    shown = redact(cache)
    try:
        parts = urllib.parse.urlsplit(cache)
        port, host = parts.port, parts.hostname
    except ValueError as exc:  # a port that is no number, an unbalanced [ of an IPv6 address
        raise EdgeError("engine cache {}: not a well-formed URL ({})".format(shown, redact(first_line(exc)))) from None
    if parts.scheme not in ("http", "https") or not host:
        raise EdgeError("engine cache {}: expected a folder or an https://host[:port]/path URL".format(shown))
    headers = {}
    if parts.username is not None or parts.password is not None:
        if parts.scheme != "https":
            raise EdgeError("engine cache {}: a user:password over plain http would travel in the clear; use "
                            "https://".format(shown))
        pair = "{}:{}".format(urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or ""))
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
    if parts.scheme == "http" and digest is None:
        raise EdgeError("engine cache {}: plain http:// lets anything on the path swap the artifact and its labels "
                        "together; use https://, or pin the entry with --digest (printed by edge cache publish)"
                        .format(shown))
    netloc = "[{}]".format(host) if ":" in host else host
    base = urllib.parse.urlunsplit((parts.scheme, netloc + (":{}".format(port) if port else ""),
                                    parts.path.rstrip("/"), parts.query, ""))
    return base, headers


def _url(base: str, key: str, name: str) -> str:
    parts = urllib.parse.urlsplit(base)
    path = "{}/{}/{}".format(parts.path, key, urllib.parse.quote(name))
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _download(cache: str, endpoint: Optional[Tuple[str, Dict[str, str]]], key: str, name: str, dest: str) -> bool:
    """Copy `<cache>/<key>/<name>` to `dest`; False when the cache has no such file."""
    if endpoint is None:
        src = os.path.join(cache, key, name)
        if not os.path.isfile(src):
            return False
        shutil.copyfile(src, dest)
        return True
    url = _url(endpoint[0], key, name)
    shown = redact(url)
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=endpoint[1]), timeout=30)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise EdgeError("engine cache {}: HTTP {}".format(shown, exc.code)) from None
    except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError, a timeout, a reset connection
        raise EdgeError("engine cache {}: {}".format(shown, redact(first_line(getattr(exc, "reason", exc))))) \
            from None
    with response, open(dest, "wb") as out:  # a failed write (a full disk) is the caller's: it names the file
        copied = 0
        while True:
            try:
                chunk = response.read(1 << 20)
            except (OSError, http.client.HTTPException) as exc:
                raise EdgeError("engine cache {}: {}".format(shown, redact(first_line(exc)))) from None
            if not chunk:
                return True
            copied += len(chunk)
            if copied > MAX_ARTIFACT_BYTES:
                raise EdgeError("{}: larger than {} bytes; not an artifact".format(shown, MAX_ARTIFACT_BYTES))
            out.write(chunk)


def read_file(cache: str, key: str, name: str, dest: str) -> bool:
    """`<cache>/<key>/<name>` of a folder or https:// cache copied to `dest`; False when the cache has none. For
    the small files kept beside the artifacts (edge/fleet/store.py's rollout records)."""
    return _download(cache, _endpoint(cache, None) if _is_url(cache) else None, key, name, dest)


def fetch(plan: BuildPlan, cache: str, *, digest: Optional[str] = None, log: Log = print) -> bool:
    """Install the cached artifact for `plan` (True), or report a miss or a corrupt entry (False). A cache that
    cannot be used at all (a bad URL, a full disk here) is an EdgeError naming what."""
    if digest is not None and not (len(digest) == 64 and set(digest) <= _SHA256_CHARS):
        raise EdgeError("--digest: expected the 64 hex digits edge cache publish printed, got {!r}".format(
            digest[:80]))
    endpoint = _endpoint(cache, digest) if _is_url(cache) else None
    expected = expected_model_info(plan)
    key = identity(expected)
    folder = os.path.dirname(os.path.abspath(plan.artifact))
    try:
        with writing(folder, "edge cache fetch"), temp_dir(folder, ".cache-" + key[:16] + ".") as tmp:
            staged = [os.path.join(tmp, os.path.basename(path)) for path in companions(plan.artifact)]
            for path in staged:
                if not _download(cache, endpoint, key, os.path.basename(path), path):
                    log("engine cache: miss {} ({})".format(key[:16], os.path.basename(plan.artifact)))
                    return False
            try:
                model = _verified(staged, expected, plan.command, digest)
            except EdgeError as exc:
                log("engine cache: corrupt entry {} ignored: {}".format(key[:16], exc))
                return False
            install(plan.artifact, artifact=staged[-1], info=model, labels=staged[0], log=log)
    except OSError as exc:  # a full or read-only disk here: not a miss (that would build on the same full disk)
        raise EdgeError("{}: cannot install the cached artifact: {}".format(plan.artifact, exc.strerror or exc)) \
            from None
    log("engine cache: hit {}".format(key[:16]))
    return True


def _verified(staged: list, expected: Dict[str, Any], rebuild: str, digest: Optional[str]) -> Dict[str, Any]:
    """The downloaded set's model info, once the set checks: the pinned digest of the model info, the sha256 of
    the artifact and of the labels it records (both required), and every expected key."""
    labels, info, artifact = staged
    if digest is not None:
        have = sha256_file(info)
        if have != digest:
            raise EdgeError("its model info has sha256 {}, not the pinned --digest {}".format(have, digest))
    model = read_set(artifact, expected=expected, rebuild=rebuild, required_info=True)
    if model.info.get("labels_sha256") is None:
        raise EdgeError("{}: its model info covers no labels (published by an older version); publish it "
                        "again".format(os.path.basename(artifact)))
    return model.info


def publish(plan: BuildPlan, cache: str, *, log: Log = print) -> str:
    """Copy the installed artifact of `plan`, once its set verifies, into `<cache>/<key>/`; returns that folder.
    The log line gives the entry's digest (the sha256 of its model info), what a plain-http fetch pins."""
    if _is_url(cache):
        raise EdgeError("engine cache {}: publish writes to a folder (serve that folder over HTTP)".format(
            redact(cache)))
    expected = expected_model_info(plan)
    verify(plan.artifact, expected, rebuild=plan.command)
    key = identity(expected)
    final = os.path.join(cache, key)
    if os.path.isdir(final):
        log("engine cache: {} already holds {}".format(final, os.path.basename(plan.artifact)))
        return final
    with temp_dir(cache, "." + key[:16] + ".") as tmp:
        for path in companions(plan.artifact):
            if os.path.exists(path):
                shutil.copyfile(path, os.path.join(tmp, os.path.basename(path)))
                os.chmod(os.path.join(tmp, os.path.basename(path)), 0o644)
        os.chmod(tmp, 0o755)
        fsync_tree(tmp)  # a power cut leaves the entry whole or absent
        try:
            move(tmp, final)
        except OSError:  # another device published the same key first
            if not os.path.isdir(final):
                raise
    digest = sha256_file(os.path.join(final, os.path.basename(companions(plan.artifact)[1])))
    log("engine cache: published {} as {} (digest {})".format(os.path.basename(plan.artifact), final, digest))
    return final
