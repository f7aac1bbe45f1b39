"""A container/model registry over the distribution v2 API: manifests, small blobs, the bearer-token flow.

One request per call (the caller retries): ``get_manifest`` answers 401 by asking the realm that
``WWW-Authenticate: Bearer realm=…,service=…,scope=…`` names for a token (with the user's
credentials when there are some, as podman's auth.json holds them), then asks again with it.
Ollama's registry speaks the same API (without a token for public models). Every URL passes the
caller's policy first, token realms included.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from provision.adapters import http as web

if TYPE_CHECKING:
    import requests

_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(Exception):
    """The registry answered, but not with what was asked (status and what it said)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text}")
        self.status = status


@dataclass
class Registry:
    base: str  # http(s)://host[:port]
    repository: str
    credentials: tuple[str, str] | None = None  # user, password (or identity token)
    connect_timeout: float = 15.0
    read_timeout: float = 20.0
    allow: Callable[[str], str | None] = lambda _url: None
    token: str | None = None
    session: requests.Session = field(default_factory=web.new_session)

    def url(self, kind: str, reference: str) -> str:
        return f"{self.base}/v2/{self.repository}/{kind}/{reference}"

    def auth_headers(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.credentials:
            return {"Authorization": "Basic " + _basic(self.credentials)}
        return {}

    def _get(self, url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        why = self.allow(url)
        if why:
            raise web.HttpError(f"{url}: {why}")
        with web.get(
            url,
            headers=headers,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            allow=self.allow,
            session=self.session,
        ) as resp:
            return resp.status, dict(resp.headers), resp.read_all()

    def get(self, kind: str, reference: str, accept: str = "*/*") -> tuple[bytes, str]:
        """A manifest (kind "manifests") or a small blob ("blobs"): body and Content-Type."""
        url = self.url(kind, reference)
        status, headers, body = self._get(url, {"Accept": accept, **self.auth_headers()})
        if status == 401 and not self.token:
            self._login(headers.get("WWW-Authenticate") or headers.get("Www-Authenticate") or "")
            status, headers, body = self._get(url, {"Accept": accept, **self.auth_headers()})
        if status != 200:
            raise RegistryError(status, body[:200].decode("utf-8", "replace").strip() or "no detail")
        return body, headers.get("Content-Type", "")

    def _login(self, challenge: str) -> None:
        scheme, _, rest = challenge.partition(" ")
        if scheme.lower() == "basic" and self.credentials:
            return  # auth_headers() already sends Basic; the second request carries it
        if scheme.lower() != "bearer":
            raise RegistryError(401, f"the registry asks for {scheme or 'no'} authentication, not a bearer token")
        params = dict(_CHALLENGE.findall(rest))
        realm = params.pop("realm", "")
        if not realm:
            raise RegistryError(401, "the registry's Bearer challenge names no realm")
        params.setdefault("scope", f"repository:{self.repository}:pull")
        url = realm + ("&" if "?" in realm else "?") + urlencode(params)
        headers = {"Authorization": "Basic " + _basic(self.credentials)} if self.credentials else {}
        status, _headers, body = self._get(url, headers)
        if status != 200:
            raise RegistryError(status, f"the token service refused ({body[:200].decode('utf-8', 'replace')})")
        try:
            answer = json.loads(body)
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token or any(c in token for c in "\r\n"):
            raise RegistryError(401, "the token service answered without a usable token")
        self.token = token


def _basic(credentials: tuple[str, str]) -> str:
    return base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
