"""The host-tools bundle's parts on real files: ELF parsing against ldd, the library closure,
the wrappers under a real sh, and install's all-or-nothing check of every file."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from provision.adapters import elf
from provision.core.errors import HostToolsMissing, InvalidValue
from provision.hosts.linux.tools import bundle, bundle_archive, host_tools

SH = Path("/bin/sh")


def ldd_names(program: Path) -> set[str]:
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True).stdout
    return {m.group(1) for m in re.finditer(r"^\s*(\S+\.so\S*) =>", out, re.M)}


def test_elf_parse_reads_needed_and_interpreter_of_a_real_program() -> None:
    dyn = elf.read(SH.resolve())
    assert "libc.so.6" in dyn.needed
    assert dyn.interpreter is not None and dyn.interpreter.endswith("ld-linux-x86-64.so.2")


def test_elf_parse_refuses_a_file_that_is_not_elf(tmp_path: Path) -> None:
    script = tmp_path / "x.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(elf.NotElf):
        elf.read(script)
    assert not elf.is_elf(script)


@pytest.mark.parametrize("program", ["usr/bin/ls", "usr/bin/python3"])
def test_closure_of_a_host_program_is_what_ldd_resolves(program: str) -> None:
    libs = bundle.closure(Path("/"), [program])
    # ldd prints the loader (which libc.so.6 names) without "=>": the rest must agree exactly.
    assert set(libs) - {bundle.LOADER} == ldd_names(Path("/") / program)
    assert all(p.is_file() for p in libs.values())


def test_closure_names_each_missing_library(tmp_path: Path) -> None:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/ls").write_bytes(Path("/usr/bin/ls").read_bytes())
    with pytest.raises(HostToolsMissing) as err:
        bundle.closure(tmp_path, ["usr/bin/ls"])
    assert "libc.so.6 (needed by /usr/bin/ls)" in err.value.message
    assert err.value.code == "E020"


def test_wrapper_is_valid_sh_and_passes_the_callers_library_path_first(tmp_path: Path) -> None:
    text = bundle.wrapper("usr/lib/krun-gpu/bin/qemu-system-x86_64", "qemu", 2)
    script = tmp_path / "usr/bin/qemu-system-x86_64"
    script.parent.mkdir(parents=True)
    script.write_text(text)
    subprocess.run(["sh", "-n", str(script)], check=True)
    assert 'libs="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$lib"' in text
    assert '-L "$here/usr/share/qemu"' in text and "QEMU_MODULE_DIR" in text
    # A fake loader in place of ld.so shows what the wrapper execs, from any working directory.
    lib = tmp_path / bundle.LIB
    lib.mkdir(parents=True)
    loader = lib / bundle.LOADER
    loader.write_text('#!/bin/sh\nprintf "%s\\n" "$@"; echo "RS=$RENDER_SERVER_EXEC_PATH"\n')
    loader.chmod(0o755)
    script.chmod(0o755)
    out = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, check=True, cwd="/", env={"LD_LIBRARY_PATH": "/a"}
    ).stdout.splitlines()
    assert out[:6] == [
        "--library-path",
        f"/a:{lib}",
        "--argv0",
        str(script),
        f"{tmp_path}/usr/lib/krun-gpu/bin/qemu-system-x86_64",
        "-L",
    ]
    assert out[-2] == "--version"
    assert out[-1] == f"RS={tmp_path}/usr/libexec/virgl_render_server"


def staged(tmp_path: Path) -> Path:
    top = tmp_path / "staged"
    (top / "usr/bin").mkdir(parents=True)
    (top / "usr/bin/tool").write_text("#!/bin/sh\necho tool\n")
    (top / "usr/bin/tool").chmod(0o755)  # the mode travels in the tar
    (top / "usr/share/data.txt").parent.mkdir(parents=True)
    (top / "usr/share/data.txt").write_text("data\n")
    (top / bundle_archive.MANIFEST).write_text(
        json.dumps({"format": bundle_archive.FORMAT, "guest": {}, "files": bundle_archive.hashes(top)})
    )
    return top


def test_pack_then_install_gives_the_same_files_and_an_executable_wrapper(tmp_path: Path) -> None:
    archive = tmp_path / "b.tar.zst"
    bundle_archive.pack(staged(tmp_path), archive, level=3)
    dest = bundle_archive.install(archive, tmp_path / "tools")
    assert (dest / "usr/share/data.txt").read_text() == "data\n"
    assert subprocess.run([str(dest / "usr/bin/tool")], capture_output=True, text=True).stdout == "tool\n"
    assert bundle_archive.is_bundle(dest)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dirs left


def test_install_refuses_a_bundle_whose_file_differs_from_the_manifest_and_installs_nothing(tmp_path: Path) -> None:
    top = staged(tmp_path)
    (top / "usr/share/data.txt").write_text("changed\n")
    archive = tmp_path / "b.tar.zst"
    bundle_archive.pack(top, archive, level=3)
    old = tmp_path / "tools"
    old.mkdir()
    (old / "kept").write_text("previous install\n")
    with pytest.raises(HostToolsMissing) as err:
        bundle_archive.install(archive, old)
    assert "usr/share/data.txt" in err.value.message
    assert (old / "kept").read_text() == "previous install\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.tar.zst", "staged", "tools"]


def test_install_refuses_links_and_paths_leaving_the_directory(tmp_path: Path) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        link = tarfile.TarInfo("usr/bin/evil")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        data = b"x"
        up = tarfile.TarInfo("../outside")
        up.size = len(data)
        tar.addfile(up, io.BytesIO(data))
    archive = tmp_path / "bad.tar.zst"
    archive.write_bytes(subprocess.run(["zstd", "-q", "-c"], input=raw.getvalue(), capture_output=True).stdout)
    with pytest.raises(HostToolsMissing) as err:
        bundle_archive.install(archive, tmp_path / "tools")
    assert "usr/bin/evil" in err.value.message and "../outside" in err.value.message
    assert not (tmp_path / "outside").exists() and not (tmp_path / "tools").exists()


def no_zstd_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PATH holds one empty directory, so no zstd is found (the H200 host had none)."""
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    assert shutil.which("zstd") is None


