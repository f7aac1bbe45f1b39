"""Our Nix recipes against facts read from the real upstream trees (nix/facts/upstream.json, made by
checks/upstream-facts): flags, symbols, build steps, override arguments and meson dependencies
that evaluation against the stub nixpkgs alone cannot see. Each of issue 12's defects has a test
here that fails on the recipes as they were before the fix."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from provision.core import pins as pins_mod

from .nix_facts import (
    REPO,
    applied_patch_facts,
    expand,
    facts,
    make_conditions_hold,
    option_value,
    parse_meson_flags,
    replace_rules,
    sha256,
    store_basename,
    switched_on,
)
from .nix_helpers import DARWIN, LINUX, STUB, Nix, copy_flake

VIRGL_TREES = ("virglrenderer-apir", "virglrenderer-apir-darwin", "virglrenderer-apir-macos", "virglrenderer-venus")
PATCHED_TREES = ("virglrenderer-vtest",)  # read only for the patches their pin lists

HOST = {DARWIN: "darwin", LINUX: "linux"}
RUST_OS = {DARWIN: "macos", LINUX: "linux"}
# pkg-config names -> the nixpkgs attribute that ships the .pc file (None: meson's built-in).
PROVIDERS = {"threads": None, "epoxy": "libepoxy", "vulkan": "vulkan-loader", "libdrm": "libdrm", "gbm": "libgbm"}


@pytest.fixture(scope="module")
def nix(tmp_path_factory: pytest.TempPathFactory) -> Nix:
    return Nix(tmp_path_factory.mktemp("nix-home"), copy_flake(tmp_path_factory.mktemp("flake") / "repo"))


def virgl_tree(nix: Nix, system: str, package: str) -> str:
    if package == "virglrenderer-venus":
        return "virglrenderer-venus"
    return nix.eval(f"packages.{system}.{package}.pinName")


def patch_names(nix: Nix, system: str, package: str) -> list[str]:
    return [store_basename(p) for p in nix.eval(f"packages.{system}.{package}.drvAttrs", "a: a.patches or [ ]")]


# --- the facts file itself -------------------------------------------------------------------


def walk(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return ([value] if "file" in value else []) + [d for v in value.values() for d in walk(v)]
    if isinstance(value, list):
        return [d for v in value for d in walk(v)]
    return []


def test_facts_are_sorted_have_provenance_and_name_no_local_path() -> None:
    text = (REPO / "nix" / "facts" / "upstream.json").read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    located = walk(data)
    assert len(located) > 200
    for fact in located:
        assert {"rev", "file"} <= set(fact), fact
        assert fact.get("tree") or fact["file"].startswith("pkgs/"), fact
    assert "/work/" not in text and "/tmp/" not in text and "/home/" not in text
    pins = pins_mod.load()
    for name in ("virglrenderer-apir", "virglrenderer-apir-darwin"):
        tree = data["virglrenderer"][name]
        assert tree["read_rev"] == pins.source(name)["rev"] and tree["pin_in_clone"] is True
    # slp's GitHub copy has no krunkit tag (the pin is a GitLab archive): read elsewhere, said so
    assert data["virglrenderer"]["virglrenderer-venus"]["pin_in_clone"] is False
    for name in ("libkrun", "krunkit"):  # the mirrors stop before the pinned tags: say so
        assert data[name]["pinned"] == pins.source(name)["tag"]
        assert data[name]["pin_in_clone"] is False and data[name]["read_rev"]


def test_stub_nixpkgs_argument_sets_are_the_facts() -> None:
    stub = json.loads((STUB / "facts.json").read_text())["packages"]
    read = facts()["nixpkgs"]["packages"]
    assert stub == {n: {a: v["default"] for a, v in p["arguments"].items()} for n, p in read.items()}
    assert {"krunkit", "libkrun", "libkrun-efi", "moltenvk", "virglrenderer", "llama-cpp"} <= set(read)


def test_every_patch_a_pin_lists_applies_to_its_pinned_tree() -> None:
    pins = pins_mod.load()
    listed = 0
    for name, pin in pins.sources.items():
        for rel in pin.attrs.get("patches", []):
            listed += 1
            entry = next(p for p in facts()["patches"][name]["patches"] if p["patch"] == rel)
            assert entry["applies"] and entry["rev"] == pin["rev"], rel
            assert entry["sha256"] == sha256(REPO / rel), f"{rel} changed since checks/upstream-facts ran"
    assert listed == 12  # the loop saw every listed patch: 2 Linux, 1 CamouflageNetworks, 6 darwin, 3 vtest


# --- item 3: CI checks against the facts -----------------------------------------------------


@pytest.mark.parametrize(
    ("system", "package"),
    [(DARWIN, "virglrenderer-apir"), (DARWIN, "virglrenderer-venus"), (LINUX, "virglrenderer-apir")],
)
def test_every_meson_option_we_pass_exists_in_its_tree_with_a_valid_value(nix: Nix, system: str, package: str) -> None:
    tree = facts()["virglrenderer"][virgl_tree(nix, system, package)]
    options = {o["name"]: o for o in tree["options"]}
    flags = nix.eval(f"packages.{system}.{package}.drvAttrs.mesonFlags")
    assert flags
    for name, value in parse_meson_flags(flags).items():
        assert name in options, f"-D{name}: no such option in {tree['source']} @{tree['read_rev'][:8]}"
        option_value(options[name], value)


# Not virglrenderer-venus: its pin is a GitLab archive of a krunkit tag, and the facts come
# from the older venus-macos branch of slp's GitHub copy (pin_in_clone false), whose meson.build
# still asks for dependency('vulkan'); nixpkgs builds the tagged tree with the same flags and inputs.
@pytest.mark.parametrize(("system", "package"), [(DARWIN, "virglrenderer-apir"), (LINUX, "virglrenderer-apir")])
def test_meson_dependencies_our_flags_switch_on_are_build_inputs(nix: Nix, system: str, package: str) -> None:
    """Defect 2: -Dvulkan-dload=false on darwin asks meson for dependency('vulkan'); nixpkgs' moltenvk
    ships no vulkan.pc and no libvulkan (facts), so nothing in buildInputs provides it."""
    tree = facts()["virglrenderer"][virgl_tree(nix, system, package)]
    flags = nix.eval(f"packages.{system}.{package}.drvAttrs.mesonFlags")
    on, undecided = switched_on(tree, flags, HOST[system])
    assert not undecided, f"the facts cannot decide dependencies our flags touch: {undecided}"
    inputs = set(nix.eval(f"packages.{system}.{package}", "p: map (d: d.pname or d.name) p.buildInputs"))
    moltenvk = facts()["nixpkgs"]["packages"]["moltenvk"]["installs"]
    assert not moltenvk["pkg_config"] and not moltenvk["libvulkan"]  # so it provides no meson dependency
    missing = []
    for dep in on:
        assert dep["name"] in PROVIDERS, f"dependency('{dep['name']}'): add its nixpkgs provider to PROVIDERS"
        provider = PROVIDERS[dep["name"]]
        if provider is not None and provider not in inputs:
            missing.append(f"dependency('{dep['name']}') at {dep['file']}:{dep['line']} needs {provider}")
    assert not missing, f"{package} on {system} (buildInputs {sorted(inputs)}): {missing}"


@pytest.mark.parametrize(
    ("system", "libkrun", "virgl"),
    [(DARWIN, "libkrun", "virglrenderer-venus"), (DARWIN, "libkrun-apir", "virglrenderer-apir"),
     (LINUX, "libkrun", "virglrenderer-apir")],
)  # fmt: skip
def test_every_virgl_function_our_libkrun_calls_is_exported_by_the_virglrenderer_it_links(
    nix: Nix, system: str, libkrun: str, virgl: str
) -> None:
    """Defect 1: rutabaga_gfx calls virgl_renderer_resource_get_map_ptr on macOS; the MR 1590 tree
    does not define it, our darwin patch adds it. .#krun's libkrun links the krunkit tree, the APIR
    variant's the patched APIR tree."""
    libkrun_inputs = nix.eval(f"packages.{system}.{libkrun}.drvAttrs.buildInputs")
    linked = nix.eval(f"packages.{system}.{virgl}.outPath")
    assert linked in libkrun_inputs, f"{libkrun} does not link our {virgl}"
    tree_name = virgl_tree(nix, system, virgl)
    tree = facts()["virglrenderer"][tree_name]
    applied = patch_names(nix, system, virgl)
    recorded = applied_patch_facts(tree_name, applied)
    exported = {f["name"] for f in tree["functions"]}
    if applied:
        assert sorted(applied) == sorted(Path(p["patch"]).name for p in recorded["patches"])
        exported |= set(recorded["adds_functions"])
    calls = set(facts()["libkrun"]["virgl_calls_per_os"][RUST_OS[system]])
    assert len(calls) > 20
    assert not calls - exported, f"libkrun would not link on {system}: {sorted(calls - exported)} undefined"


