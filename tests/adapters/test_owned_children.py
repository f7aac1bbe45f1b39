"""Builds and archive tools run on the owned process tree: a killed provision takes them along.

Each test starts a real provision process that runs the real program (cmake configuring a
project that hangs, zstd reading a pipe nobody writes), kills that provision with SIGKILL
(no cleanup of its own runs) and asserts the program and its children are gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from provision.adapters import procs
from provision.hosts.linux.run import render_workers

CMAKE_STANDIN = textwrap.dedent(
    """
    import sys
    from dataclasses import dataclass
    from pathlib import Path
    from provision.adapters import cmake

    src, build = Path(sys.argv[1]), Path(sys.argv[2])

    @dataclass
    class Plan:
        variant: str = "host"
        source: Path = src
        build_dir: Path = build
        configure: tuple = ()
        build: tuple = ()
        artifacts: tuple = ()

    plan = Plan(configure=["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja"],
                build=["cmake", "--build", str(build)])
    cmake.run(plan, log=build / "build.log", progress=print)
    """
)

ZSTD_STANDIN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from provision.hosts.linux.tools import bundle_archive
    bundle_archive._unpack(Path(sys.argv[1]), Path(sys.argv[2]), "zst")
    """
)


def _below(pid: int, name: str, timeout: float = 60.0) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = render_workers.descendants(pid)
        if name in found.values():
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {name} under {pid} within {timeout} s: {render_workers.descendants(pid)}")


def _gone(pids: list[int], within: float = 15.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if procs.start_time(p) is not None and render_workers.zombie_status(p) is None]
        if not left:
            return []
        time.sleep(0.1)
    return left


def _kill_provision(script: str, args: list[str], name: str, tmp_path: Path) -> dict[int, str]:
    env = {**os.environ, "PROVISION_CACHE": str(tmp_path / "cache")}
    owner = subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.DEVNULL)
    try:
        children = _below(owner.pid, name)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        return children
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_a_killed_provision_takes_its_cmake_configure_with_it(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    # cmake's configure step runs `sleep`: the build is mid-step when provision dies.
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(hang NONE)\nexecute_process(COMMAND sleep 600)\n"
    )
    children = _kill_provision(CMAKE_STANDIN, [str(src), str(tmp_path / "build")], "sleep", tmp_path)
    assert "cmake" in children.values()
    assert _gone(list(children)) == [], f"left running: {children}"


def test_a_killed_provision_takes_its_zstd_with_it(tmp_path: Path) -> None:
    fifo = tmp_path / "bundle.tar.zst"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # holds the pipe open, writes nothing: zstd waits for bytes
    try:
        children = _kill_provision(ZSTD_STANDIN, [str(fifo), str(tmp_path / "into")], "zstd", tmp_path)
        assert _gone(list(children)) == [], f"left running: {children}"
    finally:
        os.close(writer)
