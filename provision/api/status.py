"""One HTTP status for each error code, and the JSON body every error response carries.

Client mistakes are 4xx, decided before any VM starts; a deadline is 408; capacity is 503
(with Retry-After); a guest or VM that failed is 502 (the guest is the upstream here); the
server's own set-up (host tools, images, pins) is 500. tests/api/test_api.py checks that
every code in errors.py has an entry and that docs/api.md shows this table.
"""

from __future__ import annotations

from typing import Any

from provision.core import errors as e

HTTP_STATUS: dict[str, int] = {
    e.UnknownStack.code: 400,
    e.CatalogSyntaxError.code: 500,
    e.InvalidValue.code: 400,
    e.UnverifiedPin.code: 500,
    e.ImageBuildFailed.code: 500,
    e.ToolMissing.code: 500,
    e.GpuNotSupported.code: 400,
    e.UnknownRoute.code: 400,
    e.UnknownModel.code: 400,
    e.ModelHashMismatch.code: 500,
    e.DownloadFailed.code: 502,
    e.DiskFull.code: 507,
    e.BadModelName.code: 400,
    e.NotGguf.code: 400,
    e.HostToolsMissing.code: 500,
    e.RunTimeout.code: 408,
    e.GpuSlotTimeout.code: 503,
    e.GuestAborted.code: 502,
    e.VmFailed.code: 502,
    e.BenchGateFailed.code: 500,
    e.RunCancelled.code: 503,
    e.PortInUse.code: 409,
    e.ChatFailed.code: 502,
    e.KrunBundleMissing.code: 500,
    e.MemoryLimit.code: 400,
    e.VersionSkew.code: 500,
    e.WrongPlatform.code: 400,
    e.MachineFailed.code: 502,
    e.ApirCheckFailed.code: 500,
    e.ApirBackendRefused.code: 500,
    e.SourceUnavailable.code: 500,
    e.BuildFailed.code: 500,
    e.ProtocolMismatch.code: 500,
    e.Unauthorized.code: 401,
}
# Not ProvisionErrors: the request itself was refused by the HTTP layer.
PAYLOAD_TOO_LARGE = 413
INTERNAL = 500
# Seconds a client should wait before asking again when capacity (GPU slots, a stopping server) said no.
RETRY_AFTER_S = 10


def status_for(exc: e.ProvisionError) -> int:
    return HTTP_STATUS.get(exc.code, INTERNAL)


def headers_for(exc: e.ProvisionError) -> dict[str, str]:
    status = status_for(exc)
    if status == 503:
        return {"Retry-After": str(RETRY_AFTER_S)}
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    return {}


def body(exc: e.ProvisionError, status: int | None = None) -> dict[str, Any]:
    return {"status": status or status_for(exc), "error": {"name": type(exc).__name__, **exc.as_dict()}}


def internal_body(ref: str) -> dict[str, Any]:
    """The short report for a bug: no traceback leaves the server, the log has it under ``ref``."""
    return {
        "status": INTERNAL,
        "error": {
            "name": "InternalError",
            "code": e.ProvisionError.code,
            "message": f"internal error (the server's log has it as {ref})",
            "fix": "report it with the server's log",
            "exit_status": e.ProvisionError.exit_status,
        },
    }
