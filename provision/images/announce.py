"""Work a command needs but was not named for (a stack's image for `run`), said before it starts.

An image build can fetch Debian packages, the llama.cpp source and compile for many minutes;
a user who typed `run` should learn that, and on a terminal be asked, before any of it begins.
``plan`` says what is missing (pure over what it is told exists); ``confirm`` shows it and asks;
``build_unasked`` is the one call a command makes where it would otherwise build silently.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.core import catalog as catalog_mod
from provision.core import paths, settings
from provision.core import pins as pins_mod
from provision.core.errors import RunCancelled
from provision.core.log import say
from provision.images import render, sources

# Rough minutes each part takes on a two-core host with a working network (what the project's
# own builds took); a step podman has cached takes seconds, so only missing parts are listed.
MINUTES = {"base": (2, 5), "source": (0, 1), "packages": (2, 10), "compile": (5, 25), "assemble": (0, 2)}


@dataclass(frozen=True)
class Part:
    what: str
    fetches: str  # "" when it fetches nothing
    minutes: tuple[int, int]


@dataclass(frozen=True)
class Work:
    """What a command will build first, and the command that does it on its own."""

    title: str
    needed_by: str
    parts: tuple[Part, ...]
    command: str

    @property
    def minutes(self) -> tuple[int, int]:
        return sum(p.minutes[0] for p in self.parts), sum(p.minutes[1] for p in self.parts)

    def lines(self) -> list[str]:
        lo, hi = self.minutes
        out = [f"{self.needed_by} needs {self.title}, not built yet; building it first:"]
        for p in self.parts:
            fetch = f"; fetches {p.fetches}" if p.fetches else "; nothing fetched"
            out.append(f"  - {p.what}{fetch} (usually {_span(*p.minutes)})")
        out.append(f"  usually {_span(lo, hi)} in all; `{self.command}` does the same on its own")
        return out


def _span(lo: int, hi: int) -> str:
    return f"under {hi} min" if lo == 0 else f"{lo}-{hi} min"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def plan(
    stack: catalog_mod.Stack,
    rendered: render.Rendered,
    pins: pins_mod.Pins,
    *,
    image: str,
    base_image: str | None,
    have_image: Callable[[str], bool],
    have_file: Callable[[Path], bool],
    needs_source: bool,
    needed_by: str,
) -> Work | None:
    """Pure over the two probes: the parts of the stack's image build still to do (None: built)."""
    if have_image(image):
        return None
    parts: list[Part] = []
    if stack.base == "debian" and base_image is not None and not have_image(base_image):
        parts.append(Part(f"the Debian {pins.debian['suite']} base (debootstrap, pinned snapshot)",
                          "Debian packages of the minimal system", MINUTES["base"]))  # fmt: skip
    if needs_source:
        pin = pins.require(sources.SDIST_PIN, purpose="the llama.cpp source")
        if not have_file(Path(str(pin["filename"]))):
            parts.append(Part("the llama.cpp source", f"{pin['pname']} {pin['version']} sdist through pip "
                              f"({_mib(int(pin['size']))})", MINUTES["source"]))  # fmt: skip
    for stage in rendered.package_stages:
        if not have_image(stage.ref):
            manager = "apt" if stack.base == "debian" else "dnf"
            parts.append(Part(f"the {stage.stage} packages ({stage.ref})", f"{manager} packages, network on",
                              MINUTES["packages"]))  # fmt: skip
    if stack.build is not None:
        parts.append(Part(f"the {stack.name} build (compiles llama.cpp, network off)", "", MINUTES["compile"]))
    else:
        parts.append(Part(f"the {stack.name} image (network off)", "", MINUTES["assemble"]))
    return Work(f"the {stack.name} image ({image})", needed_by, tuple(parts), f"provision image build {stack.name}")


Ask = Callable[[str], bool]


def asks(given: settings.Settings | None = None) -> bool:
    """The setting ask_builds: may a command ask before building what it was not named for."""
    return (given or settings.current()).typed.ask_builds


def terminal_ask(given: settings.Settings | None = None) -> Ask | None:
    """A question to the person at the terminal, or None where nobody can answer (stdin or stderr
    not a terminal), the setting ask_builds is off, or the caller is not the main thread: the API
    server runs jobs in threads, and a server started from a shell would otherwise stop a
    client's job to wait for a key at the server's terminal."""
    if not asks(given):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None

    def ask(question: str) -> bool:
        print(question, end="", file=sys.stderr, flush=True)
        try:
            answer = input()
        except EOFError:
            return False
        return answer.strip().lower() in ("y", "yes")

    return ask


def confirm(work: Work, *, ask: Ask | None, log: Callable[[str], None]) -> None:
    """Say what will be built; ask where someone can answer (E026 on no, before anything starts).

    Off a terminal the build goes ahead after the announcement: a script or service that runs
    `provision run` has always got its image this way and has nobody to answer, and refusing
    would turn its first run into a failure; the lines stay in its log, and the model pull's
    size prompt behaves the same."""
    for line in work.lines():
        log(line)
    if ask is None:
        log("image: not asking (no terminal, or ask_builds is 0); building")
        return
    if not ask("build it now? [y/N] "):
        raise RunCancelled(f"{work.title}: build declined; nothing was fetched or built",
                           fix=f"run `{work.command}` first, or run again and answer y "
                           "(--yes or PROVISION_ASK_BUILDS=0 never asks)")  # fmt: skip


TERMINAL = "terminal"


def build_unasked(stack_name: str, *, needed_by: str, ask: Ask | str | None = TERMINAL,
                  catalog: catalog_mod.Catalog | None = None, pins: pins_mod.Pins | None = None,
                  base_image: str | None = None, tag: str | None = None,
                  log: Callable[[str], None] | None = None) -> tuple[str, str]:  # fmt: skip
    """(ref, id) of the stack's image, built first when missing, after saying so and, on a
    terminal, asking (``ask``: TERMINAL decides from stdin/stderr and ask_builds; None: nobody)."""
    from provision.adapters import podman
    from provision.images import build as images

    pins = pins or pins_mod.default()
    catalog = catalog or catalog_mod.load()
    stack = catalog.get(stack_name)
    debian = stack.base == "debian" and base_image is None
    planned_base = images.base_ref("debian", pins) if debian else base_image
    rendered = images.render_stack(stack, pins, base_image=planned_base)
    ref = tag or images.default_tag(rendered)
    cache = paths.cache_dir("sources")
    local = images.local_input_files(stack)
    # prepare_context's rule: an input that is neither ours nor the model is the pinned sdist
    needs_source = any(i.name not in local and not i.name.endswith(".gguf") for i in rendered.inputs)
    work = plan(stack, rendered, pins, image=ref, base_image=planned_base, have_image=podman.exists,
                have_file=lambda name: (cache / name).exists(), needs_source=needs_source,
                needed_by=needed_by)  # fmt: skip
    if work is None:
        return ref, str(podman.inspect(ref)["Id"])
    asker = terminal_ask() if ask == TERMINAL else ask
    confirm(work, ask=asker if callable(asker) else None, log=log or say("image"))
    built = images.build(stack.name, tag=ref, catalog=catalog, pins=pins, base_image=base_image, log=log)
    return built.ref, built.image_id
