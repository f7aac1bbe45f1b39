"""`provision perplexity` on the Linux route: llama-perplexity in a guest, on a text mounted read-only.

The text sits beside the model on the read-only model disk (disks.model_disk's extra files), the
device rules are `provision run`'s (catalog.check_gpu: E007 before anything starts), and the
result is appended to the bench history like a bench's.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from provision.bench import history_file, perplexity
from provision.core import pins as pins_mod
from provision.core.errors import InvalidValue, VmFailed
from provision.hosts import PerplexityRequest, RunRequest
from provision.hosts.linux.run import execute
from provision.images import disks as vmdisk

MAX_TEXT_BYTES = 256 << 20


def default_text() -> Path:
    """The text shipped with provision (about 4 KB of plain English prose, written for it)."""
    return Path(str(resources.files("provision") / "data" / "perplexity.txt"))


def check_text(text: Path | None) -> Path:
    path = default_text() if text is None else text.expanduser()
    if not path.is_file():
        why = "does not exist" if not path.exists() else "is not a regular file"
        raise InvalidValue(f"--text {path}: {why}", fix="give the path of a plain text file")
    size = path.stat().st_size
    if not 0 < size <= MAX_TEXT_BYTES:
        raise InvalidValue(f"--text {path}: {size} bytes; expected 1 to {MAX_TEXT_BYTES}",
                           fix="give a non-empty text file of at most 256 MiB")  # fmt: skip
    return path.resolve()


def measure(req: PerplexityRequest) -> dict[str, Any]:
    """Run llama-perplexity in a guest of ``req.stack`` and record it; the result as data. Every check
    (the request's device rules first) comes before ``resolve_model`` (which may download) and before
    any guest starts."""
    stack, gpu, ctx, chunks, label = req.stack, req.gpu, req.ctx, req.chunks, req.label
    perplexity.check_numbers(ctx, chunks)
    perplexity.check_tool(stack, pins_mod.default().debian.get("tool_packages", {}))
    text_path = check_text(req.text)
    model = req.resolve_model()
    command = perplexity.guest_command(stack, gpu, f"{vmdisk.MODEL_MOUNT}/{perplexity.TEXT_NAME}", ctx, chunks)
    res, out, err = execute.run_captured(RunRequest(
        stack, gpu, tuple(command), model_path=model, route=req.route, timeout_s=req.timeout_s,
        model_extras=((perplexity.TEXT_NAME, text_path),),
    ))
    if res.exit_status != 0:
        short = perplexity.too_short(out + err)  # the user's to fix (a longer text), not a guest failure
        if short is not None:
            raise short
        raise VmFailed(f"{perplexity.TOOL} in the {stack.name} guest exited {res.exit_status}: "
                       f"{(out + err).strip()[-800:]}", fix=f"see {res.run_dir}")  # fmt: skip
    estimate = perplexity.parse(out + err)
    extra = {"text": str(text_path), "text_sha256": history_file.file_sha256(text_path), "ctx": ctx,
             "chunks": chunks, "accel": res.accel, "guest_wall_s": round(res.wall_s, 1)}  # fmt: skip
    record = history_file.record_perplexity(stack, gpu, model, label, (estimate.ppl, estimate.error), out + err, extra)
    return {"stack": stack.name, "gpu": gpu, "where": perplexity.where(stack, gpu), "model": label,
            "ppl": estimate.ppl, "error": estimate.error, **extra, "run_dir": str(res.run_dir),
            "history": {"id": record.id, "file": str(history_file.path())}}  # fmt: skip
