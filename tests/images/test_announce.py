"""A build a command needs but was not named for is announced (what it fetches, how long it
usually takes), asked for on a terminal (y builds, n builds nothing: E026), and goes ahead with
the announcement where nobody can answer."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from provision.adapters import podman
from provision.core import catalog, layout, pins, settings
from provision.images import announce
from provision.images import build as images
from tests.images.test_image_build import smoke_catalog


def _plan(stack_name: str, *, images_here: frozenset[str] = frozenset(), sdist_here: bool = False):
    p = pins.default()
    stack = catalog.load().get(stack_name)
    rendered = images.render_stack(stack, p)
    return announce.plan(
        stack, rendered, p, image=images.default_tag(rendered), base_image=images.base_ref("debian", p),
        have_image=lambda ref: ref in images_here, have_file=lambda _: sdist_here, needs_source=True,
        needed_by="this command",
    )  # fmt: skip


def test_the_announcement_names_what_is_fetched_and_how_long_it_takes():
    p = pins.default()
    sdist = p.require("llama-cpp-python-sdist", purpose="test")
    work = _plan("llama-apir-linux")
    assert work is not None
    text = "\n".join(work.lines())
    assert "llama-apir-linux image (localhost/krun-gpu/llama-apir-linux:" in text
    assert f"{sdist['version']} sdist through pip ({int(sdist['size']) / (1 << 20):.1f} MiB)" in text
    assert "debootstrap" in text and "apt packages, network on" in text
    assert "compiles llama.cpp" in text
    lo, hi = work.minutes
    assert 0 < lo < hi and f"usually {lo}-{hi} min in all" in text
    assert "`provision image build llama-apir-linux`" in text


def test_only_the_missing_parts_are_announced_and_a_built_image_is_not():
    p = pins.default()
    stack = catalog.load().get("llama-apir-linux")
    rendered = images.render_stack(stack, p)
    stages = {s.ref for s in rendered.package_stages}
    work = _plan("llama-apir-linux", images_here=frozenset({images.base_ref("debian", p), *stages}), sdist_here=True)
    assert work is not None and [part.what for part in work.parts] == [
        "the llama-apir-linux build (compiles llama.cpp, network off)"
    ]
    assert _plan("llama-apir-linux", images_here=frozenset({images.default_tag(rendered)})) is None


# The child: one unasked build of the test stack, its announcement on stderr as a command shows it.
CHILD = """
import sys
from pathlib import Path
from provision.core import catalog
from provision.core.errors import ProvisionError
from provision.images import announce
say = lambda line: print(line, file=sys.stderr, flush=True)
try:
    announce.build_unasked("busybox-smoke", needed_by="this command", catalog=catalog.load(Path(sys.argv[1])),
                           base_image=sys.argv[2], tag=sys.argv[3], log=say)
except ProvisionError as e:
    say(f"{e.code}: {e}")
    say(f"fix: {e.fix}")
    sys.exit(e.exit_status)
say("built")
"""


def _child(tmp_path: Path, base: str, tag: str) -> list[str]:
    return [sys.executable, "-c", CHILD, str(smoke_catalog(tmp_path, ["busybox true"])), base, tag]


def _on_a_terminal(argv: list[str], answer: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``argv`` with stdin, stdout and stderr on a pty; answer the question when it comes."""
    main, sub = pty.openpty()
    env = {**os.environ, "PROVISION_ASK_BUILDS": "1", **(env or {})}
    proc = subprocess.Popen(argv, stdin=sub, stdout=sub, stderr=sub, env=env)
    os.close(sub)
    out = b""
    answered = False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if not answered and b"build it now? [y/N] " in out:
                os.write(main, answer.encode() + b"\n")
                answered = True
        elif proc.poll() is not None:
            break
    status = proc.wait(timeout=60)
    os.close(main)
    return status, out.decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.slow
@pytest.mark.podman
def test_on_a_terminal_no_builds_nothing(tmp_path, busybox_image):
    tag = f"localhost/krun-gpu-test/announce:{uuid.uuid4().hex[:12]}"
    status, out = _on_a_terminal(_child(tmp_path, busybox_image, tag), "n")
    assert "this command needs the busybox-smoke image" in out and "usually" in out
    assert "build it now? [y/N] " in out
    assert status == 36, out
    assert "E026: " in out and "build declined; nothing was fetched or built" in out
    assert "fix: run `provision image build busybox-smoke` first" in out
    assert "STEP " not in out and not podman.exists(tag)


