"""Doctor checks for how podman finds krunkit, and the environment it passes on (macOS route).

Pure functions of probed facts (containers.conf contents, env, paths), like the rest of the
darwin doctor; ``doctor.darwin_checks`` does the probing and calls them.
"""


from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provision.adapters import podman_machine
from provision.core.diagnostics import Check
from provision.core.errors import ProvisionError
from provision.hosts.darwin import versions
from provision.hosts.darwin.bundle import KrunBundle
from provision.hosts.darwin.launch import check_memory

# --- podman finding krunkit ----------------------------------------------------------------


def containers_conf_files(env: dict[str, str], home: Path) -> list[Path]:
    if env.get("CONTAINERS_CONF"):
        return [Path(env["CONTAINERS_CONF"])]
    return [
        Path("/usr/share/containers/containers.conf"),
        Path("/etc/containers/containers.conf"),
        Path("/opt/homebrew/etc/containers/containers.conf"),
        Path("/usr/local/etc/containers/containers.conf"),
        home / ".config" / "containers" / "containers.conf",
    ]


def read_containers_conf(files: Sequence[Path]) -> dict[str, Any]:
    """Merged [engine]/[machine] keys; later files win, as containers/common does."""
    merged: dict[str, Any] = {}
    for f in files:
        try:
            data = tomllib.loads(f.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            continue
        for section in ("engine", "machine"):
            for k, v in (data.get(section) or {}).items():
                merged[f"{section}.{k}"] = v
    return merged


def find_helper(
    name: str, env: dict[str, str], conf: dict[str, Any], podman_bindir: Path | None
) -> tuple[Path | None, list[str]]:
    """containers/common FindHelperBinary: $CONTAINERS_HELPER_BINARY_DIR, helper_binaries_dir, $PATH."""
    dirs: list[tuple[str, str]] = []
    if env.get("CONTAINERS_HELPER_BINARY_DIR"):
        dirs.append(("CONTAINERS_HELPER_BINARY_DIR", env["CONTAINERS_HELPER_BINARY_DIR"]))
    for d in conf.get("engine.helper_binaries_dir") or []:
        d = str(d)
        if "$BINDIR" in d:
            if podman_bindir is None:
                continue
            d = d.replace("$BINDIR", str(podman_bindir))
        dirs.append(("helper_binaries_dir", d))
    dirs += [("PATH", p) for p in env.get("PATH", "").split(os.pathsep) if p]
    tried = []
    for source, d in dirs:
        cand = Path(d) / name
        tried.append(f"{source}:{d}")
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand, tried
    return None, tried


def check_podman_finds_krunkit(found: Path | None, tried: list[str], b: KrunBundle | None) -> Check:
    fix = (
        f"run `provision launch` (it sets CONTAINERS_HELPER_BINARY_DIR={b.bin_dir})"
        if b
        else "install the krun bundle, then run `provision launch`"
    )
    if found is None:
        return Check(
            "podman.krunkit", "fail", "podman would not find krunkit (looked in " + ", ".join(tried) + ")", fix
        )
    if b is not None and found.resolve() != b.krunkit.resolve():
        return Check(
            "podman.krunkit",
            "warn",
            f"a plain `podman machine start` would run {found}, not the bundle's {b.krunkit}",
            fix,
        )
    return Check("podman.krunkit", "ok", f"podman finds {found}")


def check_provider(env: dict[str, str], conf: dict[str, Any], podman: versions.Version | None) -> Check:
    """Which provider a plain `podman machine` command uses (provision always passes libkrun)."""
    if env.get("CONTAINERS_MACHINE_PROVIDER"):
        provider, source = env["CONTAINERS_MACHINE_PROVIDER"], "CONTAINERS_MACHINE_PROVIDER"
    elif conf.get("machine.provider"):
        provider, source = str(conf["machine.provider"]), "containers.conf [machine] provider"
    else:
        default = "libkrun" if podman is not None and podman >= versions.Version(6, 0, 0) else "applehv"
        provider, source = default, f"podman {podman or '?'} default"
    if provider == "libkrun":
        return Check("machine.provider", "ok", f"libkrun ({source})")
    return Check(
        "machine.provider",
        "warn",
        f"plain `podman machine` commands use {provider} ({source}): they do not see the libkrun machine",
        "export CONTAINERS_MACHINE_PROVIDER=libkrun (provision launch sets it for its own commands)",
    )


# --- env ------------------------------------------------------------------------------------

APIR_REQUIRED = ("VIRGL_APIR_BACKEND_LIBRARY", "APIR_LLAMA_CPP_GGML_LIBRARY_PATH")
APIR_OPTIONAL = (
    "APIR_LLAMA_CPP_GGML_LIBRARY_REG",
    "VIRGL_APIR_LOG_TO_FILE",
    "APIR_LLAMA_CPP_LOG_TO_FILE",
    "VIRGL_ROUTE_VENUS_TO_APIR",
)


def check_apir_env(env: dict[str, str], route: str | None) -> Check:
    present = [k for k in APIR_REQUIRED + APIR_OPTIONAL if k in env]
    if not present and route != "apir":
        return Check("apir.env", "skip", "no APIR variables set (Venus route)")
    problems = []
    for key in APIR_REQUIRED:
        val = env.get(key)
        if not val:
            problems.append(f"{key} is not set")
        elif not Path(val).is_file():
            problems.append(f"{key}={val} does not exist")
    if not env.get("APIR_LLAMA_CPP_GGML_LIBRARY_REG"):
        problems.append("APIR_LLAMA_CPP_GGML_LIBRARY_REG is not set (the backend falls back to ggml_backend_init)")
    for key in ("VIRGL_APIR_LOG_TO_FILE", "APIR_LLAMA_CPP_LOG_TO_FILE"):
        if env.get(key) and not Path(env[key]).parent.is_dir():
            problems.append(f"{key}={env[key]}: directory does not exist")
    if problems:
        return Check(
            "apir.env",
            "fail",
            "; ".join(problems),
            "let `provision launch --route apir` set them (it points them into the krun bundle)",
        )
    note = (
        " (VIRGL_ROUTE_VENUS_TO_APIR set: Venus/Vulkan is disabled on a machine started from this shell)"
        if "VIRGL_ROUTE_VENUS_TO_APIR" in env
        else ""
    )
    return Check("apir.env", "warn" if note else "ok", "APIR variables point at existing files" + note)


def check_apir_bundle(b: KrunBundle) -> Check:
    if b.route == "venus":
        return Check("apir.bundle", "skip", f"{b.root} is the Venus bundle (.#krun); APIR has its own, .#krun-apir")
    missing = [p.name for p in (b.ggml_backend, b.ggml_metal) if not p.is_file()]
    if missing:
        return Check(
            "apir.bundle",
            "warn",
            f"bundle lacks {', '.join(missing)}: only the Venus route is available",
            "install the APIR bundle: nix profile add --profile ~/.local/state/nix/profiles/krun-apir .#krun-apir",
        )
    return Check("apir.bundle", "ok", f"{b.ggml_backend.name} and {b.ggml_metal.name} present")


def check_dyld(env: dict[str, str]) -> Check:
    dyld = env.get("DYLD_LIBRARY_PATH")
    if not dyld:
        return Check("env.dyld", "ok", "DYLD_LIBRARY_PATH is not set")
    ssh = any(env.get(k) for k in ("SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY"))
    if ssh:
        return Check(
            "env.dyld",
            "fail",
            f"DYLD_LIBRARY_PATH={dyld} in an SSH session: macOS drops DYLD_* there, so krunkit would not "
            "load the libraries it names",
            "unset DYLD_LIBRARY_PATH; `provision launch` picks libraries through the bundle, not DYLD",
        )
    return Check(
        "env.dyld",
        "warn",
        f"DYLD_LIBRARY_PATH={dyld} can make krunkit load another virglrenderer",
        "unset DYLD_LIBRARY_PATH; the bundle's krunkit finds its libraries itself",
    )


def check_machine_memory(
    compat: dict[str, Any], machine: podman_machine.MachineInfo | None, vram_mib: int | None
) -> Check:
    if machine is None:
        return Check("machine.memory", "skip", "no podman machine yet")
    try:
        warns = check_memory(compat, machine.memory_mib, vram_mib)
    except ProvisionError as exc:
        return Check("machine.memory", "fail", f"machine {machine.name}: {exc.message}", exc.fix)
    if warns:
        return Check(
            "machine.memory",
            "warn",
            f"machine {machine.name}: " + "; ".join(warns),
            "lower the machine's memory with `provision launch --memory MiB`",
        )
    return Check(
        "machine.memory", "ok", f"machine {machine.name}: {machine.memory_mib} MiB RAM within krunkit's limits"
    )