def test_no_darwin_build_step_renames_a_file_onto_itself(nix: Nix) -> None:
    """Defect 3: without a variant, KRUN_BASE_Darwin is libkrun.dylib and GNU mv refuses a same-file mv."""
    makefile = facts()["libkrun"]["makefile"]
    libkrun = nix.eval(f"packages.{DARWIN}.libkrun.drvAttrs", "a: { inherit (a) postPatch makeFlags; }")
    rules = replace_rules(libkrun["postPatch"], "Makefile")
    steps = [m["command"] for m in makefile["release_mv"]]
    heads = [h["text"] for h in makefile["release_rule"]]
    for old, _ in rules:  # --replace-fail would fail the build on a line the tree lacks
        assert any(old in line for line in steps + heads), f"{old!r} is not in libkrun's Makefile"
    variables = {"OS": "Darwin"}
    variables.update(f.split("=", 1) for f in libkrun["makeFlags"] if "=" in f and not f.startswith("PREFIX="))
    for var in makefile["variables"]:  # make reads the whole file first; later assignments win
        if make_conditions_hold(var["conditions"], variables):
            variables[var["name"]] = var["value"]
    ran = 0
    for step in makefile["release_mv"]:
        if not make_conditions_hold(step["conditions"], variables):
            continue
        command = step["command"]
        for old, new in rules:
            command = command.replace(old, new)
        ran += 1
        guard = re.fullmatch(r"test (\S+) = (\S+) \|\| (mv .*)", command)
        if guard and expand(guard[1], variables) == expand(guard[2], variables):
            continue
        mv = re.fullmatch(r"mv (\S+) (\S+)", guard[3] if guard else command)
        assert mv, f"unexpected release step {command!r}"
        src, dest = expand(mv[1], variables), expand(mv[2], variables)
        assert src != dest, f"Makefile:{step['line']} renames {src} onto itself (GNU mv exits 1)"
    assert ran == 1  # the darwin rename runs for the non-EFI build


