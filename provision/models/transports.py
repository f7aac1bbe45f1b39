"""References to models where users keep them, as values: ollama://, oci://, docker://, hf.co/ and ORG/REPO.

Pure: no network, no files. ``parse()`` turns a reference into a RegistryRef or an HfRepoRef (or
None: not one of these, the caller tries catalog names, URLs and hf://); ``model_layers()`` and
``pick_gguf()`` read a registry manifest and a repository's file listing. Every name that ends
up in a URL or a path is checked against what registries and the hub themselves accept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from provision.core.errors import BadModelName, InvalidValue, UnknownModel

# The distribution spec's grammar: path components of lowercase letters and digits joined by
# single separators, tags of at most 128 word characters, sha256 digests.
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?$|^\[[0-9A-Fa-f:.]+\](?::[0-9]{{1,5}})?$")
_HF_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_QUANT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)

OLLAMA_MODEL = "application/vnd.ollama.image.model"
# Layers kept beside the model: `model inspect` shows them, llama.cpp does not need them.
OLLAMA_EXTRAS = {
    "application/vnd.ollama.image.template": "template",
    "application/vnd.ollama.image.params": "params",
    "application/vnd.ollama.image.system": "system",
    "application/vnd.ollama.image.license": "license",
}
# OCI layers that are a GGUF file as is (Docker model artifacts, CNCF model spec, RamaLama raw).
GGUF_LAYERS = (
    "application/vnd.docker.ai.gguf.v3",
    "application/vnd.cncf.model.weight.v1.raw",
    "application/vnd.cncf.model.weight.v1.gguf",
    "application/vnd.oci.image.layer.v1.tar",  # RamaLama "raw": the layer is the file, titled *.gguf
)
# Image layers: a tar (compressed or not) of files. A RamaLama model image ("car" or "raw", or any
# `FROM scratch` + `COPY model.gguf`) keeps the GGUF as a file in its last layer. Value: the compression.
TAR_LAYERS = {
    "application/vnd.oci.image.layer.v1.tar": "tar",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
}
TITLE = "org.opencontainers.image.title"
INDEXES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_ACCEPT = ", ".join((
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    *INDEXES,
))  # fmt: skip
DEFAULT_QUANT = "Q4_K_M"  # what ollama and the hub's ollama integration choose when none is named
TRANSPORTS = "ollama://NAME[:TAG], oci://REGISTRY/REPO:TAG, docker://[REGISTRY/]REPO:TAG, hf.co/ORG/REPO[:QUANT]"


@dataclass(frozen=True)
class RegistryRef:
    transport: str  # "ollama", "oci" or "docker"
    registry: str | None  # host[:port]; None: the configured default for the transport
    repository: str  # e.g. library/llama3.2
    reference: str  # a tag, or sha256:<hex>

    def __str__(self) -> str:
        host = f"{self.registry}/" if self.registry else ""
        sep = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.transport}://{host}{self.repository}{sep}{self.reference}"

    @property
    def stem(self) -> str:
        """A store name: the last path component and the tag (``llama3.2-1b``)."""
        last = self.repository.rsplit("/", 1)[-1]
        return last if self.reference.startswith("sha256:") else f"{last}-{self.reference}"


@dataclass(frozen=True)
class HfRepoRef:
    repo_id: str
    quant: str | None

    def __str__(self) -> str:
        return f"hf.co/{self.repo_id}" + (f":{self.quant}" if self.quant else "")


@dataclass(frozen=True)
class Layer:
    digest: str  # sha256:<hex>
    size: int
    media_type: str
    title: str | None
    archive: str | None = None  # the GGUF is a file inside this tar layer, compressed so (TAR_LAYERS)


def _bad(ref: str, why: str, fix: str) -> BadModelName:
    return BadModelName(f"{ref!r}: {why}", fix=fix)


def _looks_like_host(part: str) -> bool:
    return "." in part or ":" in part or part == "localhost" or part.startswith("[")


def _registry_ref(ref: str, transport: str, rest: str) -> RegistryRef:
    fix = {
        "ollama": "write it as ollama://[REGISTRY/]NAME[:TAG], e.g. ollama://llama3.2:1b",
        "oci": "write it as oci://REGISTRY/REPO:TAG (or @sha256:DIGEST)",
        "docker": "write it as docker://[REGISTRY/]REPO:TAG",
    }[transport]
    if not rest or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in rest) or "?" in rest or "#" in rest:
        raise _bad(ref, "empty, or has spaces, control characters, '?' or '#'", fix)
    digest = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise _bad(ref, f"digest {digest!r} is not sha256: and 64 lowercase hex digits", fix)
    parts = rest.split("/")
    registry = None
    if len(parts) > 1 and _looks_like_host(parts[0]):
        registry = parts.pop(0)
        if not _HOST.match(registry):
            raise _bad(ref, f"registry {registry!r} is not a host[:port]", fix)
    tag = None
    if parts and ":" in parts[-1]:
        parts[-1], tag = parts[-1].split(":", 1)
        if not _TAG.match(tag):
            raise _bad(ref, f"tag {tag!r} is not a tag (letters, digits, . _ -, at most 128)", fix)
    for part in parts:
        if part in ("", ".", "..") or not _COMPONENT.match(part):
            raise _bad(ref, f"repository part {part!r} is not one a registry accepts (lowercase, digits, . _ -)", fix)
    if transport == "oci" and registry is None:
        raise _bad(ref, "an oci:// reference names its registry", fix)
    if transport == "ollama" and len(parts) == 1:
        parts.insert(0, "library")  # ollama's namespace for its own models
    if transport == "docker" and len(parts) == 1 and registry is None:
        parts.insert(0, "library")
    if len(parts) > 8:
        raise _bad(ref, "too many repository path parts", fix)
    return RegistryRef(transport, registry, "/".join(parts), digest or tag or "latest")


def _hf_repo_ref(ref: str, body: str) -> HfRepoRef:
    fix = "write it as hf.co/ORG/REPO[:QUANT] (or ORG/REPO[:QUANT]), e.g. hf.co/ORG/REPO-GGUF:Q4_K_M"
    quant = None
    if ":" in body:
        body, quant = body.split(":", 1)
        if not _QUANT.match(quant):
            raise _bad(ref, f"quantization {quant!r} is not one (letters, digits, _ . -)", fix)
    parts = body.split("/")
    if len(parts) != 2:
        raise _bad(ref, "not ORG/REPO: a repository is two names joined by one '/'", fix)
    for part in parts:
        if not _HF_ID.match(part) or ".." in part:
            raise _bad(ref, f"{part!r} is not a hub name (letters, digits, . _ -; no '..')", fix)
    return HfRepoRef("/".join(parts), quant)


def parse(ref: str) -> RegistryRef | HfRepoRef | None:
    """The reference as a transport's value; None when it is a catalog name, a URL or hf://."""
    for transport in ("ollama", "oci", "docker"):
        if ref.startswith(f"{transport}://"):
            return _registry_ref(ref, transport, ref[len(transport) + 3 :])
    for prefix in ("hf.co/",):
        if ref.startswith(prefix):
            return _hf_repo_ref(ref, ref[len(prefix) :])
    if "://" in ref:
        return None
    if ref.count("/") == 1 and not ref.startswith(("/", ".")) and not ref.endswith("/"):
        owner = ref.split("/", 1)[0]
        if owner not in (".", "..") and not any(c in ref for c in "\\ \n\t"):
            return _hf_repo_ref(ref, ref)
    if ":" in ref and "/" not in ref:  # what ollama users type: llama3.2:1b
        return _registry_ref(ref, "ollama", ref)
    return None


