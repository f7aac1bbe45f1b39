"""checks/macho-link: the darwin virglrenderer trees cross-built for aarch64-macos with zig.

Fast tests drive the pieces against real input (zig's own link of a small library, the pinned
tarballs, our darwin patch series); the `slow` ones build every default target of the pinned trees
as Nix does (buildtype plain, auto_features enabled, the MoltenVK postPatch): our library must link
and export what libkrun calls on macOS, CamouflageNetworks 8c349fc0 as pinned must not; the tree
before the in-process series fails on the render server, and the series as pins.json lists it must
build every default target."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from dataclasses import replace
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


def test_ninja_failures_are_attributed_to_their_targets() -> None:
    from macho_link import targets

    defaults = {
        "server/virgl_render_server": {"name": "virgl_render_server", "type": "executable",
                                       "files": ["server/virgl_render_server"]},
        "src/libvirglrenderer.1.dylib": {"name": "virglrenderer", "type": "shared library",
                                         "files": ["src/libvirglrenderer.1.dylib"]},
    }  # fmt: skip
    log = (
        "[1/9] Compiling C object src/libvirglrenderer.1.dylib.p/virglrenderer.c.o\n"
        "FAILED: [code=1] server/virgl_render_server.p/render_socket.c.o\n"
        "zig-cc -c ../server/render_socket.c\n"
        "../server/render_socket.c:31:51: error: use of undeclared identifier 'SOCK_CLOEXEC'\n"
        "1 error generated.\n"
        "[2/9] Linking target src/libvirglrenderer.1.dylib\n"
        "FAILED: src/libvirglrenderer.1.dylib\n"
        "error: undefined symbol: _egg_x\n"
        "ninja: build stopped: cannot make progress due to previous errors.\n"
    )
    found = targets.failures(log)
    assert [outs for outs, _ in found] == [
        ["server/virgl_render_server.p/render_socket.c.o"],
        ["src/libvirglrenderer.1.dylib"],
    ]
    assert targets.owner(found[0][0][0], defaults) == "server/virgl_render_server"
    assert targets.owner(found[1][0][0], defaults) == "src/libvirglrenderer.1.dylib"
    assert targets.owner("src/mesa/libmesa.a.p/x.c.o", defaults) is None
    assert found[0][1] == ["../server/render_socket.c:31:51: error: use of undeclared identifier 'SOCK_CLOEXEC'"]


def test_an_empty_or_foreign_file_is_not_a_built_target(tmp_path: Path) -> None:
    from macho_link import targets

    rc, dylib = zig_link(tmp_path, "int f(void);\nint f(void) { return 0; }\n")
    assert rc == 0
    assert targets.file_problem(dylib, "shared library") is None
    assert "not an arm64 executable" in (targets.file_problem(dylib, "executable") or "")
    (tmp_path / "empty").write_bytes(b"")
    assert "not a Mach-O" in (targets.file_problem(tmp_path / "empty", "executable") or "")
    (tmp_path / "lib.a").write_bytes(b"")
    assert targets.file_problem(tmp_path / "lib.a", "static library") == "lib.a: not an ar archive"


def test_the_moltenvk_rule_fails_as_replace_fail_does(tmp_path: Path) -> None:
    pin = trees.pin_of("virglrenderer-apir-macos")
    src = trees.unpack(tarball("virglrenderer-apir-macos"), tmp_path, pin["hash"])
    log = tmp_path / "log"
    with pytest.raises(trees.TreeError, match="no \"libMoltenVK.dylib\" to replace"):
        trees.substitute(src, trees.MOLTENVK_RULE, trees.moltenvk_standin(), log)  # unpatched: 0003 adds it
    trees.apply_patches(src, pin["patches"], log)
    trees.substitute(src, trees.MOLTENVK_RULE, trees.moltenvk_standin(), log)
    library = (src / trees.MOLTENVK_RULE[0]).read_text()
    assert f'"{trees.moltenvk_standin()}"' in library and '"libMoltenVK.dylib"' not in library


def test_the_cache_key_follows_every_input() -> None:
    ours = trees.DARWIN_TREES["virglrenderer-apir-macos"]
    pin = trees.pin_of(ours.pin)
    key = trees.cache_key(ours, pin, "zig")
    assert key == trees.cache_key(ours, pin, "zig")
    assert key != trees.cache_key(ours, pin, "another zig")
    assert key != trees.cache_key(ours, {**pin, "hash": "sha256-x"}, "zig")
    assert key != trees.cache_key(replace(ours, meson_flags=ours.meson_flags[:-1]), pin, "zig")
    assert key != trees.cache_key(replace(ours, moltenvk_rule=None), pin, "zig")
    assert key != trees.cache_key(replace(ours, patches=tuple(pin["patches"][:1])), pin, "zig")
    # the same patches by another name are one build
    same = replace(ours, patches=tuple(pin["patches"]))
    assert trees.cache_key(same, pin, "zig") == key


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


def nix_options_ran(result: dict) -> None:
    """The build was configured as Nix configures it and built more than the library."""
    assert result["meson_options"] == list(trees.NIX_MESON_OPTIONS)
    log = Path(result["log"]).read_text("utf-8", "replace")
    assert "--buildtype=plain" in log and "-Dauto_features=enabled" in log
    # the trees default b_ndebug=if-release, and meson treats plain as release there: the Nix build
    # compiles assert() out, so the check must too
    assert result["ndebug"] is True
    # the library and the three static libraries it is made of, at least (with the render server
    # on, as in MR 1590 alone, a fifth)
    assert len(result["targets"]) >= 4 and "src/libvirglrenderer.1.dylib" in result["targets"]


@pytest.mark.slow
def test_the_darwin_tree_before_the_in_process_series_fails_on_the_render_server() -> None:
    """MR 1590 forces the render server on with Venus or APIR (meson.build:343) and installs it
    (server/meson.build:27-33): as Nix builds every default target, that server is built, and it
    uses Linux-only socket flags and signalfd. The library itself links."""
    result = check.cached_check("virglrenderer-apir-macos-0001-0003", UPSTREAM, cache())
    nix_options_ran(result)
    assert result["patches"] == list(trees.SERIES_BEFORE_IN_PROCESS)
    assert result["failed_targets"] == ["server/virgl_render_server"], result["failed_targets"]
    errors = "\n".join(result["targets"]["server/virgl_render_server"]["errors"])
    for missing in ("'SOCK_CLOEXEC'", "'MSG_CMSG_CLOEXEC'", "'sys/signalfd.h' file not found"):
        assert missing in errors, errors
    assert result["targets"]["src/libvirglrenderer.1.dylib"]["built"]
    assert result["problems"] == [], result["problems"]


@pytest.mark.slow
def test_every_default_target_of_our_darwin_tree_builds_with_the_nix_options() -> None:
    """The series pins.json lists (in-process contexts, no render server on darwin) builds every
    default target as Nix does; until that series is there, this fails on the render server."""
    result = check.cached_check("virglrenderer-apir-macos", UPSTREAM, cache())
    nix_options_ran(result)
    assert result["patches"] == trees.pin_of("virglrenderer-apir-macos")["patches"]
    failed = {t: result["targets"][t]["errors"][:3] for t in result["failed_targets"]}
    assert failed == {}, failed
    assert result["build_rc"] == 0
    # darwin/0004: on macOS the contexts live in the VMM's process, so no render server is built
    assert "server/virgl_render_server" not in result["targets"]


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
    # darwin/0001's nanosleep and darwin/0003's dlopen of MoltenVK
    assert {"nanosleep", "dlopen"} <= calls, "the reading found none of our patches' macOS calls"
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
