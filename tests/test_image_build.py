"""A real podman build of a test stack from a local base image (busybox-static imported
with podman): labels land on the image, a rebuild is fully cached, a failing step is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from provision import catalog, errors, images
from provision.adapters import podman
from provision.cli import main

pytestmark = pytest.mark.slow


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
    second = json.loads(capsys.readouterr().out)
    assert second["id"] == first.image_id
    assert second["layer_steps"] == first.result.layer_steps
    assert second["cached_steps"] == second["layer_steps"], "a rebuild must reuse every layer"


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
    legacy = podman.decide_flags(podman.HostFacts("tmpfs", False, True), env={})
    assert legacy.args() == ["--isolation=chroot", "--cgroup-manager=cgroupfs"]
    modern = podman.decide_flags(podman.HostFacts("cgroup2fs", True, False), env={})
    assert modern.args() == []
    assert (
        podman.decide_flags(
            podman.HostFacts("cgroup2fs", True, False), env={"PROVISION_PODMAN_ISOLATION": "oci"}
        ).isolation
        == "oci"
    )


def test_step_lines_of_single_and_multi_stage_builds_are_recognised():
    assert podman.parse_step("STEP 3/5: RUN false") == "3/5 RUN false"
    assert podman.parse_step("[1/2] STEP 7/7: RUN cmake -S /src") == "7/7 RUN cmake -S /src"
    assert podman.parse_step("--> Using cache 1234") is None