OVERRIDE = re.compile(r"\b([A-Za-z][\w-]*)\.override\s*\{")


def override_arguments(text: str, start: int) -> set[str]:
    depth, i = 1, start
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    body = re.sub(r"\{[^{}]*\}", "", text[start : i - 1])  # only the top level
    names = set(re.findall(r"(?:^|;)\s*([A-Za-z_][\w'-]*)\s*=", body))
    for inherited in re.findall(r"inherit\s*(?:\([^)]*\))?\s*([^;]*);", body):
        names |= set(inherited.split())
    return names


def test_every_override_of_a_nixpkgs_package_passes_only_arguments_its_function_takes() -> None:
    read = facts()["nixpkgs"]["packages"]
    checked = []
    for path in [REPO / "flake.nix", *sorted((REPO / "nix").rglob("*.nix"))]:
        if "tests" in path.relative_to(REPO).parts:
            continue
        text = path.read_text()
        for m in OVERRIDE.finditer(text):
            if m.group(1) not in read:
                continue  # one of ours (ggml-virtgpu-backend): evaluation checks those
            extra = override_arguments(text, m.end()) - set(read[m.group(1)]["arguments"])
            assert not extra, f"{path.relative_to(REPO)}: {m.group(1)}.override passes {sorted(extra)}"
            checked.append(m.group(1))
    assert "libkrun" in checked


