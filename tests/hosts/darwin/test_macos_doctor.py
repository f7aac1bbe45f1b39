"""Doctor checks of the macOS route against real artifacts built here: gcc-compiled
libraries probed by the same dlopen/dlsym code path doctor uses, files present/absent,
a live process mapping a library for lsof, and version strings from the tools' outputs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provision.adapters import dylib, lsof
from provision.core import pins
from provision.core.errors import MachineFailed
from provision.hosts.darwin import doctor as dd
from provision.hosts.darwin import podman_checks as pc
from provision.hosts.darwin import versions
from provision.hosts.darwin.backend import verify_virglrenderer
from provision.hosts.darwin.bundle import KrunBundle
from tests.hosts.darwin.macos_fixtures import DATA, MappedProcess, cc_shared, make_bundle

COMPAT = pins.load().compat


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("libs")
    from tests.hosts.darwin.macos_fixtures import GPU_LIBKRUN_C, NOGPU_LIBKRUN_C

    return {
        "gpu": cc_shared(GPU_LIBKRUN_C, d / "gpu" / "libkrun.1.dylib"),
        "nogpu": cc_shared(NOGPU_LIBKRUN_C, d / "nogpu" / "libkrun.1.dylib"),
    }


def test_symbol_probe_sees_krun_set_gpu_options2_only_when_built_in(libs):
    required = versions.required_symbols(COMPAT, versions.Version(1, 3, 2))
    assert [s for s, _ in required] == ["krun_set_gpu_options2", "krun_add_virtiofs4"]
    syms = [s for s, _ in required]
    good = dd.check_libkrun_symbols(dylib.probe_symbols(libs["gpu"], syms), required)
    assert [(c.id, c.status) for c in good] == [("libkrun.gpu", "ok"), ("libkrun.krun_add_virtiofs4", "ok")]
    bad = dd.check_libkrun_symbols(dylib.probe_symbols(libs["nogpu"], syms), required)
    assert bad[0].id == "libkrun.gpu" and bad[0].status == "fail"
    assert "ENOTSUP" in bad[0].evidence and "GPU=1" in bad[0].evidence
    assert bad[1].status == "ok"


def test_symbol_probe_reports_an_unloadable_file(tmp_path):
    junk = tmp_path / "libkrun.1.dylib"
    junk.write_bytes(b"not a library")
    probe = dylib.probe_symbols(junk, ["krun_set_gpu_options2"])
    assert not probe.loaded and probe.error
    checks = dd.check_libkrun_symbols(probe, versions.required_symbols(COMPAT, None))
    assert [(c.id, c.status) for c in checks] == [("libkrun.load", "fail")]


def test_bundle_and_firmware_present_and_absent(tmp_path):
    b = make_bundle(tmp_path / "good")
    c, found = dd.check_bundle(b, {}, tmp_path)
    assert c.status == "ok" and found == KrunBundle(b)
    assert dd.check_firmware(KrunBundle(b), versions.Version(1, 3, 2), COMPAT).status == "ok"
    nofw = make_bundle(tmp_path / "nofw", firmware=False)
    fw = dd.check_firmware(KrunBundle(nofw), versions.Version(1, 3, 2), COMPAT)
    assert fw.status == "fail" and "KRUN_EFI.silent.fd" in fw.evidence
    old = dd.check_firmware(KrunBundle(nofw), versions.Version(1, 1, 1), COMPAT)
    assert old.status == "skip"
    missing, none = dd.check_bundle(None, {"USER": "nobody"}, tmp_path / "emptyhome")
    assert missing.status == "fail" and none is None and "nix profile add .#krun" in (missing.fix or "")


def test_firmware_is_looked_up_beside_the_real_krunkit_behind_a_nix_wrapper(tmp_path):
    store = make_bundle(tmp_path / "store-krunkit")
    profile = tmp_path / "profile" / "bin"
    profile.mkdir(parents=True)
    wrapper = profile / "krunkit"
    wrapper.write_text(f'#! /bin/bash -e\nexport X=1\nexec -a "$0" "{store}/bin/krunkit" "$@"\n')
    wrapper.chmod(0o755)
    from provision.hosts.darwin.bundle import real_executable

    assert real_executable(wrapper) == (store / "bin" / "krunkit").resolve()
    ok = dd.check_firmware(KrunBundle(profile.parent), None, COMPAT)
    assert ok.status == "ok" and str(store) in ok.evidence


def test_podman_helper_search_order(tmp_path):
    ours = make_bundle(tmp_path / "ours")
    other = tmp_path / "opt-podman" / "bin"
    other.mkdir(parents=True)
    shutil.copy(ours / "bin" / "krunkit", other / "krunkit")
    conf = tmp_path / "containers.conf"
    conf.write_text(f'[engine]\nhelper_binaries_dir = ["$BINDIR/../libexec/podman", "{other}"]\n')
    merged = pc.read_containers_conf([conf])
    env = {"PATH": "/usr/bin"}
    found, tried = pc.find_helper("krunkit", env, merged, Path("/usr/bin"))
    assert found == other / "krunkit" and tried[0].startswith("helper_binaries_dir:/usr/bin/../libexec")
    c = pc.check_podman_finds_krunkit(found, tried, KrunBundle(ours))
    assert c.status == "warn" and str(other) in c.evidence
    env["CONTAINERS_HELPER_BINARY_DIR"] = str(ours / "bin")
    found, _ = pc.find_helper("krunkit", env, merged, None)
    assert pc.check_podman_finds_krunkit(found, [], KrunBundle(ours)).status == "ok"
    found, tried = pc.find_helper("krunkit", {"PATH": str(tmp_path)}, {}, None)
    c = pc.check_podman_finds_krunkit(found, tried, KrunBundle(ours))
    assert c.status == "fail" and "would not find krunkit" in c.evidence


@pytest.mark.podman
def test_version_strings_from_the_tools_and_skew():
    real_podman = subprocess.run(["podman", "--version"], capture_output=True, text=True, check=True).stdout
    pv = versions.parse_podman(real_podman)  # this machine's podman, e.g. "podman version 4.3.1"
    assert str(pv) in real_podman
    assert versions.parse_podman("podman version 6.0.2\n") == versions.Version(6, 0, 2)
    assert versions.parse_krunkit("krunkit 1.3.2\n") == versions.Version(1, 3, 2)
    with pytest.raises(ValueError):
        versions.parse_podman("krunkit 1.3.2")
    with pytest.raises(ValueError):
        versions.parse_krunkit(real_podman)
    assert versions.parse_libkrun_path(
        "/nix/store/" + "a" * 32 + "-libkrun-1.19.3/lib/libkrun.1.dylib"
    ) == versions.Version(1, 19, 3)
    assert versions.parse_libkrun_path("/opt/homebrew/Cellar/libkrun/1.19.6/lib/libkrun.1.dylib") == versions.Version(
        1, 19, 6
    )
    ok, kv = dd.check_versions(COMPAT, "podman version 6.0.2\n", "krunkit 1.3.2\n", versions.Version(1, 19, 3))
    assert [c.status for c in ok] == ["ok", "ok"] and kv == versions.Version(1, 3, 2)
    # podman 6 is paired with krunkit 1.3.2 (libkrun >= 1.19.3 for krun_add_virtiofs4); the reason names both
    # that pairing and podman#29439's --timesync, which krunkit has accepted since 1.2.0.
    bad, _ = dd.check_versions(COMPAT, "podman version 6.0.2\n", "krunkit 1.2.1\n", versions.Version(1, 19, 0))
    assert bad[-1].status == "fail" and "--timesync" in bad[-1].evidence and "krun_add_virtiofs4" in bad[-1].evidence
    bad, _ = dd.check_versions(COMPAT, "podman version 5.7.0\n", "krunkit 1.3.2\n", versions.Version(1, 19, 0))
    assert bad[-1].status == "fail" and "krun_add_virtiofs4" in bad[-1].evidence
    bad, _ = dd.check_versions(COMPAT, "podman version 5.7.0\n", "krunkit 1.3.2\n", versions.Version(2, 0, 0))
    assert bad[-1].status == "fail" and "< 2.0.0" in bad[-1].evidence
    old, _ = dd.check_versions(COMPAT, real_podman, "krunkit 1.3.2\n", versions.Version(1, 19, 3))
    expect = "fail" if pv < versions.Version(5, 2, 0) else "ok"
    assert old[-1].status == expect
    missing, _ = dd.check_versions(COMPAT, None, None, None)
    assert missing[0].status == "fail" and "not installed" in missing[0].evidence


def test_lsof_shows_which_virglrenderer_a_live_krunkit_mapped(tmp_path):
    ours = cc_shared("int virgl_renderer_init(void){return 0;}\n", tmp_path / "ours" / "libvirglrenderer.1.dylib")
    other = cc_shared("int virgl_renderer_init(void){return 1;}\n", tmp_path / "brew" / "libvirglrenderer.1.dylib")
    with MappedProcess(tmp_path, ours) as proc:
        out = subprocess.run(lsof.command_cmd("krunkit"), capture_output=True, text=True).stdout
        files = [f for f in lsof.parse_fields(out) if f.pid == proc.proc.pid]
        assert any(f.name == str(ours) for f in files)
        assert dd.check_loaded_virglrenderer(out, ours).status == "ok"
        wrong = dd.check_loaded_virglrenderer(out, other)
        assert wrong.status == "fail" and str(ours) in wrong.evidence
        assert verify_virglrenderer(out, str(ours)) == str(ours)
        with pytest.raises(MachineFailed):
            verify_virglrenderer(out, str(other))
        table = subprocess.run(["lsof", "-n", "-P", "-w", "-c", "krunkit"], capture_output=True, text=True).stdout
        assert str(ours) in lsof.libraries_named(lsof.parse_table(table), "libvirglrenderer")
    assert dd.check_loaded_virglrenderer("", ours).status == "skip"


def test_otool_output_resolves_virglrenderer_through_rpath(tmp_path):
    installs = dylib.parse_otool_L((DATA / "otool-L-libkrun.txt").read_text())
    assert installs[0] == "@rpath/libkrun.1.dylib" and len(installs) == 5
    linked = dylib.find_linked(installs, "libvirglrenderer")
    rpaths = dylib.parse_rpaths((DATA / "otool-l-rpath.txt").read_text())
    assert rpaths == ["@loader_path", "/opt/podman/lib"]
    lib = tmp_path / "lib"
    ours = cc_shared("int a(void){return 0;}\n", lib / "libvirglrenderer.1.dylib")
    resolved = dylib.resolve_install_name(linked or "", binary=lib / "libkrun.1.dylib", rpaths=rpaths)
    assert resolved[0] == ours
    assert dd.check_linked_virglrenderer(linked, resolved, ours).status == "ok"
    elsewhere = cc_shared("int a(void){return 0;}\n", tmp_path / "nix" / "libvirglrenderer.1.dylib")
    assert dd.check_linked_virglrenderer(linked, resolved, elsewhere).status == "fail"
    assert dd.check_linked_virglrenderer(None, [], ours).status == "fail"


def test_apir_env_missing_files_and_the_venus_warning(tmp_path):
    b = make_bundle(tmp_path / "b")
    assert pc.check_apir_env({}, None).status == "skip"
    assert pc.check_apir_env({}, "apir").status == "fail"
    env = {
        "VIRGL_APIR_BACKEND_LIBRARY": str(b / "lib" / "libggml-virtgpu-backend.dylib"),
        "APIR_LLAMA_CPP_GGML_LIBRARY_PATH": str(b / "lib" / "libggml-metal.dylib"),
        "APIR_LLAMA_CPP_GGML_LIBRARY_REG": "ggml_backend_metal_reg",
    }
    assert pc.check_apir_env(env, "apir").status == "ok"
    assert pc.check_apir_env({**env, "VIRGL_ROUTE_VENUS_TO_APIR": "1"}, "apir").status == "warn"
    gone = pc.check_apir_env({**env, "APIR_LLAMA_CPP_GGML_LIBRARY_PATH": str(tmp_path / "nope.dylib")}, "apir")
    assert gone.status == "fail" and "nope.dylib does not exist" in gone.evidence
    nolog = pc.check_apir_env({**env, "VIRGL_APIR_LOG_TO_FILE": str(tmp_path / "no" / "dir.log")}, "apir")
    assert nolog.status == "fail"
    assert pc.check_apir_bundle(KrunBundle(b)).status == "ok"
    assert pc.check_apir_bundle(KrunBundle(make_bundle(tmp_path / "venus-only", apir=False))).status == "warn"


def test_dyld_library_path_in_ssh_fails_and_elsewhere_warns():
    assert pc.check_dyld({}).status == "ok"
    ssh = pc.check_dyld({"DYLD_LIBRARY_PATH": "/x/src", "SSH_CONNECTION": "10.0.0.2 5555 10.0.0.1 22"})
    assert ssh.status == "fail" and "SSH" in ssh.evidence
    assert pc.check_dyld({"DYLD_LIBRARY_PATH": "/x/src"}).status == "warn"


def test_machine_memory_limits():
    from provision.adapters.podman_machine import MachineInfo

    assert pc.check_machine_memory(COMPAT, None, 4096).status == "skip"
    assert pc.check_machine_memory(COMPAT, MachineInfo("m", True, "libkrun", 4, 8192), 4096).status == "ok"
    assert pc.check_machine_memory(COMPAT, MachineInfo("m", True, "libkrun", 4, 62000), 4096).status == "fail"
    assert pc.check_machine_memory(COMPAT, MachineInfo("m", True, "libkrun", 4, 61440), 4096).status == "warn"


@pytest.mark.podman
def test_darwin_checks_end_to_end_on_a_bundle_built_here(tmp_path):
    b = make_bundle(tmp_path / "krun")
    ctx = dd.DoctorContext(
        platform="darwin",
        env={"PATH": os.environ["PATH"], "USER": "u"},
        home=tmp_path,
        compat=COMPAT,
        krun=b,
        vram_mib=4096,
    )
    by_id = {c.id: c for c in dd.darwin_checks(ctx)}
    assert by_id["krun.bundle"].status == "ok"
    assert by_id["libkrun.gpu"].status == "ok"
    assert by_id["krunkit.firmware"].status == "ok"
    assert by_id["podman.krunkit"].status in ("fail", "warn")  # the user's own shell has no helper dir set
    real_podman = versions.parse_podman(subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout)
    assert by_id["podman.version"].evidence == f"podman {real_podman}"
    assert by_id["versions.pairing"].status == ("fail" if real_podman < versions.Version(5, 2, 0) else "ok")
    if shutil.which("otool") is None:  # Linux: no Mach-O tools, the static link check says so
        assert by_id["libkrun.links-virglrenderer"].status == "skip"
    assert by_id["krunkit.virglrenderer"].status == "skip"  # no krunkit running here


def test_machine_provider_seen_by_plain_podman(tmp_path):
    v5, v6 = versions.Version(5, 7, 0), versions.Version(6, 0, 2)
    assert pc.check_provider({}, {}, v5).status == "warn"  # podman 5 defaults to applehv
    assert pc.check_provider({}, {}, v6).status == "ok"  # podman 6: libkrun by default
    conf = tmp_path / "containers.conf"
    conf.write_text('[machine]\nprovider = "libkrun"\n')
    assert pc.check_provider({}, pc.read_containers_conf([conf]), v5).status == "ok"
    assert pc.check_provider({"CONTAINERS_MACHINE_PROVIDER": "applehv"}, {}, v6).status == "warn"