@pytest.mark.slow
@pytest.mark.podman
def test_on_a_terminal_yes_builds_the_image(tmp_path, busybox_image):
    tag = f"localhost/krun-gpu-test/announce:{uuid.uuid4().hex[:12]}"
    try:
        status, out = _on_a_terminal(_child(tmp_path, busybox_image, tag), "y")
        assert status == 0, out
        assert out.index("build it now? [y/N] ") < out.index("STEP 1/")
        assert "built" in out.splitlines()[-1] and podman.exists(tag)
    finally:
        subprocess.run(["podman", "rmi", "--force", tag], capture_output=True)


@pytest.mark.slow
@pytest.mark.podman
def test_without_a_terminal_the_build_is_announced_and_goes_ahead(tmp_path, busybox_image):
    tag = f"localhost/krun-gpu-test/announce:{uuid.uuid4().hex[:12]}"
    try:
        done = subprocess.run(_child(tmp_path, busybox_image, tag), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        err = done.stderr
        assert "this command needs the busybox-smoke image" in err and "[y/N]" not in err
        assert err.index("not asking (no terminal, or ask_builds is 0); building") < err.index("STEP 1/")
        assert podman.exists(tag)
    finally:
        subprocess.run(["podman", "rmi", "--force", tag], capture_output=True)


@pytest.mark.slow
@pytest.mark.podman
def test_run_announces_and_asks_before_building_its_stacks_image(tmp_path):
    """`provision run STACK` on a terminal, its image not built (templates changed by a comment,
    so the tag is new): the announcement and question come before any build; no builds nothing."""
    root = tmp_path / "data"
    shutil.copytree(layout.data_root() / "containerfiles", root / "containerfiles")
    shutil.copytree(layout.data_root() / "patches", root / "patches")
    for template in (root / "containerfiles").glob("*.containerfile.j2"):
        template.write_text(template.read_text() + f"\n# {uuid.uuid4().hex}\n")
    argv = [sys.executable, "-m", "provision", "run", "cpu", "--", "true"]
    status, out = _on_a_terminal(argv, "n", env={"PROVISION_DATA_ROOT": str(root)})
    assert "this command needs the cpu image (localhost/krun-gpu/cpu:" in out, out
    assert "apt packages, network on" in out and "usually" in out
    assert status == 36 and "E026" in out, out
    assert "STEP " not in out
    tag = re.search(r"the cpu image \((localhost/krun-gpu/cpu:[0-9a-f]+)\)", out)
    assert tag and not podman.exists(tag.group(1))


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_only_the_main_thread_on_a_terminal_asks_and_ask_builds_0_never(monkeypatch):
    monkeypatch.setattr(sys, "stdin", _Tty("y\n"))
    monkeypatch.setattr(sys, "stderr", _Tty())
    ask = announce.terminal_ask(settings.load(flags=["ask_builds=1"]))
    assert ask is not None and ask("build it now? [y/N] ") is True
    assert sys.stderr.getvalue() == "build it now? [y/N] "
    assert announce.terminal_ask(settings.load(flags=["ask_builds=0"])) is None
    from_a_job: list[object] = []
    job = threading.Thread(target=lambda: from_a_job.append(announce.terminal_ask(settings.load())))
    job.start()
    job.join()
    assert from_a_job == [None]  # an API job's thread never waits on the server's terminal
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal
    assert announce.terminal_ask(settings.load(flags=["ask_builds=1"])) is None


def test_end_of_input_is_no(monkeypatch):
    monkeypatch.setattr(sys, "stdin", _Tty(""))
    monkeypatch.setattr(sys, "stderr", _Tty())
    ask = announce.terminal_ask(settings.load(flags=["ask_builds=1"]))
    assert ask is not None and ask("build it now? [y/N] ") is False


@pytest.mark.slow
@pytest.mark.podman
def test_run_yes_builds_without_asking(tmp_path):
    """`run --yes` on a terminal: the announcement, no question, and the build starts (its first
    package step made to fail at once, so the test does not fetch a package)."""
    root = tmp_path / "data"
    shutil.copytree(layout.data_root() / "containerfiles", root / "containerfiles")
    shutil.copytree(layout.data_root() / "patches", root / "patches")
    template = root / "containerfiles" / "packages-debian.containerfile.j2"
    marker = f"stop-{uuid.uuid4().hex}"
    text = template.read_text()
    assert "\nFROM {{ base_image }}\n" in text
    failing = f"\nFROM {{{{ base_image }}}}\nRUN echo {marker}; exit 3\n"
    template.write_text(text.replace("\nFROM {{ base_image }}\n", failing, 1))
    argv = [sys.executable, "-m", "provision", "run", "--yes", "cpu", "--", "true"]
    status, out = _on_a_terminal(argv, "n", env={"PROVISION_DATA_ROOT": str(root)})
    assert "this command needs the cpu image" in out, out
    assert "[y/N]" not in out and "not asking (no terminal, or ask_builds is 0); building" in out
    assert marker in out and "E005" in out and status != 0, out