def test_override_with_an_argument_nixpkgs_does_not_take_fails_evaluation(nix: Nix) -> None:
    err = nix.eval_error(f"packages.{LINUX}.libkrun", "p: (p.override { withVulkan = true; }).drvPath")
    assert "unexpected argument 'withVulkan'" in err


# --- the other defects -----------------------------------------------------------------------


def test_darwin_virglrenderer_dlopens_moltenvk_by_its_store_path(nix: Nix) -> None:
    """Defect 2: with vulkan-dload on, the tree's last dlopen is the bare libMoltenVK.dylib, which
    dyld cannot find from a Nix profile; it must name the store file moltenvk installs."""
    tree = facts()["virglrenderer"]["virglrenderer-apir-darwin"]
    got = nix.eval(
        f"packages.{DARWIN}.virglrenderer-apir",
        'p: { post = p.drvAttrs.postPatch or ""; flags = p.drvAttrs.mesonFlags; mvk = p.moltenvkLibrary or null; }',
    )
    assert "-Dvulkan-dload=true" in got["flags"] or "vulkan-dload" not in str(got["flags"])
    rules = replace_rules(got["post"], "src/venus/vkr_library.c")
    assert rules, "nothing makes the bare libMoltenVK.dylib resolve from the store"
    dlopens = {d["name"] for d in tree["strings"]["dlopen"] if d["file"] == "src/venus/vkr_library.c"}
    moltenvk = nix.eval(f"packages.{DARWIN}.moltenvk.outPath")
    installs = facts()["nixpkgs"]["packages"]["moltenvk"]["installs"]
    assert installs["install_name"] == "$out/lib/libMoltenVK.dylib"
    assert any(f["dest"] == "$out/lib" and "libMoltenVK" in f["source"] for f in installs["files"])
    for old, new in rules:
        assert old.strip('"') in dlopens, f"{old} is not a dlopen name of the tree"
        assert new == f'"{moltenvk}/lib/libMoltenVK.dylib"' == f'"{got["mvk"]}"'


def test_linux_mr1590_tree_gets_upstream_glibc_fixes(nix: Nix) -> None:
    """Defect 4: the MR 1590 head lacks 3f0f775e and 986b5fc5; our patches make the files they touch
    identical to upstream's fixed versions (facts), and the Linux build applies them."""
    pins = pins_mod.load()
    wanted = [
        f for f in pins.source("virglrenderer-apir")["linux_fixes"] if f["commit"][:8] in ("3f0f775e", "986b5fc5")
    ]
    assert len(wanted) == 2
    applied = patch_names(nix, LINUX, "virglrenderer-apir")
    recorded = applied_patch_facts("virglrenderer-apir", applied)
    for fix in wanted:
        assert fix.get("applied_by_patch"), f"pins.json names no patch that applies {fix['commit'][:8]}"
        assert Path(fix["applied_by_patch"]).name in applied, f"{fix['commit'][:8]} is not applied on Linux"
        entry = next(f for f in recorded["fixes"] if f["commit"] == fix["commit"])
        assert entry["identical_after_patches"] and all(entry["identical_after_patches"].values()), entry


