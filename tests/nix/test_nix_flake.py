"""The flake, evaluated by real nix 2.8 with the stub nixpkgs: outputs, checks, and the exact
attributes each derivation hands to nixpkgs' builders (flags, sources, wrapper environment)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from provision.apir import ggml as ggml_build
from provision.core import pins as pins_mod

from .nix_facts import store_basename
from .nix_helpers import DARWIN, LINUX, REPO, STUB, Nix, copy_flake, require

FAKE_HASH = "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
SRI = re.compile(r"^sha256-[A-Za-z0-9+/]{43}=$")


@pytest.fixture(scope="module")
def nix(tmp_path_factory: pytest.TempPathFactory) -> Nix:
    return Nix(tmp_path_factory.mktemp("nix-home"), copy_flake(tmp_path_factory.mktemp("flake") / "repo"))


@pytest.fixture(scope="module")
def pins() -> pins_mod.Pins:
    return pins_mod.load()


def src_of(nix: Nix, system: str, package: str, field: str = "src") -> dict[str, Any]:
    return nix.eval(
        f"packages.{system}.{package}.{field}",
        "s: { hash = s.outputHash; rev = s.rev or null; tag = s.tag or null; owner = s.owner or null;"
        " repo = s.repo or null; url = s.url or null; mode = s.drvAttrs.outputHashMode; }",
    )


# --- outputs ---------------------------------------------------------------------------------


def test_flake_has_exactly_one_input_and_its_lock_matches_the_pins_file(pins: pins_mod.Pins) -> None:
    inputs = json.loads(
        subprocess.run(
            [require("nix-instantiate"), "--eval", "--strict", "--json", "--expr", "(import ./flake.nix).inputs"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert list(inputs) == ["nixpkgs"]
    lock = json.loads((REPO / "flake.lock").read_text())
    assert lock["nodes"]["root"]["inputs"] == {"nixpkgs": "nixpkgs"}
    assert set(lock["nodes"]) == {"root", "nixpkgs"}
    locked = lock["nodes"]["nixpkgs"]["locked"]
    pinned = pins.raw["nixpkgs"]
    assert re.fullmatch(r"[0-9a-f]{40}", pinned["rev"]) and SRI.match(pinned["narHash"])
    assert pinned["status"] != "UNVERIFIED"
    for key in ("rev", "narHash", "owner", "repo", "lastModified"):
        assert locked[key] == pinned[key], key
    assert inputs["nixpkgs"]["url"] == f"github:{pinned['owner']}/{pinned['repo']}/{pinned['ref']}"
    assert lock["nodes"]["nixpkgs"]["original"]["ref"] == pinned["ref"]


def test_flake_show_lists_darwin_first_packages_and_linux_subset(nix: Nix) -> None:
    shown = json.loads(nix.run("flake", "show", "--json", nix.flake, *nix.override()).stdout)
    darwin = set(shown["packages"][DARWIN])
    linux = set(shown["packages"][LINUX])
    assert darwin == {
        "default", "krun", "krunkit", "libkrun", "moltenvk", "virglrenderer-apir",
        "virglrenderer-venus", "ggml-virtgpu-backend", "provision",
        "krun-apir", "libkrun-apir", "krunkit-apir",
    }  # fmt: skip
    # krunkit, Metal and MoltenVK exist only on macOS.
    assert linux == {"default", "krun", "libkrun", "virglrenderer-apir", "ggml-virtgpu-backend", "provision"}
    assert set(shown["packages"]) == {DARWIN, LINUX, "aarch64-linux"}
    for section in ("apps", "devShells", "checks", "formatter"):
        assert DARWIN in shown[section] and LINUX in shown[section], section
    assert "default" in shown["overlays"]
    assert {"krunkit", "krunkit-apir", "krun-env", "provision", "default"} <= set(shown["apps"][DARWIN])
    assert set(shown["apps"][LINUX]) == {"krun-env", "provision", "default"}
    assert "lib-tests" in shown["checks"][LINUX]


def test_flake_check_no_build_passes(nix: Nix) -> None:
    nix.run("flake", "check", "--no-build", nix.flake, *nix.override())


def test_krunkit_app_runs_the_wrapped_krunkit_of_the_bundle(nix: Nix) -> None:
    krun = nix.eval(f"packages.{DARWIN}.krun.outPath")
    assert nix.eval(f"apps.{DARWIN}.krunkit.program") == f"{krun}/bin/krunkit"
    assert nix.eval(f"apps.{DARWIN}.default.program") == f"{krun}/bin/krunkit"
    krun_apir = nix.eval(f"packages.{DARWIN}.krun-apir.outPath")
    assert nix.eval(f"apps.{DARWIN}.krunkit-apir.program") == f"{krun_apir}/bin/krunkit"


def test_formatter_is_nixfmt_tree(nix: Nix) -> None:
    assert nix.eval(f"formatter.{DARWIN}.pname") == "nixfmt-tree"


# --- flags -----------------------------------------------------------------------------------


def test_virglrenderer_meson_flags_per_platform(nix: Nix) -> None:
    assert nix.eval(f"packages.{DARWIN}.virglrenderer-venus.drvAttrs.mesonFlags") == [
        "-Dvenus=true",
        "-Drender-server=false",
        "-Ddrm=disabled",
    ]
    # darwin APIR tree (MR 1590 head + our darwin patches): Vulkan dlopened (MoltenVK by store
    # path), since vulkan-dload=false would need a vulkan.pc that nixpkgs' moltenvk lacks.
    assert nix.eval(f"packages.{DARWIN}.virglrenderer-apir.drvAttrs.mesonFlags") == [
        "-Dvenus=true",
        "-Dapir=true",
        "-Dvulkan-dload=true",
    ]
    # MR 1590 head (1.2.0): no drm option; render-server deprecated, so not passed.
    assert nix.eval(f"packages.{LINUX}.virglrenderer-apir.drvAttrs.mesonFlags") == ["-Dvenus=true", "-Dapir=true"]


def test_darwin_apir_virglrenderer_is_the_tree_checks_macho_link_links(nix: Nix, pins: pins_mod.Pins) -> None:
    """The APIR variant's virglrenderer is built from the pin, patches, meson flags, meson options and
    MoltenVK substitution that checks/macho-link cross-builds and checks as Mach-O (tests/macho)."""
    import sys

    sys.path.insert(0, str(REPO / "checks"))
    from macho_link import trees

    attrs = nix.eval(
        f"packages.{DARWIN}.virglrenderer-apir",
        "p: { pin = p.pinName; flags = p.drvAttrs.mesonFlags; patches = p.drvAttrs.patches;"
        " post = p.drvAttrs.postPatch; buildType = p.drvAttrs.mesonBuildType;"
        " autoFeatures = p.drvAttrs.mesonAutoFeatures; wrapMode = p.drvAttrs.mesonWrapMode;"
        " molten = p.moltenvkLibrary; }",
    )
    assert attrs["pin"] == "virglrenderer-apir-macos"
    spec = trees.DARWIN_TREES[attrs["pin"]]
    assert attrs["flags"] == list(spec.meson_flags)
    pin = pins.source(attrs["pin"])
    assert [store_basename(p) for p in attrs["patches"]] == [Path(p).name for p in pin.attrs["patches"]]
    assert [store_basename(p) for p in attrs["patches"]] == [Path(p).name for p in spec.patch_list(pin.attrs)]
    # nixpkgs' meson hook reads these three; the check passes the same, and b_lundef at meson's default
    nix_options = (
        f"--buildtype={attrs['buildType']}",
        f"-Dauto_features={attrs['autoFeatures']}",
        f"--wrap-mode={attrs['wrapMode']}",
        "-Db_lundef=true",
    )
    assert nix_options == trees.NIX_MESON_OPTIONS
    assert not any(f.startswith("-Db_lundef") for f in attrs["flags"])
    # the store MoltenVK replaces the name patch 0003 dlopens first, as the check's rule does
    assert spec.moltenvk_rule is not None
    file, old = spec.moltenvk_rule
    assert "--replace-fail src/venus/vkr_library.c" not in attrs["post"]
    assert f"substituteInPlace {file} --replace-fail '{old}' '\"{attrs['molten']}\"'" in attrs["post"]
    assert attrs["molten"].endswith(f"-moltenvk-{pins.source('moltenvk').attrs['version']}/lib/libMoltenVK.dylib")


def test_moltenvk_of_another_version_than_the_pin_fails_evaluation(nix: Nix, tmp_path: Path) -> None:
    """sources.moltenvk is the version the bundle was checked against: nixpkgs' moltenvk must be it."""
    pinned = nix.eval(f"packages.{DARWIN}.moltenvk.version")
    assert pinned == pins_mod.load().source("moltenvk").attrs["version"]
    stub = tmp_path / "stub"
    shutil.copytree(STUB, stub)
    package = stub / "pkgs" / "moltenvk.nix"
    text = package.read_text()
    assert f'version = "{pinned}";' in text
    package.write_text(text.replace(f'version = "{pinned}";', 'version = "1.4.2";'))
    for attr in ("moltenvk.version", "krun.drvPath", "krun-apir.drvPath", "virglrenderer-venus.drvPath"):
        proc = nix.run(
            "eval", "--json", f"{nix.flake}#packages.{DARWIN}.{attr}",
            "--override-input", "nixpkgs", f"path:{stub}", "--no-write-lock-file", check=False,
        )  # fmt: skip
        assert proc.returncode != 0, f"{attr} evaluated with nixpkgs' moltenvk 1.4.2"
        assert f"nixpkgs' moltenvk is 1.4.2, but sources.moltenvk in provision/data/pins.json is {pinned}" in (
            proc.stderr
        ), proc.stderr
    # Linux never asks for MoltenVK: the same stub still evaluates there
    proc = nix.run(
        "eval", "--json", f"{nix.flake}#packages.{LINUX}.krun.drvPath",
        "--override-input", "nixpkgs", f"path:{stub}", "--no-write-lock-file", check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_ggml_cross_build_of_checks_macho_link_uses_the_darwin_recipes_flags(nix: Nix) -> None:
    """checks/macho-link builds ggml with the Nix recipe's cmake flags, Metal off (no Apple frameworks)."""
    import sys

    sys.path.insert(0, str(REPO / "checks"))
    from macho_link import ggml

    flags = [
        f
        for f in nix.eval(f"packages.{DARWIN}.ggml-virtgpu-backend.drvAttrs.cmakeFlags")
        if not f.startswith(("-DCMAKE_", "-DGGML_METAL_EMBED_LIBRARY"))
    ]
    assert [f.replace("GGML_METAL:BOOL=TRUE", "GGML_METAL:BOOL=FALSE") for f in flags] == list(ggml.CMAKE_FLAGS)
    patches = nix.eval(f"packages.{DARWIN}.ggml-virtgpu-backend.drvAttrs.patches")
    assert [store_basename(p) for p in patches] == [Path(p).name for p in ggml.PATCHES]


def test_libkrun_make_flags_and_no_sysroot_download(nix: Nix) -> None:
    for system in (DARWIN, LINUX):
        flags = nix.eval(f"packages.{system}.libkrun.drvAttrs.makeFlags")
        assert flags[0].startswith("PREFIX=/"), flags
        assert flags[1:] == ["BLK=1", "NET=1", "GPU=1"], system
    darwin = nix.eval(
        f"packages.{DARWIN}.libkrun",
        "p: { init = p.drvAttrs.KRUN_INIT_BINARY_PATH; initOut = p.initBinary.outPath;"
        " initHost = p.initBinary.drvAttrs.stubHostPlatform; postPatch = p.drvAttrs.postPatch;"
        " virgl = p.virglrenderer.outPath; nbi = map (d: d.pname or d.name) p.nativeBuildInputs; }",
    )
    assert darwin["init"] == darwin["initOut"] + "/init"
    assert darwin["initHost"] == "aarch64-unknown-linux-musl"  # static guest init for an arm64 guest
    assert "'$(LIBRARY_RELEASE_$(OS)): $(SYSROOT_TARGET) $(INIT_BINARY_BSD)'" in darwin["postPatch"]
    assert "'$(LIBRARY_RELEASE_$(OS)):'" in darwin["postPatch"]
    assert "'mv target/release/libkrun.dylib target/release/$(KRUN_BASE_$(OS))'" in darwin["postPatch"]
    assert "fix-darwin-dylib-names-hook" in darwin["nbi"]
    # .#krun's libkrun (Venus, the default route) links the krunkit virglrenderer; the APIR one is
    # only in the APIR variant's libkrun.
    assert darwin["virgl"] == nix.eval(f"packages.{DARWIN}.virglrenderer-venus.outPath")
    apir = nix.eval(f"packages.{DARWIN}.libkrun-apir", "p: { v = p.virglrenderer.outPath; f = p.drvAttrs.makeFlags; }")
    assert apir["v"] == nix.eval(f"packages.{DARWIN}.virglrenderer-apir.outPath")
    assert apir["f"][1:] == ["BLK=1", "NET=1", "GPU=1"]
    linux_virgl = nix.eval(f"packages.{LINUX}.libkrun.drvAttrs.buildInputs")
    assert nix.eval(f"packages.{LINUX}.virglrenderer-apir.outPath") in linux_virgl


def test_ggml_backend_cmake_flags_and_named_targets(nix: Nix) -> None:
    darwin = nix.eval(f"packages.{DARWIN}.ggml-virtgpu-backend.drvAttrs", "a: { inherit (a) cmakeFlags ninjaFlags; }")
    flags = darwin["cmakeFlags"]
    for flag in ("-DGGML_VIRTGPU:BOOL=TRUE", "-DGGML_VIRTGPU_BACKEND=ONLY", "-DGGML_METAL:BOOL=TRUE"):
        assert flag in flags
    assert "-DGGML_VULKAN:BOOL=FALSE" in flags and "-DGGML_CUDA:BOOL=FALSE" in flags
    assert darwin["ninjaFlags"] == ["ggml-virtgpu-backend", "ggml-metal"]
    # review 2, items 5 and 8: no BLAS (Apple turns it on and fails without Accelerate), no common/app
    # targets (as the Linux recipe), and the host-side patches applied as on Linux
    for flag in ("-DGGML_BLAS:BOOL=FALSE", "-DLLAMA_BUILD_COMMON:BOOL=FALSE", "-DLLAMA_BUILD_APP:BOOL=FALSE"):
        assert flag in flags
    patches = nix.eval(f"packages.{DARWIN}.ggml-virtgpu-backend.drvAttrs.patches")
    assert [store_basename(p) for p in patches] == list(ggml_build.HOST_PATCHES)
    assert list(ggml_build.HOST_PATCHES[-7:]) == ["0017-ggml-virtgpu-backend-use-counts.patch",
                                                  "0018-ggml-virtgpu-backend-refuse-hostile-tensors-and-graphs.patch",
                                                  "0019-ggml-virtgpu-backend-free-decoded-tensors.patch",
                                                  "0020-ggml-virtgpu-backend-serve-several-contexts.patch",
                                                  "0021-ggml-virtgpu-backend-count-decoded-graphs.patch",
                                                  "0022-ggml-virtgpu-apir-0.6-writes-by-reference-protocol.patch",
                                                  "0024-ggml-virtgpu-backend-writes-by-reference.patch"]
    include = next(f for f in flags if f.startswith("-DCMAKE_PROJECT_INCLUDE:STRING="))
    assert include.endswith("-ggml-virtgpu-offline.cmake") and "/nix/store/" in include

    linux = nix.eval(f"packages.{LINUX}.ggml-virtgpu-backend.drvAttrs", "a: { inherit (a) cmakeFlags ninjaFlags; }")
    assert "-DGGML_VULKAN:BOOL=TRUE" in linux["cmakeFlags"] and "-DGGML_METAL:BOOL=FALSE" in linux["cmakeFlags"]
    assert linux["ninjaFlags"] == ["ggml-virtgpu-backend", "ggml-vulkan"]

    cuda = nix.eval(f"legacyPackages.{LINUX}.ggml-virtgpu-backend-cuda.drvAttrs.cmakeFlags")
    assert "-DGGML_CUDA:BOOL=TRUE" in cuda and "-DGGML_VULKAN:BOOL=FALSE" in cuda
    assert any(f.startswith("-DCMAKE_CUDA_ARCHITECTURES:STRING=") for f in cuda)
    # Turning on two backends at once is refused with a message naming both.
    err = nix.eval_error(
        f"packages.{LINUX}.ggml-virtgpu-backend",
        "p: (p.override { cudaSupport = true; vulkanSupport = true; }).drvPath",
    )
    assert "exactly one of" in err and "vulkan, cuda" in err


def test_ggml_backend_override_arguments_exist(nix: Nix) -> None:
    cuda = nix.eval(
        f"packages.{LINUX}.ggml-virtgpu-backend",
        "p: (p.override { cudaSupport = true; vulkanSupport = false; }).backend",
    )
    assert cuda == "cuda"


# --- sources ---------------------------------------------------------------------------------


def test_ggml_backend_builds_the_guest_images_llama_cpp(nix: Nix, pins: pins_mod.Pins) -> None:
    llama = pins.source("llama-cpp")
    src = src_of(nix, DARWIN, "ggml-virtgpu-backend")
    assert src["rev"] == llama["rev"] == pins.source("llama-cpp-python-sdist")["vendored_rev"]
    assert src["hash"] == llama["hash"]
    assert (src["owner"], src["repo"], src["mode"]) == (llama["owner"], llama["repo"], "recursive")
    assert src_of(nix, LINUX, "ggml-virtgpu-backend") == src


def test_sources_come_from_the_pins_file(nix: Nix, pins: pins_mod.Pins) -> None:
    apir_darwin = pins.source("virglrenderer-apir-macos")
    got = src_of(nix, DARWIN, "virglrenderer-apir")
    assert (got["owner"], got["rev"], got["hash"]) == (apir_darwin["owner"], apir_darwin["rev"], apir_darwin["hash"])
    apir = pins.source("virglrenderer-apir")
    got = src_of(nix, LINUX, "virglrenderer-apir")
    assert (got["owner"], got["rev"], got["hash"]) == (apir["owner"], apir["rev"], apir["hash"])
    venus = pins.source("virglrenderer-venus")
    got = src_of(nix, DARWIN, "virglrenderer-venus")
    assert (got["url"], got["hash"], got["mode"]) == (venus["url"], venus["hash"], "flat")
    for package, pin_name in (("krunkit", "krunkit"), ("libkrun", "libkrun")):
        pin = pins.source(pin_name)
        got = src_of(nix, DARWIN, package)
        assert (got["owner"], got["tag"], got["hash"]) == (pin["owner"], pin["tag"], pin["hash"]), package
        assert got["rev"] == f"refs/tags/{pin['tag']}"
        assert src_of(nix, DARWIN, package, "cargoDeps")["hash"] == pin["cargoHash"], package
        assert nix.eval(f"packages.{DARWIN}.{package}.version") == pin["version"]


def test_krunkit_is_linked_to_our_libkrun_with_firmware_where_it_looks(nix: Nix, pins: pins_mod.Pins) -> None:
    krunkit = nix.eval(
        f"packages.{DARWIN}.krunkit",
        "p: { bi = p.drvAttrs.buildInputs; post = p.drvAttrs.postInstall or null; fw = p.firmware; out = p.outPath;"
        " install = p.drvAttrs.installPhase;"
        " strip = p.drvAttrs.dontStrip; patch = p.drvAttrs.postPatch; nbi = map (d: d.pname) p.nativeBuildInputs; }",
    )
    libkrun = nix.eval(f"packages.{DARWIN}.libkrun.outPath")
    assert libkrun in krunkit["bi"]
    assert not any("libkrun-efi" in path for path in krunkit["bi"])
    firmware = pins.source("krunkit")["firmware"]
    assert krunkit["fw"] == f"{krunkit['out']}/{firmware}"
    assert krunkit["post"] is None
    assert f'install -Dm444 edk2/KRUN_EFI.silent.fd "$out/{firmware}"' in krunkit["install"]
    # the Makefile's release step (install_name_tool, codesign) runs once: no `make install`
    assert 'install -Dm755 target/release/krunkit "$out/bin/krunkit"' in krunkit["install"]
    assert "make" not in krunkit["install"].replace("runHook", "")
    assert krunkit["strip"] is True  # codesign entitlements survive
    assert "sigtool" in krunkit["nbi"]
    # The Makefile's install_name_tool -change points libkrun.1.dylib at libkrun-gpu, not at $out.
    assert f"'{libkrun}/lib/$(LIBKRUN)'" in krunkit["patch"]


def _fixed_output_hashes(nix: Nix, installable: str) -> dict[str, str]:
    shown = json.loads(nix.run("show-derivation", "--recursive", f"{nix.flake}#{installable}", *nix.override()).stdout)
    hashes = {}
    for drv_path, drv in shown.items():
        for output in drv["outputs"].values():
            if "hash" in output:
                hashes[drv_path] = output["hash"]
        env_hash = drv["env"].get("outputHash")
        if env_hash is not None:
            hashes[drv_path] = env_hash
    return hashes


@pytest.mark.parametrize("system", [DARWIN, LINUX])
def test_no_fake_or_empty_hash_and_every_sri_hash_is_pinned(nix: Nix, pins: pins_mod.Pins, system: str) -> None:
    pinned = {
        value for pin in pins.sources.values() for key, value in pin.attrs.items() if key in ("hash", "cargoHash")
    }
    hashes = {}
    for package in nix.eval(f"packages.{system}", "ps: builtins.attrNames ps"):
        hashes.update(_fixed_output_hashes(nix, f"packages.{system}.{package}"))
    assert hashes, "no fixed-output derivation found: the sources are not in the closure"
    fake_hex = "0" * 64
    for drv_path, value in hashes.items():
        assert value not in ("", FAKE_HASH, fake_hex), drv_path
        # SRI values are what krun-gpu supplies; each must be a pins.json hash. (Hashes that stub
        # nixpkgs supplies for its own packages are hex, see nix/tests/stub-nixpkgs/default.nix.)
        if SRI.match(value):
            assert value in pinned, f"{drv_path}: {value} is not in pins.json"
    used = {v for v in hashes.values() if SRI.match(v)}
    expected = {pins.source("llama-cpp")["hash"]}
    if system == DARWIN:
        expected |= {
            pins.source(n)["hash"] for n in ("krunkit", "libkrun", "virglrenderer-venus", "virglrenderer-apir-macos")
        }
        # The cargo vendor hashes too: a krunkit/libkrun override that kept nixpkgs' cargoDeps would
        # leave the stub's hex hash here instead.
        expected |= {pins.source(n)["cargoHash"] for n in ("krunkit", "libkrun")}
    else:
        expected |= {pins.source("virglrenderer-apir")["hash"]}
    assert expected <= used


# --- the krun bundle -------------------------------------------------------------------------


def test_krun_venus_bundle_carries_no_apir_setting_and_the_krunkit_virglrenderer(nix: Nix) -> None:
    krun = nix.eval(
        f"packages.{DARWIN}.krun",
        "p: { env = p.env; post = p.drvAttrs.postBuild; paths = p.drvAttrs.paths; route = p.route;"
        " virgl = p.virglrenderer.outPath; script = p.krun-env.drvAttrs.text; }",
    )
    assert krun["route"] == "venus" and krun["env"] == {} and "wrapProgram" not in krun["post"]
    # provision launch/doctor read which virglrenderer the bundle carries from this file
    assert "echo venus > $out/share/krun-gpu/route" in krun["post"]
    assert "export" not in krun["script"].split("\n", 2)[-1]  # krun-env prints nothing to set
    venus = nix.eval(f"packages.{DARWIN}.virglrenderer-venus.outPath")
    assert krun["virgl"] == venus and venus in krun["paths"]
    assert nix.eval(f"packages.{DARWIN}.virglrenderer-apir.outPath") not in krun["paths"]
    assert nix.eval(f"packages.{DARWIN}.ggml-virtgpu-backend.outPath") not in krun["paths"]
    assert nix.eval(f"packages.{DARWIN}.krunkit.outPath") in krun["paths"]


def test_krun_apir_wrapper_defaults_point_at_the_backend_store_paths(nix: Nix) -> None:
    ggml = nix.eval(f"packages.{DARWIN}.ggml-virtgpu-backend.outPath")
    krun = nix.eval(
        f"packages.{DARWIN}.krun-apir",
        "p: { env = p.env; post = p.drvAttrs.postBuild; paths = p.drvAttrs.paths;"
        " script = p.krun-env.drvAttrs.text; nbi = map (d: d.pname) p.nativeBuildInputs; }",
    )
    assert krun["env"] == {
        "VIRGL_APIR_BACKEND_LIBRARY": f"{ggml}/lib/libggml-virtgpu-backend.dylib",
        "APIR_LLAMA_CPP_GGML_LIBRARY_PATH": f"{ggml}/lib/libggml-metal.dylib",
        "APIR_LLAMA_CPP_GGML_LIBRARY_REG": "ggml_backend_metal_reg",
    }
    assert "wrapProgram $out/bin/krunkit " in krun["post"]
    assert "echo apir > $out/share/krun-gpu/route" in krun["post"]
    for name, value in krun["env"].items():
        assert f"--set-default {name} {value}" in krun["post"]
        assert f"echo 'export {name}={value}'" in krun["script"]
    assert "DYLD_LIBRARY_PATH" not in krun["post"] and "DYLD_LIBRARY_PATH" not in krun["script"]
    assert "make-shell-wrapper-hook" in krun["nbi"]
    krunkit = nix.eval(f"packages.{DARWIN}.krunkit-apir.outPath")
    assert krunkit in krun["paths"] and ggml in krun["paths"]
    assert nix.eval(f"packages.{DARWIN}.krunkit.outPath") not in krun["paths"]
    libkrun = nix.eval(f"packages.{DARWIN}.libkrun-apir.outPath")
    assert libkrun in nix.eval(f"packages.{DARWIN}.krunkit-apir.drvAttrs.buildInputs")


def test_krun_on_linux_has_no_krunkit_but_exports_vulkan(nix: Nix) -> None:
    ggml = nix.eval(f"packages.{LINUX}.ggml-virtgpu-backend.outPath")
    krun = nix.eval(f"packages.{LINUX}.krun", "p: { env = p.env; post = p.drvAttrs.postBuild; k = p.krunkit; }")
    assert "wrapProgram" not in krun["post"] and krun["k"] is None
    assert krun["env"]["APIR_LLAMA_CPP_GGML_LIBRARY_PATH"] == f"{ggml}/lib/libggml-vulkan.so"
    assert krun["env"]["APIR_LLAMA_CPP_GGML_LIBRARY_REG"] == "ggml_backend_vk_reg"


def test_provision_app_is_packaged_from_pyproject(nix: Nix) -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    got = nix.eval(
        f"packages.{LINUX}.provision",
        "p: { v = p.version; deps = map (d: d.pname) p.propagatedBuildInputs; pyproject = p.drvAttrs.pyproject; }",
    )
    assert got["v"] == project["version"] and got["pyproject"] is True
    names = [re.split(r"[<>=!~ ;\[]", d)[0].lower() for d in project["dependencies"]]
    assert sorted(got["deps"]) == sorted(f"python3-{n}" for n in names)
    assert nix.eval(f"apps.{LINUX}.provision.program").endswith("/bin/provision")


# --- failure modes ---------------------------------------------------------------------------


def test_unverified_pin_makes_only_its_package_fail_with_a_clear_message(nix: Nix, tmp_path: Path) -> None:
    repo = copy_flake(tmp_path / "repo")
    pins_path = repo / "provision" / "data" / "pins.json"
    data = json.loads(pins_path.read_text())
    data["sources"]["krunkit"]["status"] = "UNVERIFIED"
    pins_path.write_text(json.dumps(data))
    copy = Nix(Path(nix.env["HOME"]), repo)
    err = copy.eval_error(f"packages.{DARWIN}.krunkit.drvPath")
    assert "sources.krunkit" in err and "UNVERIFIED" in err and "provision/data/pins.json" in err
    # Packages that do not use that pin still evaluate.
    assert copy.eval(f"packages.{DARWIN}.ggml-virtgpu-backend.drvPath").endswith(".drv")


def test_krunkit_refuses_a_libkrun_outside_the_known_good_pair(nix: Nix, tmp_path: Path) -> None:
    repo = copy_flake(tmp_path / "repo")
    pins_path = repo / "provision" / "data" / "pins.json"
    data = json.loads(pins_path.read_text())
    data["sources"]["libkrun"]["version"] = "1.19.0"  # lacks krun_add_virtiofs4
    pins_path.write_text(json.dumps(data))
    copy = Nix(Path(nix.env["HOME"]), repo)
    err = copy.eval_error(f"packages.{DARWIN}.krunkit.drvPath")
    assert "krunkit 1.3.2 needs libkrun >= 1.19.3 and < 2.0, got libkrun 1.19.0" in err


def test_flake_check_fails_when_a_lib_test_fails(nix: Nix, tmp_path: Path) -> None:
    repo = copy_flake(tmp_path / "repo")
    tests = repo / "nix" / "lib" / "tests.nix"
    text = tests.read_text()
    broken = text.replace(
        '"-Drender-server=false"\n      "-Ddrm=disabled"', '"-Ddrm=disabled"\n      "-Drender-server=false"', 1
    )
    assert broken != text
    tests.write_text(broken)
    copy = Nix(Path(nix.env["HOME"]), repo)
    proc = copy.run("flake", "check", "--no-build", copy.flake, *copy.override(), check=False)
    assert proc.returncode != 0
    assert "testVenusFork0104" in proc.stderr
