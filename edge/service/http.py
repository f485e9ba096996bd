"""The small HTTP servers (the metrics endpoint, the demo's stream) held to bounds a flood cannot move:

- at most `max_clients` connections are served at once, one thread each, and at most half of them from one peer
  address; more are answered 503 and closed at once (no thread is started for them, and a thread that cannot
  start is a refusal, not a traceback): one flooding host cannot lock out Prometheus or the release bake;
- a request's head (request line and headers) must arrive whole within `HEAD_DEADLINE_S` of the connection,
  however slowly it drips: the deadline is total, not per byte;
- a request head larger than MAX_HEAD_BYTES is answered 431, never parsed as a bare HTTP/0.9 request line;
- a Host header that names neither an IP address, a loopback name, nor the server's configured host or this
  machine's name is answered 421: a DNS-rebinding page in the operator's browser cannot read frames or stats;
- a client that leaves early is not an error; anything else is one stderr line, never a traceback.
"""

import io
import ipaddress
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from socketserver import ThreadingMixIn
from typing import Any, Optional, Sequence

HEAD_DEADLINE_S = 5.0  # the whole request head, from the first byte the server reads
MAX_HEAD_BYTES = 16384
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def read_head(sock: socket.socket, deadline_s: float) -> bytes:
    """The request head (through the blank line) read within `deadline_s` in all; b"" when it did not come."""
    deadline = time.monotonic() + deadline_s
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < MAX_HEAD_BYTES:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b""
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(4096)
        except OSError:  # socket.timeout is one
            return b""
        if not chunk:
            return b""
        head += chunk
    return head


def host_allowed(host: Optional[str], names: Sequence[str]) -> bool:
    """True for no Host header, an IP address (a rebinding page has a name of its own), a loopback name, or one
    of `names` (the configured host, this machine's name)."""
    if host is None:
        return True
    host = host.strip().lower()
    name = host[1:host.find("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0] \
        if host.count(":") == 1 else host
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    name = name.rstrip(".")
    return name in LOOPBACK_NAMES or name.endswith(".localhost") or name in {n.lower().rstrip(".") for n in names}


def _refusal(head: bytes, names: Sequence[str]) -> bytes:
    """The whole answer to a head that must not be served (too large, a foreign Host), or b""."""
    if len(head) >= MAX_HEAD_BYTES and b"\r\n\r\n" not in head and b"\n\n" not in head:
        return b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    hosts = [line.split(b":", 1)[1].decode("latin-1") for line in head.splitlines()[1:]
             if line.lower().startswith(b"host:")]
    if hosts and not host_allowed(hosts[0], names):
        body = b"misdirected request: not this server's name (use its address or localhost)\n"
        return b"HTTP/1.0 421 Misdirected Request\r\nContent-Type: text/plain\r\nContent-Length: " + \
            str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    return b""


class DeadlineRequestHandler(BaseHTTPRequestHandler):
    """GET-only handler whose request head must arrive within HEAD_DEADLINE_S; one request per connection. The
    server's `allowed_hosts` (its configured host, this machine's name) are the names its Host header may give."""

    def setup(self) -> None:
        super().setup()
        head = read_head(self.connection, HEAD_DEADLINE_S)
        self.connection.settimeout(self.timeout)  # writing the answer: the handler's own per-call timeout
        self.rfile.close()
        refusal = _refusal(head, getattr(self.server, "allowed_hosts", ()))
        if refusal:
            try:
                self.connection.sendall(refusal)
            except OSError:
                pass
            head = b""
        self.rfile = io.BytesIO(head)  # b"" (no head in time, or refused): the handler closes quietly

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass  # no access log lines in the journal


def allowed_hosts(configured: str) -> Sequence[str]:
    """The names a server bound for `configured` answers to besides IP addresses and loopback names."""
    return tuple(n for n in (configured, socket.gethostname()) if n)


class BoundedThreadingMixIn(ThreadingMixIn):
    """ThreadingMixIn with at most `max_clients` handler threads; the rest are refused with a 503."""

    daemon_threads = True
    max_clients = 16
    name = "edge http"  # who prints the one line on an unexpected failure
    refused = 0

    def _peers(self) -> Any:
        """(lock, {peer address: connections held}), made on first use (the servers' own __init__ is theirs)."""
        peers = self.__dict__.get("_peer_slots")
        if peers is None:
            peers = self.__dict__["_peer_slots"] = (threading.Lock(), {})
        return peers

    def _take_slot(self, peer: str) -> bool:
        lock, held = self._peers()
        with lock:
            total = sum(held.values())
            if total >= self.max_clients or held.get(peer, 0) >= max(1, self.max_clients // 2):
                return False
            held[peer] = held.get(peer, 0) + 1
            return True

    def _free_slot(self, peer: str) -> None:
        lock, held = self._peers()
        with lock:
            held[peer] -= 1
            if not held[peer]:
                del held[peer]

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0])
        if not self._take_slot(peer):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except RuntimeError:  # "can't start new thread" (ulimit -u): a refusal like any other
            self._free_slot(peer)
            self._refuse(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._free_slot(str(client_address[0]))

    def _refuse(self, request: Any) -> None:
        self.refused += 1
        try:
            request.setblocking(False)
            request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass
        self.shutdown_request(request)  # type: ignore[attr-defined]

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):  # a dropped connection is normal; anything else gets one line
            print("{}: client {}: {}: {}".format(self.name, client_address[0], type(exc).__name__, exc),
                  file=sys.stderr, flush=True)