# --- registry manifests ---------------------------------------------------------------------------


def _layers(manifest: Any, where: str) -> list[Layer]:
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise InvalidValue(f"{where}: the manifest has no layers list", fix="check the reference: is it a model?")
    out = []
    for i, layer in enumerate(layers):
        ok = isinstance(layer, dict) and isinstance(layer.get("digest"), str) and _DIGEST.match(layer["digest"])
        size = layer.get("size") if isinstance(layer, dict) else None
        if not ok or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidValue(f"{where}: layer {i} has no sha256 digest and size", fix="check the registry")
        annotations = layer.get("annotations") if isinstance(layer.get("annotations"), dict) else {}
        title = annotations.get(TITLE) if isinstance(annotations.get(TITLE), str) else None
        out.append(Layer(layer["digest"], size, str(layer.get("mediaType", "")), title))
    return out


def index_choice(manifest: Any, where: str) -> str | None:
    """For an image index: the digest of its first manifest (models are one platform); else None."""
    if not isinstance(manifest, dict) or manifest.get("mediaType") not in INDEXES:
        return None
    entries = manifest.get("manifests")
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        raise InvalidValue(f"{where}: an image index with no manifests", fix="check the reference")
    digest = entries[0].get("digest")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise InvalidValue(f"{where}: the index's first manifest has no sha256 digest", fix="check the registry")
    return digest


