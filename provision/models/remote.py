"""References that need the network to become files: registry manifests and the hub's file listings.

``plan()`` turns an ollama://, oci://, docker:// or hf.co/ reference into a Plan: the GGUF
file(s) to fetch, each with the sha256 the registry or the listing gives (the digest is the
pin), plus the small layers kept beside the model (ollama's template and params). The bytes
themselves go through the store's Downloader like any pull. Each request here is bounded in
time and retried like a download attempt; a wrong tag or an unknown repository is E010, an
authentication failure E012 with a fix naming --authfile.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from provision.adapters import http as web
from provision.adapters import registry as reg
from provision.core.errors import DownloadFailed, InvalidValue, UnknownModel
from provision.models import download, transports
from provision.models.refs import ModelSpec, check_name, check_url, is_loopback, url_refusal
from provision.models.transports import HfRepoRef, RegistryRef

T = TypeVar("T")
AUTH_FIX = "log in (podman login REGISTRY) or pass --authfile FILE (podman's auth.json format)"


@dataclass(frozen=True)
class Extra:
    role: str  # template, params, system, license
    sha256: str
    size: int


@dataclass(frozen=True)
class Plan:
    name: str
    source: str
    parts: tuple[ModelSpec, ...]  # one file, or the parts of a split GGUF in order
    extras: tuple[tuple[Extra, bytes], ...] = ()  # small layers, already fetched and verified

    @property
    def size(self) -> int | None:
        sizes = [p.size for p in self.parts]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)


def base_url(registry: str, what: str) -> str:
    """https://HOST (http:// for loopback, where the tests' registries listen)."""
    if "://" in registry:
        return check_url(registry.rstrip("/"), what)
    host = registry.rsplit(":", 1)[0] if not registry.endswith("]") else registry
    host = host.strip("[]")
    scheme = "http" if is_loopback(host) else "https"
    return check_url(f"{scheme}://{registry}", what)


def _retrying(what: str, call: Callable[[], T]) -> T:
    """``call`` with the download's attempt budget for transient failures (bounded in time)."""
    history: list[str] = []
    for attempt in range(1, download.MAX_ATTEMPTS + 1):
        try:
            return call()
        except reg.RegistryError as exc:
            if exc.status < 500 and exc.status not in (408, 429):
                raise
            history.append(str(exc))
        except web.HttpError as exc:
            raise DownloadFailed(f"{what}: {exc}") from None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out
            history.append(str(exc) or type(exc).__name__)
        if attempt < download.MAX_ATTEMPTS:
            time.sleep(min(download.BACKOFF_S * 2 ** (attempt - 1), download.BACKOFF_MAX_S))
    raise DownloadFailed(
        f"{what}: gave up after {download.MAX_ATTEMPTS} attempts: {'; '.join(dict.fromkeys(history))}",
        fix="check the reference, the registry (or HF_ENDPOINT) and the network, then run the pull again",
    )


# --- credentials ----------------------------------------------------------------------------------


def _auth_files() -> list[Path]:
    env = os.environ.get("REGISTRY_AUTH_FILE")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    home = Path.home()
    files = [Path(env)] if env else []
    if runtime:
        files.append(Path(runtime) / "containers" / "auth.json")
    return [*files, home / ".config" / "containers" / "auth.json", home / ".docker" / "config.json"]


def credentials(registry: str, authfile: Path | None) -> tuple[str, str] | None:
    """The user's login for ``registry`` from --authfile, else podman's and docker's usual files."""
    for path in [authfile] if authfile is not None else _auth_files():
        if path is None or (authfile is None and not path.is_file()):
            continue
        try:
            data: Any = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidValue(
                f"{path}: not a readable JSON auth file ({exc})",
                fix=f"repair {path} (podman login writes it), or pass another --authfile",
            ) from None
        auths = data.get("auths") if isinstance(data, dict) else None
        entry = auths.get(registry) if isinstance(auths, dict) else None
        if entry is None:
            if authfile is not None:
                fix = f"podman login --authfile {path} {registry}"
                raise InvalidValue(f"{path}: no auths.{registry!r} entry", fix=fix)
            continue
        try:
            user, _, password = base64.b64decode(entry["auth"], validate=True).decode("utf-8").partition(":")
        except (KeyError, TypeError, ValueError):
            raise InvalidValue(
                f"{path}: auths.{registry}.auth is not base64 of USER:PASSWORD", fix=f"podman login {registry}"
            ) from None
        return user, password
    return None


# --- registries -----------------------------------------------------------------------------------


def _manifest(client: reg.Registry, ref: RegistryRef, reference: str) -> Any:
    where = f"{ref} (manifest {reference})"
    try:
        body, _type = _retrying(where, lambda: client.get("manifests", reference, transports.MANIFEST_ACCEPT))
    except reg.RegistryError as exc:
        if exc.status in (401, 403):
            raise DownloadFailed(f"{where}: the registry refused access ({exc})", fix=AUTH_FIX) from None
        if exc.status == 404:
            raise UnknownModel(
                f"{where}: the registry has no such repository or tag ({exc})",
                fix="check the name and the tag (ollama: NAME:TAG as on the library page; oci: REPO:TAG)",
            ) from None
        raise DownloadFailed(f"{where}: {exc}") from None
    if reference.startswith("sha256:") and "sha256:" + hashlib.sha256(body).hexdigest() != reference:
        raise DownloadFailed(f"{where}: the manifest's bytes do not hash to the digest asked for")
    try:
        return json.loads(body)
    except ValueError:
        raise DownloadFailed(f"{where}: the manifest is not JSON", fix="check that REGISTRY is a registry") from None