@pytest.mark.parametrize("suffix", [".tar.xz", ".tar.gz", ".tgz"])
def test_xz_and_gzip_bundles_install_with_no_zstd_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    archive = tmp_path / f"b{suffix}"
    bundle_archive.pack(staged(tmp_path), archive, level=3)
    no_zstd_on_path(monkeypatch, tmp_path)
    dest = bundle_archive.install(archive, tmp_path / "tools")
    assert (dest / "usr/share/data.txt").read_text() == "data\n"
    assert subprocess.run([SH, str(dest / "usr/bin/tool")], capture_output=True, text=True).stdout == "tool\n"
    assert (dest / "usr/bin/tool").stat().st_mode & 0o100
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_install_reads_the_compression_from_the_bytes_not_the_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = tmp_path / "b.tar.gz"
    bundle_archive.pack(staged(tmp_path), made, level=3)
    misnamed = tmp_path / "b.tar.zst"
    made.rename(misnamed)
    no_zstd_on_path(monkeypatch, tmp_path)
    assert bundle_archive.sniff(misnamed) == "gz"
    assert (bundle_archive.install(misnamed, tmp_path / "tools") / "usr/share/data.txt").is_file()


def test_a_zstd_bundle_without_zstd_names_the_tool_and_the_xz_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "b.tar.zst"
    bundle_archive.pack(staged(tmp_path), archive, level=3)
    no_zstd_on_path(monkeypatch, tmp_path)
    with pytest.raises(HostToolsMissing) as err:
        bundle_archive.install(archive, tmp_path / "tools")
    assert "no zstd program" in err.value.message and ".tar.xz" in err.value.fix
    assert not (tmp_path / "tools").exists()
    with pytest.raises(HostToolsMissing) as err:
        bundle_archive.pack(staged(tmp_path / "again"), tmp_path / "c.tar.zst")
    assert "c.tar.xz" in err.value.fix and not (tmp_path / "c.tar.zst.partial").exists()


