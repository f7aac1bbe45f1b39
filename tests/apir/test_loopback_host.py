"""The APIR loopback on a host without the chroot: the chroot's script on the host's paths."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provision.core.errors import InvalidValue
from provision.hosts.linux.apir import loopback, loopback_no_chroot


def dirs(tmp_path: Path, **over: Path) -> loopback_no_chroot.HostDirs:
    base = {"tree": tmp_path / "llama.cpp", "loopback_src": tmp_path / "lb", "patches": tmp_path / "patches",
            "work": tmp_path / "work", "drm_include": tmp_path / "inc", "lib": tmp_path / "ggml-bin"}
    base.update(over)
    return loopback_no_chroot.HostDirs(**base)


def test_the_host_script_is_the_chroot_script_with_every_chroot_path_replaced(tmp_path: Path) -> None:
    d = dirs(tmp_path)
    script = loopback_no_chroot.build_script(d, ["0001-x.patch"], "cuda")
    chroot = loopback.build_script(["0001-x.patch"], "cuda")
    assert script.count("\n") == chroot.count("\n")
    for old in ("/src/llama.cpp", "/src/loopback", "/src/patches", "/opt/krun-gpu"):
        assert old in chroot and old not in script
    assert not re.search(r"(?<![\w/])/work/", script)  # every chroot WORK path moved (tmp_path has none)
    assert f"-I{d.drm_include} -I{d.drm_include}/libdrm " in script
    assert f"-Wl,-rpath,{d.bin}:{d.lib}" in script and f"-L{d.lib} -lggml-base" in script
    assert f"patch -d {d.work}/src -p1 --forward --batch -i {d.patches}/0001-x.patch" in script


def test_a_host_path_that_contains_the_chroot_work_path_is_kept_whole(tmp_path: Path) -> None:
    lib = Path(loopback.WORK) / "wt" / "x" / "ggml" / "bin"  # a host directory under the chroot's WORK path
    script = loopback_no_chroot.build_script(dirs(tmp_path, lib=lib), [], "cpu")
    assert f"-L{lib} " in script and str(tmp_path / "work") not in str(lib)


def test_paths_that_cannot_sit_inside_a_compiler_flag_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidValue) as err:
        loopback_no_chroot.build_script(dirs(tmp_path, tree=tmp_path / "has space"), [], "cuda")
    assert "llama.cpp tree" in err.value.message


def test_the_bench_env_finds_the_loopback_registry_before_the_hosts_and_names_the_cuda_backend(tmp_path: Path) -> None:
    d = dirs(tmp_path)
    env = loopback_no_chroot.bench_env(d, "cuda")
    assert env["LD_LIBRARY_PATH"].split(":") == [str(d.bin), str(d.lib)]
    assert env["VIRGL_APIR_BACKEND_LIBRARY"] == f"{d.bin}/libggml-virtgpu-backend.so"
    assert env["APIR_LLAMA_CPP_GGML_LIBRARY_PATH"] == f"{d.lib}/libggml-cuda.so"
    assert env["APIR_LLAMA_CPP_GGML_LIBRARY_REG"] == "ggml_backend_cuda_reg"


def test_ratios_pair_the_same_test_and_divide_apir_by_native() -> None:
    native = [{"n_prompt": 512, "n_gen": 0, "avg_ts": 1000.0, "stddev_ts": 10.0},
              {"n_prompt": 0, "n_gen": 128, "avg_ts": 400.0, "stddev_ts": 4.0}]
    remote = [{"n_prompt": 0, "n_gen": 128, "avg_ts": 100.0, "stddev_ts": 1.0},
              {"n_prompt": 512, "n_gen": 0, "avg_ts": 500.0, "stddev_ts": 5.0},
              {"n_prompt": 64, "n_gen": 0, "avg_ts": 1.0}]  # no native twin: left out
    rows = loopback_no_chroot.ratios(native, remote)
    assert [(r["test"], r["ratio"]) for r in rows] == [("tg128", 0.25), ("pp512", 0.5)]
