"""checks/macho-link: the darwin virglrenderer trees cross-built for aarch64-macos with zig.

Fast tests drive the pieces against real input (zig's own link of a small library, the pinned
tarballs, our darwin patch series); the `slow` ones build the pinned trees' library target: ours
must link and export what libkrun calls on macOS, CamouflageNetworks 8c349fc0 as pinned must not."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "checks"))

from macho_link import check, macho, toolchain, trees  # noqa: E402

UPSTREAM = REPO.parent / "shared" / "upstream"
EGG = [
    "egg_virgl_get_mtl_buffer_contents",
    "egg_virgl_track_metal_texture_with_memory",
    "egg_virgl_untrack_blob_sync_by_ptr",
    "egg_virgl_untrack_metal_texture",
]


def tarball(name: str) -> Path:
    path = UPSTREAM / trees.pin_of(name)["upstream_tarball"]
    assert path.is_file(), f"{path} missing: the pinned tarballs live in ../shared/upstream (CI has the same copy)"
    return path


def zig_link(tmp_path: Path, source: str) -> tuple[int, Path]:
    tools = toolchain.wrappers(tmp_path / "bin")
    (tmp_path / "lib.c").write_text(source)
    out = tmp_path / "libt.dylib"
    rc = toolchain.run(
        [
            str(tools["cc"]),
            "-target",
            toolchain.TARGET,
            "-shared",
            "-Wl,--no-undefined",
            "-o",
            str(out),
            str(tmp_path / "lib.c"),
        ],
        log=tmp_path / "log",
    )
    return rc, out


# --- Mach-O reading ----------------------------------------------------------------------------


def test_zig_links_a_real_arm64_dylib_and_its_exports_are_read(tmp_path: Path) -> None:
    rc, out = zig_link(tmp_path, "int virgl_a(void);\nint virgl_a(void) { return 1; }\nint hidden_b;\n")
    assert rc == 0, (tmp_path / "log").read_text()
    image = macho.parse(out.read_bytes())
    assert image.is_arm64_dylib
    assert {"virgl_a", "hidden_b"} <= image.exported


def test_an_undefined_symbol_fails_the_link_and_leaves_no_mach_o(tmp_path: Path) -> None:
    rc, out = zig_link(tmp_path, "void egg_x(void);\nvoid f(void);\nvoid f(void) { egg_x(); }\n")
    assert rc != 0
    assert "undefined symbol: _egg_x" in (tmp_path / "log").read_text()
    # zig leaves an empty (or no) file behind: the judge must not take it for a library
    with pytest.raises(macho.MachOError):
        macho.parse(out.read_bytes() if out.exists() else b"")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x7fELF" + b"\0" * 60,
        b"\xcf\xfa\xed\xfe" + b"\0" * 10,
        b"\xcf\xfa\xed\xfe" + b"\x0c\0\0\x01" + b"\0\0\0\0" + b"\x06\0\0\0" + b"\x05\0\0\0" + b"\0" * 12,
    ],
    ids=["empty", "elf", "truncated-header", "load-commands-missing"],
)
def test_hostile_files_are_refused_not_crashed(data: bytes) -> None:
    with pytest.raises(macho.MachOError):
        macho.parse(data)


def test_judge_names_missing_exports_and_wrong_handle_types(tmp_path: Path) -> None:
    rc, out = zig_link(tmp_path, "void virgl_renderer_init(void);\nvoid virgl_renderer_init(void) {}\n")
    assert rc == 0
    header = tmp_path / "virglrenderer.h"
    header.write_text(
        "#define VIRGL_RENDERER_BLOB_FD_TYPE_DMABUF 0x0001\n#define VIRGL_RENDERER_BLOB_FD_TYPE_SHM 0x0003\n"
    )
    result: dict = {"problems": []}
    check.judge(
        result,
        out,
        header,
        ["virgl_renderer_init", "virgl_renderer_resource_get_map_ptr"],
        {"VIRGL_RENDERER_BLOB_FD_TYPE_DMABUF": 1, "VIRGL_RENDERER_BLOB_FD_TYPE_APPLE": 4},
    )
    assert result["missing_exports"] == ["virgl_renderer_resource_get_map_ptr"]
    assert any("VIRGL_RENDERER_BLOB_FD_TYPE_APPLE" in p for p in result["problems"])


# --- trees: NAR-checked, patched -------------------------------------------------------------


def test_libkrun_maps_the_apple_handle_type_4(tmp_path: Path) -> None:
    types = check.libkrun_handle_types(UPSTREAM, tmp_path)
    assert types == {
        "VIRGL_RENDERER_BLOB_FD_TYPE_DMABUF": 1,
        "VIRGL_RENDERER_BLOB_FD_TYPE_OPAQUE": 2,
        "VIRGL_RENDERER_BLOB_FD_TYPE_SHM": 3,
        "VIRGL_RENDERER_BLOB_FD_TYPE_APPLE": 4,
    }


def test_a_tree_whose_nar_hash_differs_from_its_pin_is_refused(tmp_path: Path) -> None:
    real = tarball("virglrenderer-apir-macos")
    forged = tmp_path / real.name
    with tarfile.open(real) as src, tarfile.open(forged, "w:xz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None
            if member.name.endswith("src/virglrenderer.h"):
                data = data + b"/* changed */\n"
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    with pytest.raises(trees.TreeError, match="refused"):
        trees.unpack(forged, tmp_path / "out", trees.pin_of("virglrenderer-apir-macos")["hash"])
    assert not any((tmp_path / "out").iterdir()), "a refused tree must not be left for a build to pick up"


def test_each_darwin_patch_applies_to_the_pinned_apir_tree(tmp_path: Path) -> None:
    pin = trees.pin_of("virglrenderer-apir-macos")
    assert pin["rev"] == trees.pin_of("virglrenderer-apir")["rev"], "the darwin tree is the one the Linux route proves"
    src = trees.unpack(tarball("virglrenderer-apir-macos"), tmp_path, pin["hash"])
    log = tmp_path / "patch.log"
    before = (src / "src/virglrenderer.h").read_text()
    for rel in pin["patches"]:
        snapshot = subprocess.run(
            ["nix", "--extra-experimental-features", "nix-command", "hash", "path", str(src)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert trees.apply_patches(src, [rel], log) == [rel]
        after = subprocess.run(
            ["nix", "--extra-experimental-features", "nix-command", "hash", "path", str(src)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert after != snapshot, f"{rel} changed nothing"
    assert "offset" not in log.read_text() and "fuzz" not in log.read_text().lower().replace("--fuzz=0", "")
    header = (src / "src/virglrenderer.h").read_text()
    assert "VIRGL_RENDERER_BLOB_FD_TYPE_APPLE" not in before
    assert check.header_handle_types(src / "src/virglrenderer.h")["VIRGL_RENDERER_BLOB_FD_TYPE_APPLE"] == 4
    assert "VIRGL_EXPORT int virgl_renderer_resource_get_map_ptr(uint32_t res_handle, uint64_t *map_ptr);" in header
    library = (src / "src/venus/vkr_library.c").read_text()
    assert library.count('"libMoltenVK.dylib"') == 1
    assert library.index('"libMoltenVK.dylib"') < library.index('"libvulkan.1.dylib"')
    # applying again must fail: the series is not silently a no-op on an already patched tree
    with pytest.raises(trees.TreeError):
        trees.apply_patches(src, pin["patches"][:1], log)


# --- the real cross-builds (a few minutes each; cached under the provision cache by pin) -------


def cache() -> Path:
    from provision.core.paths import cache_dir

    return cache_dir("macho-link")


@pytest.mark.slow
def test_our_darwin_apir_tree_links_as_mach_o_with_libkrun_macos_abi() -> None:
    result = check.cached_check("virglrenderer-apir-macos", UPSTREAM, cache())
    assert result["problems"] == [], result
    assert result["link_rc"] == 0 and result["undefined"] == []
    assert result["missing_exports"] == []
    assert result["handle_types"]["VIRGL_RENDERER_BLOB_FD_TYPE_APPLE"] == 4
    assert "virgl_renderer_resource_get_map_ptr" in check.libkrun_macos_calls()
    assert result["exported_count"] >= len(check.libkrun_macos_calls())


@pytest.mark.slow
def test_camouflage_8c349fc0_as_pinned_fails_on_exactly_the_egg_virgl_symbols() -> None:
    result = check.cached_check("virglrenderer-apir-darwin", UPSTREAM, cache())
    assert result["rev"].startswith("8c349fc0")
    assert result["link_rc"] != 0
    assert result["undefined"] == EGG, result
    assert any("not a Mach-O" in p for p in result["problems"]), result["problems"]


# --- calls under __APPLE__: defined in the tree, libSystem, Vulkan or what the tree links -----


def test_apple_regions_are_the_true_branches_only(tmp_path: Path) -> None:
    from macho_link import apple_calls

    (tmp_path / "a.c").write_text(
        "#ifdef __APPLE__\nmissing_a();\n#else\nmissing_linux();\n#endif\n"
        "#ifndef __APPLE__\nmissing_b();\n#endif\n"
        "#if defined(__linux__)\nx();\n#elif defined(__APPLE__)\nmissing_c(); nanosleep(0, 0); vk->MapMemory(0);\n"
        '/* missing_comment(); */ puts("missing_string()");\n#endif\n'
        "static void defined_here(void) {}\n#ifdef __APPLE__\ndefined_here();\n#endif\n"
    )
    found = [(c.line, c.name) for c in apple_calls.undefined_apple_calls(tmp_path, [])]
    assert found == [(2, "missing_a"), (12, "missing_c")]


def test_camouflage_calls_four_functions_under_apple_that_nothing_defines(tmp_path: Path) -> None:
    from macho_link import apple_calls

    pin = trees.pin_of("virglrenderer-apir-darwin")
    src = trees.unpack(tarball("virglrenderer-apir-darwin"), tmp_path, pin["hash"])
    trees.apply_patches(src, pin["patches"], tmp_path / "log")
    undefined = apple_calls.undefined_apple_calls(src, [toolchain.HEADER_DIRS["epoxy"]])
    assert sorted({c.name for c in undefined}) == EGG
    assert {c.file for c in undefined} == {"src/venus/vkr_image.c", "src/venus/vkr_device_memory.c"}


def test_our_darwin_tree_calls_only_what_is_defined(tmp_path: Path) -> None:
    from macho_link import apple_calls

    pin = trees.pin_of("virglrenderer-apir-macos")
    src = trees.unpack(tarball("virglrenderer-apir-macos"), tmp_path, pin["hash"])
    trees.apply_patches(src, pin["patches"], tmp_path / "log")
    calls = {c.name for c in apple_calls.apple_calls(src)}
    assert {"nanosleep", "open", "dlopen"} <= calls, "the reading found none of our patches' macOS calls"
    assert apple_calls.undefined_apple_calls(src, [toolchain.HEADER_DIRS["epoxy"]]) == []


@pytest.mark.slow
def test_ggml_virtgpu_backend_and_base_link_as_mach_o_with_the_apir_plugin_abi() -> None:
    from macho_link import ggml

    result = ggml.cached_check(UPSTREAM, cache())
    assert result["problems"] == [], result
    assert result["build_rc"] == 0
    assert result["plugin_symbols"] == ["apir_backend_deinit", "apir_backend_dispatcher", "apir_backend_initialize"]
    assert result["missing_plugin_symbols"] == []
    assert result["patches"] == list(ggml.PATCHES)
