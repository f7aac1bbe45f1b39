"""APIR host preflight against the REAL libggml-virtgpu-backend + libggml-cpu built from the pin.

The host build is cached under the provision cache keyed by the pins (about a minute cold
on 2 cores, instant warm). Every probe runs in its own fresh subprocess, like `apir check`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from provision.adapters import apir as adapter
from provision.apir import builds
from provision.apir import ggml as ggml_build
from provision.apir import preflight as apir
from provision.cli import main as cli_main
from provision.core.errors import ApirCheckFailed

pytestmark = pytest.mark.slow

FAKE_BACKEND_C = textwrap.dedent(
    """
    /* A ggml backend registry with the struct ggml_backend_reg layout (ggml-backend-impl.h)
       whose registration reports zero devices, and one whose registration fails. */
    #include <stddef.h>
    struct reg;
    struct reg_iface {
        const char *(*get_name)(struct reg *);
        size_t (*get_device_count)(struct reg *);
        void *(*get_device)(struct reg *, size_t);
        void *(*get_proc_address)(struct reg *, const char *);
    };
    struct reg { int api_version; struct reg_iface iface; void *context; };
    static const char *fake_name(struct reg *r) { (void)r; return "fake"; }
    static size_t fake_count(struct reg *r) { (void)r; return 0; }
    static void *fake_device(struct reg *r, size_t i) { (void)r; (void)i; return NULL; }
    static struct reg no_devices = { 2, { fake_name, fake_count, fake_device, NULL }, NULL };
    struct reg *ggml_backend_nodevice_reg(void) { return &no_devices; }
    struct reg *ggml_backend_broken_reg(void) { return NULL; }
    """
)


@pytest.fixture(scope="session")
def host_build() -> builds.Built:
    return builds.ensure("host")


@pytest.fixture(scope="session")
def fake_backend(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("fake-ggml")
    src = work / "fake.c"
    src.write_text(FAKE_BACKEND_C)
    lib = work / "libggml-fake.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    return lib


def settings(built: builds.Built, *, lib: str | Path | None = "cpu", reg: str | None = "ggml_backend_cpu_reg",
             backend: str | Path | None = None) -> apir.ApirSettings:
    library = str(built.library("libggml-cpu.so")) if lib == "cpu" else (str(lib) if lib is not None else None)
    return apir.ApirSettings.resolve(backend=str(backend or built.library("libggml-virtgpu-backend.so")),
                                     ggml_library=library, ggml_reg=reg, env={})


def expect_failure(s: apir.ApirSettings, code_name: str) -> tuple[adapter.ProbeResult, ApirCheckFailed]:
    result = apir.probe(s)
    assert result.code_name == code_name, result.as_dict()
    error = apir.failure(result, s)
    assert error is not None
    assert error.code == "E040" and error.exit_status == 50
    with pytest.raises(ApirCheckFailed):
        apir.run_check(s)
    return result, error


def test_cpu_backend_initializes_and_the_dispatcher_reports_the_cpu_device(host_build):
    result = apir.run_check(settings(host_build), alloc_bytes=4 << 20)
    assert result.code == 6 and result.code_name == "SUCCESS"
    assert result.get_config_calls == ["ggml.library.path", "ggml.library.reg"]
    dev = result.device
    assert dev is not None
    assert dev["count"] == 1 and dev["name"] == "CPU" and dev["type"] == "CPU"
    assert dev["memory_total"] > 0 and 0 < dev["memory_free"] <= dev["memory_total"]
    assert dev["buffer_type"] == "CPU" and dev["buffer_alignment"] > 0
    assert set(dev["dispatch_returns"].values()) == {0}
    buf = result.buffer
    assert buf is not None and buf["allocated"] and buf["cleared"] and buf["freed"] and buf["base_nonzero"]
    assert {"dlopen_backend", "initialize", "cmd.device_get_memory", "deinit"} <= set(result.timings_ms)
    # Both libraries share one libggml-base (first loaded wins by soname).
    assert sum("libggml-base" in p for p in result.ggml_libs_mapped) == 1


def test_cli_check_reads_the_hypervisor_env_vars_and_reports_json(host_build, monkeypatch, capsys):
    monkeypatch.setenv(adapter.ENV_BACKEND, str(host_build.library("libggml-virtgpu-backend.so")))
    monkeypatch.setenv(adapter.ENV_GGML_PATH, str(host_build.library("libggml-cpu.so")))
    monkeypatch.setenv(adapter.ENV_GGML_REG, "ggml_backend_cpu_reg")
    assert cli_main(["apir", "check", "--json", "--alloc-mib", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "ok" and shown["error"] is None
    report = shown["data"]
    assert report["settings"]["sources"][adapter.ENV_GGML_REG] == f"${adapter.ENV_GGML_REG}"
    assert report["result"]["device"]["description"]
    assert report["result"]["buffer"]["freed"] is True


def test_missing_library_path_is_env_var_missing_naming_the_variable(host_build, capsys):
    s = settings(host_build, lib=None)
    result, error = expect_failure(s, "ENV_VAR_MISSING")
    assert result.code == 3
    assert any("APIR_LLAMA_CPP_GGML_LIBRARY_PATH' not defined" in line for line in result.logs)
    assert "APIR_LLAMA_CPP_GGML_LIBRARY_PATH" in (error.fix or "") and "ggml.library.path" in (error.fix or "")
    status = cli_main(["apir", "check", "--backend", s.backend or "", "--reg", "ggml_backend_cpu_reg"])
    assert status == 50
    err = capsys.readouterr().err
    assert "E040" in err and "fix: set APIR_LLAMA_CPP_GGML_LIBRARY_PATH" in err


def test_nonexistent_library_is_cannot_open_with_the_loader_message(host_build):
    result, error = expect_failure(settings(host_build, lib="/nonexistent/libggml-cuda.so"), "CANNOT_OPEN")
    assert result.code == 4
    assert "cannot open shared object file: No such file or directory" in error.message
    fix = error.fix or ""
    assert "/nonexistent/libggml-cuda.so" in fix and "APIR_LLAMA_CPP_GGML_LIBRARY_PATH" in fix


def test_non_elf_library_is_cannot_open_with_the_loader_message(host_build, tmp_path):
    junk = tmp_path / "libggml-junk.so"
    junk.write_text("this is not an ELF shared object, only text that looks like one by name\n" * 4)
    result, error = expect_failure(settings(host_build, lib=junk), "CANNOT_OPEN")
    assert "invalid ELF header" in error.message or "file too short" in error.message


def test_wrong_registration_symbol_is_symbol_missing_naming_the_reg_variable(host_build):
    result, error = expect_failure(settings(host_build, reg="ggml_backend_nope_reg"), "SYMBOL_MISSING")
    assert result.code == 5
    assert "undefined symbol: ggml_backend_nope_reg" in error.message
    assert "APIR_LLAMA_CPP_GGML_LIBRARY_REG" in (error.fix or "") and "ggml.library.reg" in (error.fix or "")


def test_default_registration_symbol_on_a_non_dl_build_is_symbol_missing(host_build):
    result, error = expect_failure(settings(host_build, reg=None), "SYMBOL_MISSING")
    assert result.get_config_calls == ["ggml.library.path", "ggml.library.reg"]
    assert "ggml_backend_init" in error.message
    assert "GGML_BACKEND_DL" in (error.fix or "")


def test_registration_without_devices_is_no_device(host_build, fake_backend):
    result, error = expect_failure(settings(host_build, lib=fake_backend, reg="ggml_backend_nodevice_reg"), "NO_DEVICE")
    assert result.code == 6 + 8
    assert any("no device found" in line for line in result.logs)
    assert "CUDA_VISIBLE_DEVICES" in (error.fix or "")


def test_registration_returning_null_is_backend_reg_failed(host_build, fake_backend):
    result, error = expect_failure(settings(host_build, lib=fake_backend, reg="ggml_backend_broken_reg"),
                                   "BACKEND_REG_FAILED")
    assert result.code == 6 + 6
    assert "ggml_backend_broken_reg" in (error.fix or "")


def test_second_initialize_in_one_process_shares_the_backend(host_build):
    # What a second virgl context of one hypervisor process gets (krunkit's, in process): with 0020 the same
    # library is shared, where upstream answered 6 + 7 ALREADY_INITED; the device still answers after it.
    s = settings(host_build)
    result = adapter.probe(adapter.ProbeRequest(backend=s.backend or "", ggml_library=s.ggml_library,
                                                ggml_reg=s.ggml_reg, init_twice=True, query_device=True))
    assert result.first_code == 6 and result.code == 6 and result.ok, (result.code_name, result.logs)
    assert result.device and result.device.get("count") == 1, result.device
    assert apir.failure(result, s) is None


def test_already_inited_names_the_one_library_a_process_shares() -> None:
    result = adapter.ProbeResult(request={}, stage="initialize", ok=False, code=6 + 7, code_name="ALREADY_INITED")
    error = apir.failure(result, apir.ApirSettings.resolve(backend="/x/libggml-virtgpu-backend.so",
                                                           ggml_library="/x/libggml-cpu.so",
                                                           ggml_reg="ggml_backend_cpu_reg", env={}))
    assert error is not None and error.exit_status == 50
    assert "APIR_LLAMA_CPP_GGML_LIBRARY_PATH" in (error.fix or "") and "restart" in (error.fix or "")


def test_backend_path_that_is_not_a_regular_file_fails_before_loading(host_build, tmp_path):
    s = settings(host_build, backend=tmp_path)
    result = apir.probe(s)
    assert result.stage == "stat" and "not a regular file" in (result.loader_error or "")
    error = apir.failure(result, s)
    assert error is not None and "VIRGL_APIR_BACKEND_LIBRARY" in (error.fix or "")


def test_library_without_apir_entry_points_fails_at_dlsym(host_build):
    s = settings(host_build, backend=host_build.library("libggml-cpu.so"))
    result = apir.probe(s)
    assert result.stage == "dlsym" and "apir_backend_initialize" in (result.loader_error or "")
    error = apir.failure(result, s)
    assert error is not None and "VIRGL_APIR_BACKEND_LIBRARY" in (error.fix or "")


def test_doctor_checks_skip_when_unconfigured_and_pass_on_the_real_backend(host_build):
    unconfigured = apir.apir_checks(apir.ApirSettings.resolve(env={}))
    assert [c.status for c in unconfigured if c.id == "apir.backend"] == ["skip"]
    good = apir.apir_checks(settings(host_build))
    backend = next(c for c in good if c.id == "apir.backend")
    assert backend.status == "ok" and "CPU" in backend.evidence
    bad = apir.apir_checks(settings(host_build, reg="ggml_backend_nope_reg"))
    failed = next(c for c in bad if c.id == "apir.backend")
    assert failed.status == "fail" and "APIR_LLAMA_CPP_GGML_LIBRARY_REG" in (failed.fix or "")


def test_host_build_is_relocatable_and_never_declares_the_venus_download(host_build, tmp_path):
    work = Path(str(host_build.manifest["build_dir"]))
    ninja = (work / "build.ninja").read_text()
    assert "gitlab" not in ninja and "venus_hw_header-download" not in ninja
    moved = tmp_path / "bin"
    shutil.copytree(host_build.bin_dir, moved, symlinks=True)
    s = apir.ApirSettings.resolve(backend=str(moved / "libggml-virtgpu-backend.so"),
                                  ggml_library=str(moved / "libggml-cpu.so"), ggml_reg="ggml_backend_cpu_reg", env={})
    result = apir.run_check(s)
    assert all(str(moved) in p for p in result.ggml_libs_mapped), result.ggml_libs_mapped
    assert host_build.manifest["targets"] == list(ggml_build.VARIANTS["host"].targets)