def test_pack_refuses_a_name_that_says_no_compression(tmp_path: Path) -> None:
    with pytest.raises(InvalidValue) as err:
        bundle_archive.pack(staged(tmp_path), tmp_path / "b.tar")
    assert ".tar.xz" in err.value.message and not list(tmp_path.glob("b.tar*"))


@pytest.mark.parametrize("mode", ["w:xz", "w:gz"])
def test_python_unpacking_refuses_links_devices_and_escaping_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    archive = tmp_path / f"bad.tar.{mode[2:]}"
    with tarfile.open(archive, mode=mode) as tar:
        entries = [("usr/bin/evil", tarfile.SYMTYPE, "/etc/passwd"), ("usr/bin/hard", tarfile.LNKTYPE, "../../x"),
                   ("dev/null", tarfile.CHRTYPE, ""), ("usr/lib", tarfile.SYMTYPE, "/usr/lib")]
        for name, kind, target in entries:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tar.addfile(info)
        for name in ("../outside", "/abs-file", "usr/../../up"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        ok = tarfile.TarInfo("usr/lib/libfine.so")  # would land through the usr/lib link if links were made
        ok.size = 1
        tar.addfile(ok, io.BytesIO(b"y"))
    no_zstd_on_path(monkeypatch, tmp_path)
    with pytest.raises(HostToolsMissing) as err:
        bundle_archive.install(archive, tmp_path / "tools")
    for name in ("usr/bin/evil", "usr/bin/hard", "dev/null", "../outside", "/abs-file", "usr/../../up"):
        assert name in err.value.message
    assert not (tmp_path / "outside").exists() and not Path("/abs-file").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name, "bare-bin"]  # no tools, no temp dir


def test_a_truncated_xz_bundle_installs_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "b.tar.xz"
    bundle_archive.pack(staged(tmp_path), archive, level=3)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(HostToolsMissing) as err:
        bundle_archive.install(archive, tmp_path / "tools")
    assert "is not a bundle" in err.value.message and not (tmp_path / "tools").exists()


def test_install_names_a_file_that_is_not_a_bundle(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.zst"
    junk.write_bytes(b"not zstd at all")
    with pytest.raises(HostToolsMissing):
        bundle_archive.install(junk, tmp_path / "tools")
    with pytest.raises(HostToolsMissing) as err:
        bundle_archive.install(tmp_path / "absent.tar.zst", tmp_path / "tools")
    assert "is not a file" in err.value.message
    assert ".tar.xz" in (err.value.fix or "")  # the formats Python unpacks alone are named too


def test_locate_takes_an_installed_bundle_from_the_env_and_runs_its_programs_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = staged(tmp_path)
    monkeypatch.setenv(host_tools.ENV_VAR, str(top))
    tools = host_tools.locate()
    assert tools is not None and tools.bundle and not tools.is_chroot
    assert tools.wrap(["qemu-system-x86_64", "--version"]) == [str(top / "usr/bin/qemu-system-x86_64"), "--version"]
    assert tools.as_dict()["bundle"] is True


def test_xz_packs_with_the_xz_program_on_every_core_and_with_python_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shutil.which("xz"), "scripts/setup-debian installs xz-utils"
    piped = tmp_path / "piped.tar.xz"
    spawned: list[list[str]] = []
    real_start = bundle_archive.runner.start

    def spy(argv: list[str], *args: Any, **kw: Any) -> Any:
        spawned.append(list(argv))
        return real_start(argv, *args, **kw)  # on the owned tree, as the packer starts it

    monkeypatch.setattr(bundle_archive.runner, "start", spy)
    bundle_archive.pack(staged(tmp_path), piped, level=3)
    assert spawned and spawned[0][:3] == ["xz", "-q", "-T0"]
    monkeypatch.setattr(bundle_archive.runner, "found", lambda name: None)
    plain = tmp_path / "plain.tar.xz"
    bundle_archive.pack(staged(tmp_path / "again"), plain, level=3)
    for archive in (piped, plain):
        dest = bundle_archive.install(archive, tmp_path / f"tools-{archive.stem}")
        assert (dest / "usr/share/data.txt").read_text() == "data\n"
