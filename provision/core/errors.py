"""Every user-facing failure of provision, with a stable code and exit status.

One class per failure, so a code is defined in exactly one place (the idea comes from
cibuildwheel's errors.py). The CLI prints ``E0NN: message`` and a ``fix:`` line (the raiser's
own, else the class's ``default_fix``), then exits with ``exit_status``. Codes never change
meaning once released; the README's error table is generated from ``all_errors()``.

Two exit statuses belong to no class: ``INTERNAL_ERROR_STATUS`` (70) when a command hit a bug
(an exception that is not a ProvisionError: the CLI prints a short report and where the
details went, never a traceback) and 130 after Ctrl-C.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import ClassVar, NoReturn

# Exit status of a command that failed on a bug rather than on its input (EX_SOFTWARE).
INTERNAL_ERROR_STATUS = 70
INTERRUPTED_STATUS = 130


class ProvisionError(Exception):
    """Base class: message for the user, a fix (always), stable code and exit status."""

    code: ClassVar[str] = "E000"
    exit_status: ClassVar[int] = 1
    summary: ClassVar[str] = "unexpected failure"
    default_fix: ClassVar[str] = "report this with the command line you ran"

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix: str = fix or self.default_fix

    def render(self) -> str:
        return f"{self.code}: {self.message}\n  fix: {self.fix}"

    def as_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "fix": self.fix, "exit_status": self.exit_status}


# --- catalog, pins and templates (input errors) -------------------------------------------


class UnknownStack(ProvisionError):
    code = "E001"
    exit_status = 11
    summary = "unknown stack name"
    default_fix = "run `provision stacks` to list the stack names"


class CatalogSyntaxError(ProvisionError):
    code = "E002"
    exit_status = 12
    summary = "a catalog or pins file is not valid YAML/JSON"
    default_fix = "repair the file named above (YAML/JSON syntax at the line shown), or restore it with git"


class InvalidValue(ProvisionError):
    """A value failed validation; the message names file, key path and value."""

    code = "E003"
    exit_status = 13
    summary = "a catalog, pins or command-line value is invalid"
    default_fix = "correct the value named above (see `provision COMMAND --help` for what it takes)"


class UnverifiedPin(ProvisionError):
    code = "E004"
    exit_status = 14
    summary = "a component needs a pin that nobody could verify"
    default_fix = "verify the pin (download and hash it) and record its status in provision/data/pins.json"


class ImageBuildFailed(ProvisionError):
    code = "E005"
    exit_status = 15
    summary = "an image build step failed"
    default_fix = "read the failing step's output above; rerun `provision image build STACK` after fixing it"


class ToolMissing(ProvisionError):
    code = "E006"
    exit_status = 16
    summary = "an outside program the command needs is not installed"
    default_fix = "install the program named above (scripts/setup-debian on Debian, or the Nix profile)"


class GpuNotSupported(ProvisionError):
    """Decided before any VM starts: silently running on CPU would give wrong numbers."""

    code = "E007"
    exit_status = 17
    summary = "GPU requested on a stack without GPU"
    default_fix = "drop --gpu, or pick a stack with gpu: true (`provision stacks`)"


class UnknownRoute(ProvisionError):
    code = "E008"
    exit_status = 18
    summary = "route not offered by this stack or host"
    default_fix = "pick a route the stack offers (`provision stacks` shows ROUTE and HOSTS)"


# --- model store --------------------------------------------------------------------------


class UnknownModel(ProvisionError):
    code = "E010"
    exit_status = 20
    summary = "model name not in the catalog or the store"
    default_fix = "`provision model list` shows catalog and stored names; pull by URL with --name and --sha256"


class ModelHashMismatch(ProvisionError):
    code = "E011"
    exit_status = 21
    summary = "downloaded or stored bytes do not match the pinned sha256/size"
    default_fix = "provision model rm NAME, then pull (or synth) it again"


class DownloadFailed(ProvisionError):
    code = "E012"
    exit_status = 22
    summary = "HTTP download failed after retries"
    default_fix = "check the URL and the network, then run the pull again: it resumes"


class DiskFull(ProvisionError):
    code = "E013"
    exit_status = 23
    summary = "not enough space (or file size limit) for the download"
    default_fix = "free space, raise the file size limit (ulimit -f), or move the cache with PROVISION_CACHE"


class BadModelName(ProvisionError):
    code = "E014"
    exit_status = 24
    summary = "model name or reference is malformed or unsafe"
    default_fix = "use a name of letters, digits and . _ + - (at most 128, no '/' or '..') with --name"


class NotGguf(ProvisionError):
    code = "E015"
    exit_status = 25
    summary = "file is not a GGUF model"
    default_fix = "point at a .gguf file (it starts with the bytes GGUF)"


# --- running guests (Linux QEMU route, podman machine route) --------------------------------


class HostToolsMissing(ProvisionError):
    code = "E020"
    exit_status = 30
    summary = "host tools for the Linux route are missing"
    default_fix = "provision host-tools"


class RunTimeout(ProvisionError):
    code = "E021"
    exit_status = 31
    summary = "the guest did not finish before the deadline"
    default_fix = "raise --timeout, or look at the run's log directory named above"


class GpuSlotTimeout(ProvisionError):
    code = "E022"
    exit_status = 32
    summary = "no GPU VM slot became free before the deadline"
    default_fix = "wait for the other GPU runs to end, or raise --timeout"


class GuestAborted(ProvisionError):
    code = "E023"
    exit_status = 33
    summary = "the guest or the host render worker died (GGML_ABORT, worker exit)"
    default_fix = "read the guest and render-worker logs named above"


class VmFailed(ProvisionError):
    code = "E024"
    exit_status = 34
    summary = "the VM could not start or died"
    default_fix = "read the VM log named above; `provision doctor` checks the host"


class BenchGateFailed(ProvisionError):
    code = "E025"
    exit_status = 35
    summary = "a benchmark gate did not hold"
    default_fix = "read the bench report named above; the gate compares guest GPU with guest CPU"


class RunCancelled(ProvisionError):
    """The caller stopped the run (an API client went away, the API server is stopping)."""

    code = "E026"
    exit_status = 36
    summary = "the run was cancelled before the guest finished"
    default_fix = "run it again and keep the connection open until the result arrives (or use /execute/stream)"


class PortInUse(ProvisionError):
    """Checked before the guest boots, so a busy port never costs a VM start."""

    code = "E027"
    exit_status = 37
    summary = "the host port to publish is already in use"
    default_fix = "choose another --port, or stop what listens there (`provision ps`, `ss -ltnp`)"


class ChatFailed(ProvisionError):
    """`provision chat`: the server did not answer, or answered an error, so there is no reply to show."""

    code = "E028"
    exit_status = 38
    summary = "the chat server could not be reached or answered an error"
    default_fix = "check the server: `provision ps` lists ours; curl URL/v1/models"


# --- macOS launch (podman machine + krunkit) ------------------------------------------------


class KrunBundleMissing(ProvisionError):
    code = "E030"
    exit_status = 40
    summary = "the krun bundle (nix profile add .#krun) was not found"
    default_fix = "nix profile add .#krun (or pass --krun PREFIX)"


class MemoryLimit(ProvisionError):
    code = "E031"
    exit_status = 41
    summary = "requested RAM/VRAM exceeds what krunkit can map"
    default_fix = "lower --memory (krunkit maps at most 61440 MiB of RAM)"


class VersionSkew(ProvisionError):
    code = "E032"
    exit_status = 42
    summary = "podman, krunkit and libkrun versions do not pair"
    default_fix = "install the podman, krunkit and libkrun versions pinned together (nix profile add .#krun)"


class WrongPlatform(ProvisionError):
    code = "E033"
    exit_status = 43
    summary = "the command needs another host platform"
    default_fix = "run this command on the host platform named above (where offered, --dry-run works anywhere)"


class MachineFailed(ProvisionError):
    code = "E034"
    exit_status = 44
    summary = "podman machine command failed"
    default_fix = "read podman's message above; `podman machine inspect NAME` shows the machine"


# --- APIR (API remoting) --------------------------------------------------------------------


class ApirCheckFailed(ProvisionError):
    """The host APIR backend could not be initialized; the message names the env var to fix."""

    code = "E040"
    exit_status = 50
    summary = "APIR host backend preflight failed"
    default_fix = "set the environment variable named above to an existing library (provision apir check --help)"


class ApirBackendRefused(ProvisionError):
    code = "E041"
    exit_status = 51
    summary = "this ggml backend cannot serve as an APIR target"
    default_fix = "serve a GPU ggml backend (Metal, Vulkan, CUDA) through APIR, not the CPU one"


class SourceUnavailable(ProvisionError):
    code = "E042"
    exit_status = 52
    summary = "a pinned source tree cannot be fetched or does not match its pin"
    default_fix = "check the network or pass a local copy of the pinned tree (--source / --virgl-src)"


class BuildFailed(ProvisionError):
    code = "E043"
    exit_status = 53
    summary = "a native build (cmake/meson) failed"
    default_fix = "read the build log named above; rerun with --force after fixing it"


class ProtocolMismatch(ProvisionError):
    code = "E044"
    exit_status = 54
    summary = "guest and host APIR protocol versions differ"
    default_fix = "rebuild the guest image and the host backend from the same llama.cpp pin"


# --- the HTTP execution API (provision api) --------------------------------------------------


class Unauthorized(ProvisionError):
    code = "E050"
    exit_status = 60
    summary = "the API request carried no valid bearer token"
    default_fix = "send `Authorization: Bearer TOKEN` with the token in the server's --token-file"


def all_errors() -> list[type[ProvisionError]]:
    """Every concrete error class, sorted by code (used by docs and the uniqueness test)."""
    seen: list[type[ProvisionError]] = []
    stack: list[type[ProvisionError]] = [ProvisionError]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            seen.append(sub)
            stack.append(sub)
    return sorted(seen, key=lambda c: c.code)


def exit_as_cli(main: Callable[[], int]) -> NoReturn:
    """A `python -m` entry point's end, as the provision CLI shows a failure: the code and its
    fix line on stderr and the code's exit status, never a traceback."""
    try:
        raise SystemExit(main())
    except ProvisionError as exc:
        print(exc.render(), file=sys.stderr)
        raise SystemExit(exc.exit_status) from None
