"""A real podman build of a test stack from a local base image (busybox-static imported
with podman): labels land on the image, a rebuild is fully cached, a failing step is named."""

from __future__ import annotations

import json
import re
import socketserver
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from provision.adapters import podman
from provision.cli import image as image_cli
from provision.cli import main
from provision.core import catalog, errors, pins
from provision.images import build as images

pytestmark = [pytest.mark.slow, pytest.mark.podman]


def smoke_catalog(tmp_path: Path, verify: list[str]) -> Path:
    data = {
        "stacks": {
            "busybox-smoke": {
                "description": "test stack on a local busybox base",
                "route": "cpu",
                "hosts": ["linux"],
                "base": "debian",
                "gpu": False,
                "mesa": "none",
                "packages": [],
                "guest_env": {"KRUN_GPU_TEST": "1"},
                "verify": verify,
            }
        }
    }
    path = tmp_path / f"stacks-{len(verify)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_build_labels_and_full_cache_on_rebuild(tmp_path, busybox_image, capsys):
    cat = catalog.load(smoke_catalog(tmp_path, ["busybox true", "test -d /opt"]))
    tag = "localhost/krun-gpu-test/busybox-smoke:labels"
    first = images.build("busybox-smoke", tag=tag, catalog=cat, base_image=busybox_image)
    labels = podman.labels(tag)
    assert labels["krun-gpu.stack"] == "busybox-smoke"
    assert labels["krun-gpu.route"] == "cpu" and labels["krun-gpu.gpu"] == "false"
    assert labels["org.opencontainers.image.base.name"] == busybox_image
    assert labels["krun-gpu.pin.debian.suite"] == "sid"
    assert first.result.layer_steps >= 4
    env = podman.inspect(tag)["Config"]["Env"]
    assert "KRUN_GPU_TEST=1" in env

    status = main(
        [
            "image",
            "build",
            "busybox-smoke",
            "--tag",
            tag,
            "--base-image",
            busybox_image,
            "--catalog",
            str(smoke_catalog(tmp_path, ["busybox true", "test -d /opt"])),
            "--json",
        ]
    )
    assert status == 0
    second = json.loads(capsys.readouterr().out)["data"]
    assert second["id"] == first.image_id
    assert second["layer_steps"] == first.result.layer_steps
    assert second["cached_steps"] == second["layer_steps"], "a rebuild must reuse every layer"
    assert second["size_bytes"] == podman.inspect(tag)["Size"] > 0
    assert second["package_stages"] == []

    # the text summary names every image it built, with its size
    assert main(["image", "build", "busybox-smoke", "--tag", tag, "--base-image", busybox_image,
                 "--catalog", str(smoke_catalog(tmp_path, ["busybox true", "test -d /opt"]))]) == 0
    out = capsys.readouterr().out
    size = image_cli.human_size(second["size_bytes"])
    assert re.search(rf"^\s+{re.escape(size)}  {re.escape(tag)}  \(the busybox-smoke image\)$", out, re.M), out


def test_human_sizes_are_binary_units():
    assert image_cli.human_size(512) == "512 B"
    assert image_cli.human_size(966_367_641) == "921.6 MiB"
    assert image_cli.human_size(1_203_589_846) == "1.1 GiB"


class _Hits(socketserver.BaseRequestHandler):
    """Counts connections and answers each with one line, then closes it."""

    hits = 0

    def handle(self) -> None:
        type(self).hits += 1
        self.request.sendall(b"reached\n")