def model_layers(manifest: Any, ref: RegistryRef, where: str) -> tuple[list[Layer], dict[str, Layer]]:
    """The GGUF layers (in order; more than one: a split model) and the extras by role."""
    layers = _layers(manifest, where)
    if ref.transport == "ollama":
        models = [layer for layer in layers if layer.media_type == OLLAMA_MODEL]
        extras = {OLLAMA_EXTRAS[la.media_type]: la for la in layers if la.media_type in OLLAMA_EXTRAS}
    else:
        models = [la for la in layers if la.media_type in GGUF_LAYERS[:3] or (la.title or "").lower().endswith(".gguf")]
        extras = {}
    tars = [la for la in layers if la.media_type in TAR_LAYERS] if ref.transport != "ollama" else []
    if not models and tars:
        # An image: its model was copied in last (RamaLama's car and raw images, `COPY model.gguf`), so
        # the last layer is the one to open; the caller finds the GGUF in it and checks the layer's digest.
        last = tars[-1]
        return [Layer(last.digest, last.size, last.media_type, last.title, TAR_LAYERS[last.media_type])], extras
    if not models:
        kinds = ", ".join(sorted({la.media_type for la in layers})) or "none"
        raise UnknownModel(
            f"{where}: no layer holds a GGUF file (layer types: {kinds})",
            fix="point at a model: an artifact whose layer is the .gguf file, or an image with the .gguf in a layer",
        )
    return models, extras


# --- Hugging Face file listings ---------------------------------------------------------------------


@dataclass(frozen=True)
class ListedFile:
    path: str
    size: int
    sha256: str


def listed_files(listing: Any, where: str) -> list[ListedFile]:
    """The LFS files of a tree listing (those have a sha256; small git files do not matter here)."""
    if not isinstance(listing, list):
        raise InvalidValue(f"{where}: the file listing is not a JSON list", fix="check HF_ENDPOINT and the repo")
    out = []
    for entry in listing:
        if not isinstance(entry, dict) or entry.get("type") != "file" or not isinstance(entry.get("path"), str):
            continue
        lfs = entry.get("lfs")
        if not isinstance(lfs, dict):
            continue
        sha, size = lfs.get("oid", lfs.get("sha256")), lfs.get("size", entry.get("size"))
        if isinstance(sha, str) and re.match(r"^[0-9a-f]{64}$", sha) and isinstance(size, int) and size >= 0:
            out.append(ListedFile(entry["path"], size, sha))
    return out


def _quant_of(path: str) -> str | None:
    name = path.rsplit("/", 1)[-1]
    split = _SPLIT.match(name)
    stem = split["stem"] if split else name[: -len(".gguf")]
    m = re.search(r"(?:^|[-._])((?:I?Q\d[A-Z0-9_]*|F16|BF16|F32))$", stem, re.I)
    return m.group(1).upper() if m else None


def pick_gguf(files: list[ListedFile], ref: HfRepoRef) -> list[ListedFile]:
    """The file (or the split parts, in order) for the reference's quantization."""
    ggufs = [f for f in files if f.path.lower().endswith(".gguf") and "mmproj" not in f.path.lower()]
    if not ggufs:
        raise UnknownModel(f"{ref}: the repository lists no .gguf file", fix="pick a repository that has GGUF files")
    quants = sorted({q for f in ggufs if (q := _quant_of(f.path))})
    want = (ref.quant or DEFAULT_QUANT).upper()
    chosen = [f for f in ggufs if _quant_of(f.path) == want]
    if not chosen and ref.quant is None and len({_SPLIT.sub(r"\g<stem>", f.path) for f in ggufs}) == 1:
        chosen = ggufs  # one model in the repo: no choice to make
    if not chosen:
        raise UnknownModel(
            f"{ref}: no GGUF file for quantization {want} (the repository has: {', '.join(quants) or 'unnamed'})",
            fix=f"add the quantization: {ref.repo_id}:{quants[0] if quants else 'QUANT'}",
        )
    groups: dict[str, list[ListedFile]] = {}
    for f in chosen:
        split = _SPLIT.match(f.path.rsplit("/", 1)[-1])
        groups.setdefault(split["stem"] if split else f.path, []).append(f)
    if len(groups) > 1:
        raise UnknownModel(
            f"{ref}: {len(groups)} files match {want}: {', '.join(sorted(groups))}",
            fix="pull the one you mean by its file: hf://ORG/REPO/FILE.gguf",
        )
    parts = sorted(next(iter(groups.values())), key=lambda f: f.path)
    check_split([p.path for p in parts], str(ref))
    return parts


def check_split(paths: list[str], where: str) -> bool:
    """A split model must be every part 1..N of one N, once each; a single file is not split."""
    if len(paths) == 1 and not _SPLIT.match(paths[0].rsplit("/", 1)[-1]):
        return True
    found = [_SPLIT.match(p.rsplit("/", 1)[-1]) for p in paths]
    counts = {int(m["count"]) for m in found if m}
    indexes = sorted(int(m["index"]) for m in found if m)
    if None in found or len(counts) != 1 or indexes != list(range(1, next(iter(counts)) + 1)):
        raise UnknownModel(
            f"{where}: split GGUF parts are incomplete or mixed ({', '.join(paths)})",
            fix="every part -0000K-of-0000N.gguf for K = 1..N must be there",
        )
    return True


def split_name(path: str) -> str | None:
    """For a split part, the file name llama.cpp expects beside part 1; None when not split."""
    name = path.rsplit("/", 1)[-1]
    return name if _SPLIT.match(name) else None
