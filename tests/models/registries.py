"""Models published on the loopback fault server (tests/models/models_http.py) the way each protocol serves them.

- an Ollama-style registry: /v2/REPO/manifests/TAG (the docker v2 manifest with ollama's layer
  types: model, template, params) and /v2/REPO/blobs/sha256:HEX;
- an OCI registry: the same API with an OCI manifest whose layer is the GGUF, behind the
  bearer-token flow when ``server.token`` is set;
- a Hugging Face-style hub: /api/models/ORG/REPO/tree/main?recursive=true (the file listing,
  with each LFS file's sha256) and /ORG/REPO/resolve/main/FILE.

Each ``publish_*`` returns the path of the GGUF blob(s) so a test can script faults on them.
``served`` lets a test serve other bytes than the ones the manifest/listing names (wrong digest).
"""

from __future__ import annotations

import hashlib
import json

from tests.models.models_http import ModelServer

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TEMPLATE = "{{ .System }} USER: {{ .Prompt }} ASSISTANT:"
PARAMS = {"stop": ["USER:"], "temperature": 0.2}


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blob(server: ModelServer, repo: str, data: bytes, served: bytes | None = None) -> str:
    path = f"/v2/{repo}/blobs/{digest(data)}"
    server.files[path] = data if served is None else served
    return path


def publish_ollama(
    server: ModelServer, gguf: bytes, repo: str = "library/tiny", tag: str = "latest", served: bytes | None = None
) -> str:
    template, params = TEMPLATE.encode(), json.dumps(PARAMS).encode()
    config = json.dumps({"model_format": "gguf", "model_family": "llama"}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": digest(config),
                   "size": len(config)},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": digest(gguf), "size": len(gguf)},
            {"mediaType": "application/vnd.ollama.image.template", "digest": digest(template), "size": len(template)},
            {"mediaType": "application/vnd.ollama.image.params", "digest": digest(params), "size": len(params)},
        ],
    }  # fmt: skip
    _blob(server, repo, config)
    _blob(server, repo, template)
    _blob(server, repo, params)
    path = f"/v2/{repo}/manifests/{tag}"
    server.files[path] = json.dumps(manifest).encode()
    server.types[path] = DOCKER_MANIFEST
    return _blob(server, repo, gguf, served)


def publish_oci(
    server: ModelServer,
    ggufs: list[tuple[str, bytes]],
    repo: str = "models/tiny",
    tag: str = "v1",
    media_type: str = "application/vnd.docker.ai.gguf.v3",
    served: bytes | None = None,
) -> list[str]:
    config = b'{"config": {"format": "gguf"}}'
    layers = [
        {"mediaType": media_type, "digest": digest(data), "size": len(data),
         "annotations": {"org.opencontainers.image.title": title}}
        for title, data in ggufs
    ]  # fmt: skip
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": "application/vnd.docker.ai.model.config.v0.1+json",
        "config": {"mediaType": "application/vnd.docker.ai.model.config.v0.1+json", "digest": digest(config),
                   "size": len(config)},
        "layers": layers,
    }  # fmt: skip
    _blob(server, repo, config)
    body = json.dumps(manifest).encode()
    for ref in (tag, digest(body)):
        server.files[f"/v2/{repo}/manifests/{ref}"] = body
        server.types[f"/v2/{repo}/manifests/{ref}"] = OCI_MANIFEST
    return [_blob(server, repo, data, served) for _title, data in ggufs]


def publish_hf(
    server: ModelServer, repo: str, files: dict[str, bytes], served: dict[str, bytes] | None = None
) -> dict[str, str]:
    listing = [{"type": "file", "oid": "0" * 40, "size": 12, "path": "README.md"}]
    paths = {}
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        listing.append({"type": "file", "oid": "1" * 40, "size": len(data), "path": name,
                        "lfs": {"oid": sha, "size": len(data), "pointerSize": 134}})  # fmt: skip
        paths[name] = f"/{repo}/resolve/main/{name}"
        server.files[paths[name]] = (served or {}).get(name, data)
    server.files[f"/api/models/{repo}/tree/main?recursive=true"] = json.dumps(listing).encode()
    return paths


IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TYPES = {  # compression -> (OCI layer type, Docker layer type)
    "tar": ("application/vnd.oci.image.layer.v1.tar", None),
    "gzip": ("application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip"),
}


def tar_layer(files: list[tuple[str, bytes | str]], compression: str) -> bytes:
    """A layer as podman/buildah write one: entries of ``(name, bytes)`` are files, ``(name, "->target")``
    symlinks, names ending in "/" directories; gzip-compressed when asked."""
    import gzip
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in files:
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mtime = 0
            if name.endswith("/"):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content.removeprefix("->")
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o644
                tar.addfile(info, io.BytesIO(content))
    data = raw.getvalue()
    return gzip.compress(data, mtime=0) if compression == "gzip" else data


def publish_image(
    server: ModelServer,
    layers: list[bytes],
    compression: str = "gzip",
    repo: str = "rl/kquant",
    tag: str = "latest",
    docker: bool = False,
    served: bytes | None = None,
) -> list[str]:
    """A container image whose layers are tars (the model in one of them), as RamaLama and podman push it."""
    oci_type, docker_type = LAYER_TYPES[compression]
    layer_type = docker_type if docker and docker_type else oci_type
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {
        "org.containers.type": "ai.image.model.raw"}}, "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    manifest_type = DOCKER_MANIFEST if docker else OCI_MANIFEST
    manifest = {
        "schemaVersion": 2,
        "mediaType": manifest_type,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json" if docker else IMAGE_CONFIG,
                   "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": layer_type, "digest": digest(data), "size": len(data)} for data in layers],
    }  # fmt: skip
    _blob(server, repo, config)
    path = f"/v2/{repo}/manifests/{tag}"
    server.files[path] = json.dumps(manifest).encode()
    server.types[path] = manifest_type
    return [_blob(server, repo, data, served if i == len(layers) - 1 else None) for i, data in enumerate(layers)]
