"""What `provision api` was started with: the listen address, limits and the token (a frozen value)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from provision.core.errors import InvalidValue

DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_MAX_VMS = 4
# A JSON body and the code in it: generous for a script, small enough to keep in memory.
MAX_BODY_BYTES = 1024 * 1024
MAX_CODE_BYTES = 256 * 1024
MAX_TIMEOUT_S = 3600
DEFAULT_TIMEOUT_S = 120
# The non-streaming response carries at most this much of each output stream (the stream carries all).
MAX_CAPTURE_BYTES = 4 * 1024 * 1024
DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class Settings:
    listen: Listen
    max_vms: int = DEFAULT_MAX_VMS
    token: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    max_code_bytes: int = MAX_CODE_BYTES
    max_timeout_s: int = MAX_TIMEOUT_S
    max_capture_bytes: int = MAX_CAPTURE_BYTES
    grace_s: float = DEFAULT_GRACE_S


def parse_listen(text: str) -> Listen:
    """``HOST:PORT`` with HOST an IP literal (``[v6]:port`` for IPv6) or ``localhost``; port 0 = any free one.

    Host names other than localhost are refused: whether a listener is loopback must be decidable here.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidValue(f"--listen {text!r}: expected HOST:PORT", fix="--listen 127.0.0.1:8080")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise InvalidValue(
            f"--listen {text!r}: host {host!r} is not an IP address", fix="--listen 127.0.0.1:8080 (an IP literal)"
        ) from None
    return Listen(host, int(port))
