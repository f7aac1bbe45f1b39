"""What `provision model pull` was asked for, as a value: names, URLs and hf:// references.

Pure: no network, no files. ``resolve()`` turns NAME | URL | hf://OWNER/REPO/FILE[@REV] into a
``ModelSpec`` (name, URL, expected sha256/size when known) or raises a typed error.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from provision.core.errors import BadModelName, InvalidValue, ToolMissing, UnknownModel
from provision.core.pins import ModelPin, Pins

# A name becomes a file name under refs/: one path component, no hidden files, no "..".
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_HF = re.compile(r"^hf://(?P<owner>[^/@]+)/(?P<repo>[^/@]+)/(?P<file>[^@]+?)(?:@(?P<rev>[^@/]+))?$")
# Hub repo ids, file path parts and revisions: what the hub itself accepts, nothing that a URL or
# a path would read differently (no '%', '?', '#', spaces, '..').
_HF_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_HF_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=,-]{0,199}$")
_HF_REV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class ModelSpec:
    """One model to fetch or synthesize. ``sha256``/``size`` are None when nobody pinned them."""

    name: str
    source: str
    url: str | None
    sha256: str | None
    size: int | None
    pin_status: str | None = None
    synth: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # e.g. a registry's bearer token (never stored)
    file: str | None = None  # a split GGUF part: the file name llama.cpp looks for beside part 1
    # The URL is an image layer (a tar, compressed so: transports.TAR_LAYERS) holding the GGUF;
    # sha256 and size are the layer's, and the GGUF's own are computed as it is read out.
    archive: str | None = None

    @property
    def pinned(self) -> bool:
        return self.sha256 is not None


def check_name(name: str) -> str:
    if not _NAME.match(name) or ".." in name:
        raise BadModelName(
            f"model name {name!r} is not allowed: use letters, digits and . _ + - (no '/', no '..', at most 128)",
            fix="pick another name with --name",
        )
    return name


def check_sha256(value: str) -> str:
    hexdigest = value.strip().lower()
    if hexdigest.startswith("sha256:") or hexdigest.startswith("sha256-"):
        hexdigest = hexdigest[7:]
    if not _SHA256.match(hexdigest):
        raise InvalidValue(
            f"--sha256 {value!r}: not 64 hexadecimal digits",
            fix="pass the file's sha256 (sha256sum FILE), or leave --sha256 out for an unpinned pull",
        )
    return hexdigest


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_refusal(url: str) -> str | None:
    """Why ``url`` may not be fetched, or None when it may: the one URL policy of the store.

    https everywhere. Plain http only to this machine (127.0.0.0/8, ::1, localhost): that is
    where the tests and a local mirror serve from, nothing crosses a network in clear text,
    and a model pulled without --sha256 cannot be swapped by anyone on the path. Every URL a
    pull touches passes here: typed ones, those built from hf:// refs and HF_ENDPOINT, and
    each redirect target.
    """
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        return "it contains spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number in 0-65535
        host = parts.hostname
    except ValueError as exc:
        return f"it is malformed ({exc})"
    if parts.scheme not in ("https", "http"):
        return f"scheme {parts.scheme or '(none)'!r} is not supported; use https"
    if not host:
        return "it names no host"
    if port == 0:
        return "port 0 is not a port one can connect to"
    if parts.username is not None or parts.password is not None:
        return "credentials in the URL would be stored in the ref and shown in logs"
    if parts.scheme == "http" and not is_loopback(host):
        return "plain http is only allowed to loopback (127.0.0.1, ::1, localhost); use https"
    return None


def check_url(url: str, what: str = "model URL") -> str:
    why = url_refusal(url)
    if why:
        raise InvalidValue(f"{what} {url!r}: {why}", fix="use https://HOST/PATH (plain http only to 127.0.0.1/::1)")
    return url


@dataclass(frozen=True)
class HfRef:
    repo_id: str
    filename: str
    revision: str | None

    def url(self, endpoint: str | None = None) -> str:
        # huggingface_hub builds the URL from its own default endpoint (HF_ENDPOINT overrides it):
        # this project never spells the hub's host name. Building a URL needs no network.
        if endpoint is not None:
            check_url(endpoint, "HF_ENDPOINT")
        try:
            from huggingface_hub import hf_hub_url  # imported late: it costs ~0.4 s at start-up
        except ImportError:
            raise ToolMissing(
                f"{self}: resolving hf:// references needs the huggingface_hub package",
                fix="pip install huggingface_hub (it comes with this project's dependencies)",
            ) from None
        try:
            url = hf_hub_url(self.repo_id, self.filename, revision=self.revision or "main", endpoint=endpoint)
        except ValueError as exc:  # HFValidationError is a ValueError
            raise BadModelName(f"{self}: {exc}", fix=_HF_FIX) from None
        return check_url(url, f"URL built from {self}")

    def __str__(self) -> str:
        return f"hf://{self.repo_id}/{self.filename}" + (f"@{self.revision}" if self.revision else "")


_HF_FIX = "write it as on the hub: hf://OWNER/REPO/PATH/FILE.gguf@REVISION"


def parse_hf(ref: str) -> HfRef:
    try:
        return _parse_hf(ref)
    except BadModelName as exc:
        raise BadModelName(exc.message, fix=_HF_FIX) from None


def _parse_hf(ref: str) -> HfRef:
    m = _HF.match(ref)
    if not m:
        raise BadModelName(f"{ref!r} is not an hf://OWNER/REPO/FILE[@REV] reference")
    filename = m["file"]
    if any(part in ("", ".", "..") for part in filename.split("/")):
        raise BadModelName(f"{ref!r}: the file path may not contain empty, '.' or '..' parts")
    for what, value, pattern in (("owner", m["owner"], _HF_ID), ("repo", m["repo"], _HF_ID)):
        if not pattern.match(value) or ".." in value:
            raise BadModelName(f"{ref!r}: {what} {value!r} is not a hub name (letters, digits, . _ -; no '..')")
    for part in filename.split("/"):
        if not _HF_PART.match(part):
            raise BadModelName(f"{ref!r}: file path part {part!r} has characters a hub path does not use")
    if m["rev"] is not None and (not _HF_REV.match(m["rev"]) or ".." in m["rev"]):
        raise BadModelName(f"{ref!r}: revision {m['rev']!r} is not a commit, tag or branch name")
    return HfRef(f"{m['owner']}/{m['repo']}", filename, m["rev"])


def _stem(path: str) -> str:
    name = PurePosixPath(unquote(path)).name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def _from_pin(pin: ModelPin, endpoint: str | None) -> ModelSpec:
    url = parse_hf(pin.hf).url(endpoint) if pin.hf else None
    return ModelSpec(pin.name, pin.hf or f"synth:{pin.synth}", url, pin.sha256, pin.size, pin.status, pin.synth)


def resolve(
    arg: str,
    pins: Pins,
    *,
    sha256: str | None = None,
    name: str | None = None,
    hf_endpoint: str | None = None,
) -> ModelSpec:
    """NAME | URL | hf://OWNER/REPO/FILE[@REV] (+ optional --sha256/--name) → ModelSpec."""
    want = check_sha256(sha256) if sha256 is not None else None  # "" is a bad hash, not "no hash"
    if name is not None:
        check_name(name)
    if arg.startswith("hf://"):
        ref = parse_hf(arg)
        for pin in pins.models.values():
            if pin.hf and parse_hf(pin.hf) == ref:
                spec = _from_pin(pin, hf_endpoint)
                return _with_overrides(spec, want, name, pins)
        spec = ModelSpec(_free_name(name or _stem(ref.filename), pins), str(ref), ref.url(hf_endpoint), want, None)
        return spec
    if "://" in arg:
        check_url(arg)
        return ModelSpec(_free_name(name or _stem(urlsplit(arg).path), pins), arg, arg, want, None)
    check_name(arg)
    found = pins.models.get(arg)
    if found is None:
        raise UnknownModel(
            f"model {arg!r} is not in the catalog ({pins.path} models: {', '.join(sorted(pins.models))})",
            fix="pull by URL or hf://OWNER/REPO/FILE@REV with --sha256, or pick a catalog name",
        )
    return _with_overrides(_from_pin(found, hf_endpoint), want, name, pins)


def _free_name(name: str, pins: Pins) -> str:
    """A store name for a non-catalog file: never a catalog name, which stays bound to its pin."""
    check_name(name)
    if name in pins.models:
        raise BadModelName(
            f"{name!r} is a catalog model ({pins.path} models.{name}); another file may not take its name",
            fix="pull it under another --name (or pull the catalog model by its name)",
        )
    return name


def _with_overrides(spec: ModelSpec, want: str | None, name: str | None, pins: Pins) -> ModelSpec:
    if want and want != spec.sha256:
        raise InvalidValue(
            f"--sha256 {want} contradicts {pins.path} models.{spec.name}.sha256 = {spec.sha256}",
            fix="drop --sha256 for catalog models, or pull the URL under another --name",
        )
    if name and name != spec.name:
        _free_name(name, pins)  # one catalog model may not take another's name either
        return ModelSpec(name, spec.source, spec.url, spec.sha256, spec.size, spec.pin_status, spec.synth)
    return spec