def test_steps_after_the_package_step_have_no_network(tmp_path, busybox_image):
    """A step that connects to a server on 127.0.0.1 succeeds in a plain podman build of the
    rendered context and fails in provision's build, which runs it with the network off."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Hits)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # busybox-static's wget cannot run in a build here; its nc connects like any download would
        fetch = f"busybox nc -w 5 127.0.0.1 {server.server_address[1]}"
        cat = catalog.load(smoke_catalog(tmp_path, [fetch, "busybox true"]))
        stack = cat.get("busybox-smoke")
        # Offline first: a layer the online control build left behind would be reused from the cache.
        with pytest.raises(errors.ImageBuildFailed) as exc:
            images.build("busybox-smoke", tag="localhost/krun-gpu-test/busybox-smoke:offline", catalog=cat,
                         base_image=busybox_image, log=lambda _line: None)
        assert f"RUN {fetch}" in exc.value.message
        assert "network off" in exc.value.message
        assert _Hits.hits == 0, "the offline build reached the host"

        rendered = images.render_stack(stack, pins.default(), base_image=busybox_image)
        context = images.prepare_context(rendered, stack, None)
        flags = podman.decide_flags(podman.probe_host())
        podman.build(context, "localhost/krun-gpu-test/busybox-smoke:online", flags, log=lambda _line: None)
        assert _Hits.hits == 1, "the online control build must reach the server"
    finally:
        server.shutdown()
        # its cached layers must not stand in for an offline step of a later run
        subprocess.run(["podman", "rmi", "-f", "localhost/krun-gpu-test/busybox-smoke:online"], capture_output=True)


def test_failing_run_names_the_step(tmp_path, busybox_image, capsys):
    path = smoke_catalog(tmp_path, ["busybox true", "false"])
    with pytest.raises(errors.ImageBuildFailed) as exc:
        images.build(
            "busybox-smoke",
            tag="localhost/krun-gpu-test/busybox-smoke:fails",
            catalog=catalog.load(path),
            base_image=busybox_image,
        )
    assert "RUN false" in exc.value.message and "STEP " in exc.value.message
    status = main(
        [
            "image",
            "build",
            "busybox-smoke",
            "--tag",
            "localhost/krun-gpu-test/busybox-smoke:fails",
            "--base-image",
            busybox_image,
            "--catalog",
            str(path),
        ]
    )
    err = capsys.readouterr().err
    assert status == errors.ImageBuildFailed.exit_status
    assert "E005" in err and "RUN false" in err


def test_host_flags_follow_the_host():
    legacy = podman.decide_flags(podman.HostFacts("tmpfs", False, True))
    assert legacy.args() == ["--isolation=chroot", "--cgroup-manager=cgroupfs"]
    modern = podman.decide_flags(podman.HostFacts("cgroup2fs", True, False))
    assert modern.args() == []
    chosen = podman.decide_flags(podman.HostFacts("cgroup2fs", True, False), "oci", "PROVISION_PODMAN_ISOLATION=oci")
    assert chosen.isolation == "oci" and "PROVISION_PODMAN_ISOLATION=oci set" in chosen.reasons


def test_the_podman_isolation_setting_reaches_the_build_flags(monkeypatch):
    monkeypatch.setattr(podman, "probe_host", lambda: podman.HostFacts("cgroup2fs", True, False))
    monkeypatch.delenv("PROVISION_PODMAN_ISOLATION", raising=False)
    assert images.host_flags().isolation is None
    monkeypatch.setenv("PROVISION_PODMAN_ISOLATION", "oci")
    assert images.host_flags().isolation == "oci"


def test_step_lines_of_single_and_multi_stage_builds_are_recognised():
    assert podman.parse_step("STEP 3/5: RUN false") == "3/5 RUN false"
    assert podman.parse_step("[1/2] STEP 7/7: RUN cmake -S /src") == "7/7 RUN cmake -S /src"
    assert podman.parse_step("--> Using cache 1234") is None


def test_model_baked_into_the_image_is_verified_on_host_and_in_build(tmp_path, busybox_image):
    from provision.images import render
    from provision.models import store as models

    cat = catalog.load(smoke_catalog(tmp_path, ["busybox true"]))
    tag = "localhost/krun-gpu-test/busybox-smoke:model"
    built = images.build("busybox-smoke", tag=tag, catalog=cat, base_image=busybox_image, model="tiny-llama")
    blob = models.ensure("tiny-llama")
    digest = blob.name.removeprefix("sha256-")
    labels = podman.labels(tag)
    assert labels["krun-gpu.model.tiny-llama.sha256"] == digest
    assert labels["krun-gpu.model.path"] == "/opt/models/tiny-llama.gguf"
    rootfs = images.export_rootfs(built.ref, tmp_path / "rootfs")
    baked = rootfs / "opt" / "models" / "tiny-llama.gguf"
    assert baked.read_bytes() == blob.read_bytes()
    assert not (rootfs / "opt" / "models" / "SHA256SUMS.model").exists()

    # The in-build check is real: a context whose model bytes differ from the hash fails there.
    stack = cat.get("busybox-smoke")
    wrong = render.ModelInput("tiny-llama", "tiny-llama.gguf", "0" * 64)
    rendered = images.render_stack(stack, pins.default(), base_image=busybox_image, model=wrong)
    context = images.prepare_context(rendered, stack, blob)
    flags = podman.decide_flags(podman.probe_host())
    with pytest.raises(errors.ImageBuildFailed) as exc:
        podman.build(context, "localhost/krun-gpu-test/busybox-smoke:badmodel", flags, log=lambda _line: None)
    assert "sha256sum -c SHA256SUMS.model" in exc.value.message