def test_apir_build_test_checks_what_only_an_apir_build_contains(nix: Nix) -> None:
    """Defect 6: VIRGL_RENDERER_APIR is a header define of both trees, APIR or not. A marker must live
    only in src/apir, which src/meson.build compiles only `if with_apir`."""
    for system in (DARWIN, LINUX):
        tree = facts()["virglrenderer"][virgl_tree(nix, system, "virglrenderer-apir")]
        script = nix.eval(f"packages.{system}.virglrenderer-apir.tests.apirEnabled.drvAttrs.buildCommand")
        markers = [m for m in re.findall(r"^\s*grep -q\w* (\w+) ", script, re.M) if m.isupper()]
        assert markers, script
        defines = {d["name"] for d in tree["strings"]["header_defines"]}
        apir_lists = tree["meson"]["src/meson.build"]["source_lists"]
        assert any(
            s["name"] == "apir_sources" and [c["expr"] for c in s["conditions"]] == ["with_apir"] for s in apir_lists
        )
        for marker in markers:
            assert marker not in defines, f"{marker} is in virglrenderer.h of every build"
            where = {g["file"] for g in tree["strings"]["getenv"] if g["name"] == marker}
            assert where and all(f.startswith("src/apir/") for f in where), (marker, where)


def test_krunkit_is_ours_and_evaluates_whatever_shape_nixpkgs_krunkit_has(nix: Nix, tmp_path: Path) -> None:
    """Defect 5: newer nixpkgs folds libkrun-efi into libkrun (a `variant` argument); an override of
    nixpkgs' krunkit with `libkrun-efi = …` then fails. Our krunkit must not depend on that shape."""
    stub = tmp_path / "stub"
    shutil.copytree(STUB, stub)
    data = json.loads((stub / "facts.json").read_text())
    newer = dict(data["packages"]["krunkit"])
    newer.pop("libkrun-efi")
    newer.update(libkrun=False, variant=True)
    data["packages"]["krunkit"] = newer
    (stub / "facts.json").write_text(json.dumps(data))
    for override in ([], ["--override-input", "nixpkgs", f"path:{stub}", "--no-write-lock-file"]):
        args = ["eval", "--json", f"{nix.flake}#packages.{DARWIN}.krunkit.drvAttrs.buildInputs"]
        proc = nix.run(*args, *(override or nix.override()), check=False)
        assert proc.returncode == 0, proc.stderr
        assert nix.eval(f"packages.{DARWIN}.libkrun.outPath") in json.loads(proc.stdout)
    krunkit = facts()["krunkit"]
    post = nix.eval(f"packages.{DARWIN}.krunkit.drvAttrs.postPatch")
    steps = [s["command"] for s in krunkit["makefile_steps"]]
    for old, _ in replace_rules(post, "Makefile"):
        assert any(old in s for s in steps), old
    firmware = pins_mod.load().source("krunkit")["firmware"]
    assert firmware in {f["path"] for f in krunkit["firmware_lookup"]}
    assert krunkit["firmware_in_tree"] == ["edk2/KRUN_EFI.silent.fd"]
    assert {link["name"] for link in krunkit["links"]} == {"krun"}


# --- checks/upstream-facts itself ------------------------------------------------------------


def test_upstream_facts_refuses_a_folder_that_is_not_a_clone(tmp_path: Path) -> None:
    script = REPO / "checks" / "upstream-facts"
    args = [str(script)]
    for name in ("libkrun", "krunkit", *VIRGL_TREES, *PATCHED_TREES):
        args += [f"--{name}", str(tmp_path)]
    args += ["--nixpkgs", str(tmp_path), "--out", str(tmp_path / "o.json"), "--stub-out", str(tmp_path / "s.json")]
    proc = subprocess.run(["python3", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "not a git clone" in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.json").exists()


def test_upstream_facts_refuses_a_clone_without_the_pin_unless_told_what_to_read(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    git = ["git", "-C", str(clone), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    args = ["python3", str(REPO / "checks" / "upstream-facts")]
    for name in ("libkrun", "krunkit", *VIRGL_TREES, *PATCHED_TREES):
        args += [f"--{name}", str(clone)]
    args += ["--nixpkgs", str(tmp_path), "--out", str(tmp_path / "o.json"), "--stub-out", str(tmp_path / "s.json")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "lacks the pinned" in proc.stderr and "fix:" in proc.stderr
    assert not (tmp_path / "o.json").exists()
