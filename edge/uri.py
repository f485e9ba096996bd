"""A source URI parsed once into a resource (jetson-utils' videoSource URI: protocol, location, port, extension)
that config validation, the sources' dispatch and the GStreamer pipelines all read, and a form safe to show.

`parse_source` refuses anything that is not a well-formed URI for its kind (a GStreamer pipeline is built from
the parts, so a space, `!` or quote would be pipeline syntax). The real URI is kept only to open the source;
everything shown or stored uses `SourceURI.shown`, and `redact` masks credentials in any text at the output
chokepoints (log lines, error lines, JSON files, HTTP pages) in case one got through another way.

`metrics_url` is the one builder of the daemon's /metrics URL (its start line, the rebuild's and the release bake's
scrapes).
"""

import os
import re
import urllib.parse
from dataclasses import dataclass
from typing import Optional

from edge.errors import EdgeError

FIELD = "source.uri"
MAX_URI_CHARS = 4096
# RFC 3986 characters minus the sub-delimiters that are GStreamer syntax ('!' links, "'" quotes); '%' only
# as %XX. A password with one of them is percent-encoded (%21, %27).
_URI_CHARS = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@$&()*+,;=]|%[0-9A-Fa-f]{2})*\Z")
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
# userinfo: everything from :// to the last '@' before the next URI, the end of a quoted string (a quote then ',',
# ':', a bracket, a space or the end: JSON fields, repr()) or the line's end, whatever it holds (a password may have
# spaces, quotes, '<', '\' or '/'): masking too much is safe, too little is a leak
_USERINFO = re.compile(r"(" + _SCHEME + r")(?:(?!" + _SCHEME + r")(?![\"'](?:[,:)}\]\s]|$))[^\n\r])*@")
_FRAGMENT = re.compile(r"(" + _SCHEME + r"[^\s#\"'<>]*)#[^\s\"'<>]+")
_HOST = re.compile(r"(?:[A-Za-z0-9.\-]+|[0-9A-Fa-f:.]+)\Z")  # a name, IPv4, or IPv6 (urlsplit drops [ ])
_SECRET_PARAM = re.compile(r"([?&;][^=&#\s\"']*(?:pass|pwd|token|key|secret|auth|sig|cred)[^=&#\s\"']*=)"
                           r"[^&#\s\"'<>\\]*?(?=:?(?:[&#\s\"'<>\\]|$))", re.IGNORECASE)  # "uri: why" keeps its ':'


@dataclass(frozen=True)
class SourceURI:
    protocol: str  # synthetic | file (a file or folder) | v4l2 | csi | rtsp
    text: str  # the URI as given: only for opening the source, never shown
    location: str = ""  # file: the path; v4l2: /dev/videoN; rtsp: the host
    port: int = 0  # rtsp: the TCP port (554 when the URI names none)
    device: int = -1  # v4l2 and csi: the device or sensor number
    extension: str = ""  # file: the name's extension, lower case with its dot ('' for none: a folder)

    @property
    def shown(self) -> str:
        """The URI with its user:password and secret query values masked."""
        return redact(self.text)


def redact(text: str) -> str:
    """`text` with every URI's userinfo, fragment and secret-looking query value (token=, password=, ...)
    masked."""
    return _FRAGMENT.sub(r"\1#***", _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***@", text)))


def argv_note(uri: str) -> Optional[str]:
    """A line to print when a URI given on the command line holds a secret: every local user can read a
    process's arguments (ps, /proc/PID/cmdline)."""
    if redact(uri) == uri:
        return None
    return ("note: the credentials in {} are readable by every local user in the process list (ps); put the URI in "
            "the config file (source.uri), readable only by the service".format(redact(uri)))


def _refuse(uri: str, why: str, field: str) -> EdgeError:
    shown = redact(uri)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return EdgeError("{}: {} (got {!r})".format(field, why, shown))


def parse_source(uri: str, field: str = FIELD) -> SourceURI:
    """`uri` -> SourceURI, or a one-line EdgeError naming `field`. Paths are checked for form only here."""
    if not isinstance(uri, str) or not uri:
        raise EdgeError("{}: must be a non-empty string".format(field))
    if len(uri) > MAX_URI_CHARS:
        raise EdgeError("{}: longer than {} characters".format(field, MAX_URI_CHARS))
    if any(ord(c) < 32 or ord(c) == 127 for c in uri):
        raise _refuse(uri, "control characters are not allowed", field)
    if uri == "synthetic":
        return SourceURI("synthetic", uri)
    for prefix, protocol in (("/dev/video", "v4l2"), ("v4l2://", "v4l2"), ("csi://", "csi")):
        if uri.startswith(prefix):
            device = _number(uri, prefix, field)
            return SourceURI(protocol, uri, location="/dev/video{}".format(device) if protocol == "v4l2" else "",
                             device=device)
    scheme = uri.split("://", 1)[0] if "://" in uri else None
    if scheme is None:
        return SourceURI("file", uri, location=uri, extension=os.path.splitext(uri)[1].lower())
    if scheme.lower() != "rtsp":
        raise _refuse(uri, "unsupported scheme (synthetic, FILE, FOLDER, /dev/videoN, v4l2://N, csi://N, rtsp://)",
                      field)
    return _rtsp(uri, field)


def _number(uri: str, prefix: str, field: str) -> int:
    tail = uri[len(prefix):]
    if not (tail.isascii() and tail.isdigit() and len(tail) <= 4):
        raise _refuse(uri, "expected {}N with N a number".format(prefix), field)
    return int(tail)


def _rtsp(uri: str, field: str) -> SourceURI:
    if not _URI_CHARS.match(uri):
        raise _refuse(uri, "not a well-formed rtsp:// URI (spaces, quotes, '!', '\\' and non-ASCII characters "
                           "must be percent-encoded)", field)
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:  # an unbalanced IPv6 bracket
        raise _refuse(uri, "not a well-formed rtsp:// URI", field) from None
    if "@" in parts.path + parts.query + parts.fragment:
        raise _refuse(uri, "'@' outside user:password@ (percent-encode it as %40)", field)
    port: Optional[int]
    try:
        port = parts.port
    except ValueError:
        raise _refuse(uri, "the port must be a number from 1 to 65535", field) from None
    if not _HOST.match(parts.hostname or "") or port == 0:
        raise _refuse(uri, "expected rtsp://[user:password@]host[:port]/path", field)
    return SourceURI("rtsp", uri, location=parts.hostname or "", port=port or 554)


WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}  # a bind to every interface, and its loopback


def metrics_url(host: str, port: int, *, local_client: bool) -> str:
    """The daemon's /metrics on `host`:`port` (config service.metrics), an IPv6 address in brackets.
    `local_client`: the URL a program on this machine scrapes, where a bind to every interface ("", 0.0.0.0, ::) is
    reached on loopback; else the address the daemon listens on, as its start line shows it ("" is 0.0.0.0)."""
    host = WILDCARDS.get(host, host) if local_client else host or "0.0.0.0"
    return "http://{}:{}/metrics".format("[{}]".format(host) if ":" in host else host, port)
