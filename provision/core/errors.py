"""Every user-facing failure of provision, with a stable code and exit status.

One class per failure, so a code is defined in exactly one place (the idea comes from
cibuildwheel's errors.py). The CLI prints ``E0NN: message`` and, when known, a ``fix:``
line, then exits with ``exit_status``. Codes never change meaning once released;
the README's error table is generated from ``all_errors()``.
"""

from __future__ import annotations

from typing import ClassVar


class ProvisionError(Exception):
    """Base class: message for the user, optional fix, stable code and exit status."""

    code: ClassVar[str] = "E000"
    exit_status: ClassVar[int] = 1
    summary: ClassVar[str] = "unexpected failure"

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def render(self) -> str:
        text = f"{self.code}: {self.message}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text

    def as_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "fix": self.fix, "exit_status": self.exit_status}


# --- catalog, pins and templates (input errors) -------------------------------------------


class UnknownStack(ProvisionError):
    code = "E001"
    exit_status = 11
    summary = "unknown stack name"


class CatalogSyntaxError(ProvisionError):
    code = "E002"
    exit_status = 12
    summary = "a catalog or pins file is not valid YAML/JSON"


class InvalidValue(ProvisionError):
    """A value failed validation; the message names file, key path and value."""

    code = "E003"
    exit_status = 13
    summary = "a catalog, pins or command-line value is invalid"


class UnverifiedPin(ProvisionError):
    code = "E004"
    exit_status = 14
    summary = "a component needs a pin that nobody could verify"


class ImageBuildFailed(ProvisionError):
    code = "E005"
    exit_status = 15
    summary = "an image build step failed"


class ToolMissing(ProvisionError):
    code = "E006"
    exit_status = 16
    summary = "an outside program the command needs is not installed"


class GpuNotSupported(ProvisionError):
    """Decided before any VM starts: silently running on CPU would give wrong numbers."""

    code = "E007"
    exit_status = 17
    summary = "GPU requested on a stack without GPU"


class UnknownRoute(ProvisionError):
    code = "E008"
    exit_status = 18
    summary = "route not offered by this stack or host"


# --- model store --------------------------------------------------------------------------


class UnknownModel(ProvisionError):
    code = "E010"
    exit_status = 20
    summary = "model name not in the catalog or the store"


class ModelHashMismatch(ProvisionError):
    code = "E011"
    exit_status = 21
    summary = "downloaded or stored bytes do not match the pinned sha256/size"


class DownloadFailed(ProvisionError):
    code = "E012"
    exit_status = 22
    summary = "HTTP download failed after retries"


class DiskFull(ProvisionError):
    code = "E013"
    exit_status = 23
    summary = "not enough space (or file size limit) for the download"


class BadModelName(ProvisionError):
    code = "E014"
    exit_status = 24
    summary = "model name or reference is malformed or unsafe"


class NotGguf(ProvisionError):
    code = "E015"
    exit_status = 25
    summary = "file is not a GGUF model"


# --- running guests (Linux QEMU route, podman machine route) --------------------------------


class HostToolsMissing(ProvisionError):
    code = "E020"
    exit_status = 30
    summary = "host tools for the Linux route are missing"


class RunTimeout(ProvisionError):
    code = "E021"
    exit_status = 31
    summary = "the guest did not finish before the deadline"


class GpuSlotTimeout(ProvisionError):
    code = "E022"
    exit_status = 32
    summary = "no GPU VM slot became free before the deadline"


class GuestAborted(ProvisionError):
    code = "E023"
    exit_status = 33
    summary = "the guest or the host render worker died (GGML_ABORT, worker exit)"


class VmFailed(ProvisionError):
    code = "E024"
    exit_status = 34
    summary = "the VM could not start or died"


class BenchGateFailed(ProvisionError):
    code = "E025"
    exit_status = 35
    summary = "a benchmark gate did not hold"


class RunCancelled(ProvisionError):
    """The caller stopped the run (an API client went away, the API server is stopping)."""

    code = "E026"
    exit_status = 36
    summary = "the run was cancelled before the guest finished"


# --- macOS launch (podman machine + krunkit) ------------------------------------------------


class KrunBundleMissing(ProvisionError):
    code = "E030"
    exit_status = 40
    summary = "the krun bundle (nix profile add .#krun) was not found"


class MemoryLimit(ProvisionError):
    code = "E031"
    exit_status = 41
    summary = "requested RAM/VRAM exceeds what krunkit can map"


class VersionSkew(ProvisionError):
    code = "E032"
    exit_status = 42
    summary = "podman, krunkit and libkrun versions do not pair"


class WrongPlatform(ProvisionError):
    code = "E033"
    exit_status = 43
    summary = "the command needs another host platform"


class MachineFailed(ProvisionError):
    code = "E034"
    exit_status = 44
    summary = "podman machine command failed"


# --- APIR (API remoting) --------------------------------------------------------------------


class ApirCheckFailed(ProvisionError):
    """The host APIR backend could not be initialized; the message names the env var to fix."""

    code = "E040"
    exit_status = 50
    summary = "APIR host backend preflight failed"


class ApirBackendRefused(ProvisionError):
    code = "E041"
    exit_status = 51
    summary = "this ggml backend cannot serve as an APIR target"


class SourceUnavailable(ProvisionError):
    code = "E042"
    exit_status = 52
    summary = "a pinned source tree cannot be fetched or does not match its pin"


class BuildFailed(ProvisionError):
    code = "E043"
    exit_status = 53
    summary = "a native build (cmake/meson) failed"


class ProtocolMismatch(ProvisionError):
    code = "E044"
    exit_status = 54
    summary = "guest and host APIR protocol versions differ"


# --- the HTTP execution API (provision api) --------------------------------------------------


class Unauthorized(ProvisionError):
    code = "E050"
    exit_status = 60
    summary = "the API request carried no valid bearer token"


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
