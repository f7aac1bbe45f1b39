"""`provision perplexity`: the tool check, the device rules, the guest command, the parsed number, bad input."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from provision.bench import perplexity
from provision.core import catalog, pins
from provision.core.errors import GpuNotSupported, InvalidValue, ToolMissing, VmFailed
from provision.hosts import PerplexityRequest
from provision.hosts.linux.run import perplexity as linux_perplexity
from provision.images import disks
from tests.helpers import run_provision

FINAL = """perplexity: calculating perplexity over 8 chunks, n_ctx=256, batch_size=256, n_seq=1
[1]498.1234,[2]505.6789,[3]510.0001,
Final estimate: PPL = 511.2345 +/- 12.34567
"""


def stacks() -> catalog.Catalog:
    return catalog.load()


def tool_packages() -> dict[str, str]:
    return dict(pins.default().debian["tool_packages"])


def test_llama_linux_ships_llama_perplexity_and_the_package_is_pinned() -> None:
    perplexity.check_tool(stacks().get("llama-linux"), tool_packages())
    package = tool_packages()[perplexity.TOOL]
    assert package in pins.default().debian["guest_packages"]


@pytest.mark.parametrize(("stack", "key"), [("cpu", "stacks.cpu.packages"), ("llama", "stacks.llama.build.targets")])
def test_a_stack_without_llama_perplexity_is_refused_naming_the_key(stack: str, key: str) -> None:
    with pytest.raises(ToolMissing) as exc:
        perplexity.check_tool(stacks().get(stack), tool_packages())
    assert key in exc.value.fix and perplexity.TOOL in exc.value.message


def test_gpu_runs_all_layers_on_the_stack_device_and_cpu_runs_none() -> None:
    stack = stacks().get("llama-linux")
    gpu = perplexity.guest_command(stack, True, "/models/perplexity.txt", 256, 8)
    cpu = perplexity.guest_command(stack, False, "/models/perplexity.txt", 256, 8)
    assert gpu[:2] == ["sh", "-c"] and "-ngl 99 -dev Vulkan0" in gpu[2] and '-m "$MODEL"' in gpu[2]
    assert gpu[2].startswith("llama-perplexity --list-devices 2>&1; exec llama-perplexity ")
    assert "--list-devices" not in cpu[2]
    assert "-ngl 0 -dev none" in cpu[2] and "-f /models/perplexity.txt -c 256 -b 256 --chunks 8" in cpu[2]
    assert perplexity.where(stack, True) == "guest-gpu" and perplexity.where(stack, False) == "guest-cpu"


def test_the_device_is_read_from_the_device_list() -> None:
    listing = ("Available devices:\n"
               "  Vulkan0: Virtio-GPU Venus (llvmpipe (LLVM 22.1.8, 256 bits)) (2048 MiB, 2047 MiB free)\n")
    assert perplexity.used_device(listing, "Vulkan0") == "Vulkan0: Virtio-GPU Venus (llvmpipe (LLVM 22.1.8, 256 bits))"
    assert perplexity.used_device(listing, "Vulkan1") is None and perplexity.used_device(listing, None) is None


def test_the_final_estimate_is_parsed() -> None:
    est = perplexity.parse("noise\n" + FINAL)
    assert est.ppl == pytest.approx(511.2345) and est.error == pytest.approx(12.34567)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("main: model loaded\n[1]12.0,", VmFailed),
        ("Final estimate: PPL = nan +/- nan\n", VmFailed),
        ("Final estimate: PPL = 0.5000 +/- 0.1\n", VmFailed),
        ("perplexity: you need at least 512 tokens to evaluate perplexity with a context of 256\n", InvalidValue),
    ],
)
def test_no_number_or_a_broken_one_is_an_error(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        perplexity.parse(text)


@pytest.mark.parametrize(("ctx", "chunks"), [(8, 8), (256, 0), (1 << 21, 1)])
def test_numbers_out_of_range_are_refused(ctx: int, chunks: int) -> None:
    with pytest.raises(InvalidValue):
        perplexity.check_numbers(ctx, chunks)


def test_every_check_comes_before_the_model_is_fetched(tmp_path: Path) -> None:
    def never() -> Path:
        raise AssertionError("the model was resolved before the checks")

    cases = [
        (GpuNotSupported, {"stack": "cpu", "gpu": True}),
        (ToolMissing, {"stack": "cpu", "gpu": False}),
        (InvalidValue, {"stack": "llama-linux", "gpu": True, "text": tmp_path / "missing.txt"}),
        (InvalidValue, {"stack": "llama-linux", "gpu": True, "ctx": 4}),
    ]
    (tmp_path / "empty.txt").write_text("")
    cases.append((InvalidValue, {"stack": "llama-linux", "gpu": True, "text": tmp_path / "empty.txt"}))
    for error, kw in cases:
        stack = stacks().get(str(kw.pop("stack")))
        gpu = bool(kw.pop("gpu"))
        with pytest.raises(error):
            linux_perplexity.measure(PerplexityRequest(
                stack, gpu, never, "m", ctx=int(kw.get("ctx", perplexity.DEFAULT_CTX)),  # type: ignore[call-overload]
                chunks=perplexity.DEFAULT_CHUNKS, text=kw.get("text"),  # type: ignore[arg-type]
            ))


def test_the_cli_defaults_are_the_domain_defaults() -> None:
    from provision.cli import perplexity as cli_perplexity  # kept apart so --help imports no domain module

    assert (cli_perplexity.DEFAULT_CTX, cli_perplexity.DEFAULT_CHUNKS) == (perplexity.DEFAULT_CTX,
                                                                           perplexity.DEFAULT_CHUNKS)  # fmt: skip


def test_the_default_text_is_long_enough_for_the_default_context() -> None:
    text = linux_perplexity.default_text().read_text()
    # at ~4.5 characters a token (a BPE vocabulary), two default contexts of tokens and more
    assert len(text) > 2 * perplexity.DEFAULT_CTX * 6


def test_cli_refuses_a_gpu_on_a_stack_without_one_and_a_stack_without_the_tool() -> None:
    proc = run_provision("perplexity", "cpu", "--model", "tiny-llama", "--gpu")
    assert proc.returncode != 0 and "E007" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_provision("perplexity", "cpu", "--model", "tiny-llama")
    assert "E006" in proc.stderr and "stacks.cpu.packages" in proc.stderr


def test_the_text_sits_beside_the_model_on_the_read_only_disk(empty_cache: Path, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 1000)
    text = tmp_path / "t.txt"
    text.write_text("some words\n")
    alone = disks.model_disk(model, "m.gguf")
    both = disks.model_disk(model, "m.gguf", {"perplexity.txt": text})
    assert alone != both
    listing = subprocess.run(["debugfs", "-R", "ls -p /", str(both)], capture_output=True, text=True, check=True)
    assert "/m.gguf/" in listing.stdout and "/perplexity.txt/" in listing.stdout
    dump = subprocess.run(["debugfs", "-R", "cat /perplexity.txt", str(both)], capture_output=True, check=True)
    assert dump.stdout == b"some words\n"
    assert disks.model_disk(model, "m.gguf") == alone
    # a model-only disk keeps the key it had before extra files existed: cached disks stay valid
    st = model.stat()
    old_key = hashlib.sha256(f"{model.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0m.gguf".encode()).hexdigest()[:16]
    assert alone.name == f"{old_key}.img"