def registry_plan(ref: RegistryRef, name: str | None, registry: str, authfile: Path | None, stall: float) -> Plan:
    base = base_url(registry, f"the {ref.transport} registry")
    client = reg.Registry(
        base, ref.repository, credentials(registry, authfile), min(download.CONNECT_TIMEOUT_S, stall), stall,
        url_refusal,
    )  # fmt: skip
    manifest = _manifest(client, ref, ref.reference)
    chosen = transports.index_choice(manifest, str(ref))
    if chosen:
        manifest = _manifest(client, ref, chosen)
    models, extras = transports.model_layers(manifest, ref, str(ref))
    titles = [la.title or f"{ref.stem}.gguf" for la in models]
    if len(models) > 1:
        transports.check_split(titles, str(ref))
    store_name = check_name(name or ref.stem.replace(":", "-"))
    headers = tuple(client.auth_headers().items())
    parts = tuple(
        ModelSpec(store_name, str(ref), client.url("blobs", la.digest), la.digest[7:], la.size,
                  "LAYER" if la.archive else "DIGEST", headers=headers, file=transports.split_name(title),
                  archive=la.archive)
        for la, title in zip(models, titles, strict=True)
    )  # fmt: skip
    kept = []
    for role, layer in sorted(extras.items()):
        if layer.size > web.SMALL_LIMIT:
            continue  # not a small text layer: nothing llama.cpp or inspect would use
        body, _ = _retrying(f"{ref} ({role} layer)", lambda d=layer.digest: client.get("blobs", d))  # type: ignore[misc]
        if "sha256:" + hashlib.sha256(body).hexdigest() != layer.digest:
            raise DownloadFailed(f"{ref}: the {role} layer does not hash to its digest {layer.digest}; nothing stored")
        kept.append((Extra(role, layer.digest[7:], len(body)), body))
    return Plan(store_name, str(ref), parts, tuple(kept))


# --- the hub's file listing -----------------------------------------------------------------------


def hf_endpoint() -> str:
    endpoint = os.environ.get("HF_ENDPOINT") or None
    if endpoint is None:
        from huggingface_hub import constants  # the client's default: this project never spells the hub's host

        endpoint = constants.ENDPOINT
    return check_url(endpoint.rstrip("/"), "HF_ENDPOINT")


def _listing(endpoint: str, ref: HfRepoRef, stall: float) -> list[Any]:
    url: str | None = f"{endpoint}/api/models/{quote(ref.repo_id)}/tree/main?recursive=true"
    entries: list[Any] = []
    for _page in range(100):  # the hub pages long listings (Link: rel="next")
        if url is None:
            return entries
        page_url = url

        def one(u: str = page_url) -> tuple[int, str | None, bytes]:
            with web.get(u, connect_timeout=min(download.CONNECT_TIMEOUT_S, stall), read_timeout=stall,
                         allow=url_refusal) as resp:  # fmt: skip
                if resp.status >= 500 or resp.status in (408, 429):
                    raise reg.RegistryError(resp.status, resp.reason)
                return resp.status, resp.header("Link"), resp.read_all()

        status, link, body = _retrying(f"{ref} (file listing)", one)
        if status == 404:
            raise UnknownModel(f"{ref}: the hub has no such repository (HTTP 404 for its file list)",
                               fix="check ORG/REPO as on the hub (case matters)")  # fmt: skip
        if status != 200:
            raise DownloadFailed(f"{ref}: the file list answered HTTP {status}", fix=AUTH_FIX.split(" or ")[0])
        try:
            page = json.loads(body)
        except ValueError:
            raise DownloadFailed(f"{ref}: the file list is not JSON", fix="check HF_ENDPOINT") from None
        entries.extend(page if isinstance(page, list) else [page])
        url = _next_link(link)
        if url is not None and url_refusal(url):
            raise DownloadFailed(f"{ref}: the file list's next page {url} is refused: {url_refusal(url)}")
    raise DownloadFailed(f"{ref}: the file list has more than 100 pages")


def _next_link(link: str | None) -> str | None:
    for part in (link or "").split(","):
        if 'rel="next"' in part and "<" in part and ">" in part:
            return part[part.index("<") + 1 : part.index(">")]
    return None


def hf_plan(ref: HfRepoRef, name: str | None, stall: float) -> Plan:
    from provision.models.refs import HfRef

    endpoint = hf_endpoint()
    files = transports.pick_gguf(transports.listed_files(_listing(endpoint, ref, stall), str(ref)), ref)
    first = files[0].path.rsplit("/", 1)[-1]
    stem = transports.split_name(first)
    stem_name = (stem.rsplit("-00001-of-", 1)[0] if stem else first[: -len(".gguf")])
    store_name = check_name(name or stem_name)
    parts = tuple(
        ModelSpec(store_name, str(ref), HfRef(ref.repo_id, f.path, None).url(endpoint), f.sha256, f.size, "LISTED",
                  file=transports.split_name(f.path))
        for f in files
    )  # fmt: skip
    return Plan(store_name, str(ref), parts)
