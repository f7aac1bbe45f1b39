"""RamaLama-style OCI model images: the GGUF is a file in the image's last tar layer (gzip or not, OCI or
Docker manifest). The pull fetches that layer by its digest (resumable, refused when the bytes are not
the digest), reads the GGUF out by its magic (RamaLama names it /models/NAME/NAME, no .gguf), stores
it as a blob of its own sha256 and keeps nothing else. Against the loopback registry of
tests/models/registries.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from provision import cli
from provision.core import errors
from tests.models import models_http, registries


def ramalama_raw(gguf: bytes, compression: str) -> list[bytes]:
    """RamaLama's raw image: a first layer with /models and the model.file link, then the model's own."""
    first = registries.tar_layer([("models/", b""), ("models/model.file", "->aimodel")], compression)
    last = registries.tar_layer([("models/", b""), ("models/aimodel/", b""), ("models/aimodel/README", b"notes\n"),
                                 ("models/aimodel/aimodel", gguf)], compression)  # fmt: skip
    return [first, last]


def pull(server: models_http.ModelServer, *args: str, transport: str = "oci", repo: str = "rl/kquant") -> int:
    host = server.base.removeprefix("http://")
    return cli.main(["model", "pull", f"{transport}://{host}/{repo}:latest", *args])


@pytest.mark.parametrize("compression,docker", [("gzip", False), ("tar", False), ("gzip", True)],
                         ids=["oci-gzip", "oci-tar", "docker-gzip"])  # fmt: skip
def test_the_gguf_in_an_images_last_layer_is_pulled_verified_and_stored(cache, server, tiny, compression, docker,
                                                                        capsys):  # fmt: skip
    layers = ramalama_raw(tiny, compression)
    paths = registries.publish_image(server, layers, compression, docker=docker)
    assert pull(server, "--json", transport="docker" if docker else "oci") == 0
    report = json.loads(capsys.readouterr().out)["data"]
    sha = hashlib.sha256(tiny).hexdigest()
    assert (report["name"], report["sha256"], report["size"], report["pin_status"]) == ("kquant-latest", sha,
                                                                                        len(tiny), "LAYER")
    assert (cache / "blobs" / f"sha256-{sha}").read_bytes() == tiny
    assert sorted(p.name for p in (cache / "blobs").iterdir()) == [f"sha256-{sha}"]  # the layer is not kept
    assert not any((cache / "partial").iterdir())
    fetched = [r.path for r in server.requests if "/blobs/" in r.path]
    assert fetched == [paths[-1]]  # only the last layer: the first (a link) is never fetched
    assert cli.main(["model", "verify", "kquant-latest"]) == 0
    capsys.readouterr()
    # the same image again: the ref says which layer it was read from, so nothing is fetched
    assert pull(server, "--json", transport="docker" if docker else "oci") == 0
    again = json.loads(capsys.readouterr().out)["data"]
    assert (again["sha256"], again["reused"], again["fetched_bytes"]) == (sha, True, 0)
    assert [r.path for r in server.requests if "/blobs/" in r.path] == [paths[-1]]
    assert cli.main(["model", "inspect", "oci://" + server.base.removeprefix("http://") + "/rl/kquant:latest",
                     "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["data"]["architecture"] == "llama"


def test_an_image_layer_survives_a_close_midway_and_resumes_with_a_range(cache, server, tiny, monkeypatch, capsys):
    layers = ramalama_raw(tiny, "tar")
    paths = registries.publish_image(server, layers, "tar")
    half = len(layers[-1]) // 2
    server.path_plans[paths[-1]] = [f"truncate_at:{half}"]
    assert pull(server) == 0
    assert "connection closed after byte" in capsys.readouterr().err
    requests = [r for r in server.requests if r.path == paths[-1]]
    assert requests[-1].status == 206 and requests[-1].range == f"bytes={half}-"
    assert (cache / "blobs" / f"sha256-{hashlib.sha256(tiny).hexdigest()}").read_bytes() == tiny


def test_a_layer_that_is_not_its_digest_stores_nothing(cache, server, tiny, capsys):
    layers = ramalama_raw(tiny, "gzip")
    other = ramalama_raw(tiny[:-1] + bytes([tiny[-1] ^ 1]), "gzip")[-1]
    registries.publish_image(server, layers, "gzip", served=other[: len(layers[-1])].ljust(len(layers[-1]), b"\0"))
    assert pull(server) == errors.ModelHashMismatch.exit_status
    assert "E011" in capsys.readouterr().err
    assert not any((cache / "blobs").iterdir()) and not any((cache / "refs").iterdir())
    assert not any((cache / "partial").glob("*.partial")) and not any((cache / "partial").glob("*.layer"))


def test_a_last_layer_without_a_gguf_is_e010_and_leaves_nothing(cache, server, tiny, capsys):
    layers = [registries.tar_layer([("models/", b""), ("models/notes.txt", b"no model here\n")], "gzip")]
    registries.publish_image(server, layers, "gzip")
    assert pull(server) == errors.UnknownModel.exit_status
    err = capsys.readouterr().err
    assert "holds no GGUF file" in err and "fix:" in err
    assert not any((cache / "blobs").iterdir()) and not any((cache / "refs").iterdir())
    assert not any((cache / "partial").iterdir())


def test_split_parts_in_one_layer_become_one_split_model(cache, server, tiny, capsys):
    parts = [("models/m/split-00001-of-00002.gguf", tiny), ("models/m/split-00002-of-00002.gguf", tiny[:-1] + b"\1")]
    registries.publish_image(server, [registries.tar_layer(parts, "gzip")], "gzip", repo="rl/split")
    assert pull(server, "--json", repo="rl/split") == 0
    ref = json.loads((cache / "refs" / "split-latest.json").read_text())
    assert [p["file"] for p in ref["parts"]] == ["split-00001-of-00002.gguf", "split-00002-of-00002.gguf"]
    assert [p["sha256"] for p in ref["parts"]] == [hashlib.sha256(d).hexdigest() for _, d in parts]
    path = Path(json.loads(capsys.readouterr().out)["data"]["path"])
    assert path.name == "split-00001-of-00002.gguf" and (path.parent / "split-00002-of-00002.gguf").exists()


@pytest.mark.slow
def test_an_image_podman_built_from_scratch_pulls(cache, server, tiny, tmp_path, capsys):
    """The bytes podman itself writes (`FROM scratch`, two COPYs, pushed as an OCI layout with gzip layers),
    served as they are: what the tour pushed to a registry and saw refused."""
    import shutil
    import subprocess
    import uuid

    podman = shutil.which("podman")
    assert podman, "podman is needed (scripts/setup-debian installs it)"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "model.gguf").write_bytes(tiny)
    (ctx / "notes.txt").write_text("pulled by digest\n")
    (ctx / "Containerfile").write_text("FROM scratch\nCOPY notes.txt /models/\nCOPY model.gguf /models/kquant/kquant\n"
                                       "LABEL org.containers.type=ai.image.model.raw\n")  # fmt: skip
    tag = f"localhost/krun-gpu-test-model-image:{uuid.uuid4().hex[:12]}"
    built = subprocess.run([podman, "build", "-q", "--isolation", "chroot", "-t", tag, str(ctx)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    try:
        layout = tmp_path / "layout"
        pushed = subprocess.run([podman, "push", "-q", "--compression-format", "gzip", tag, f"oci:{layout}"],
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert pushed.returncode == 0, pushed.stderr[-2000:]
    finally:
        subprocess.run([podman, "rmi", tag], capture_output=True, timeout=120)
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"]
    body = (layout / "blobs" / "sha256" / manifest_digest[7:]).read_bytes()
    manifest = json.loads(body)
    assert [la["mediaType"] for la in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar+gzip"] * 2
    for blob in (layout / "blobs" / "sha256").iterdir():
        server.files[f"/v2/rl/kquant/blobs/sha256:{blob.name}"] = blob.read_bytes()
    server.files["/v2/rl/kquant/manifests/latest"] = body
    server.types["/v2/rl/kquant/manifests/latest"] = manifest["mediaType"]
    assert pull(server, "--json") == 0
    report = json.loads(capsys.readouterr().out)["data"]
    assert report["sha256"] == hashlib.sha256(tiny).hexdigest() and report["size"] == len(tiny)
    last = manifest["layers"][-1]["digest"]
    assert [r.path for r in server.requests if "/blobs/" in r.path] == [f"/v2/rl/kquant/blobs/{last}"]
