"""Doctor checks for the macOS route (podman machine + krunkit + the krun bundle).

Each ``check_*`` takes what was probed (paths, tool output, env) and returns Checks, so the
tests drive them with real artifacts and recorded outputs; ``darwin_checks`` does the probing.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provision.adapters import dylib, lsof, podman_machine
from provision.adapters.program import run_tool
from provision.core.diagnostics import Check, DoctorContext
from provision.core.errors import KrunBundleMissing, ProvisionError
from provision.hosts.darwin import bundle as bundle_mod
from provision.hosts.darwin import machine_state, versions
from provision.hosts.darwin.bundle import KrunBundle
from provision.hosts.darwin.launch import check_memory

# --- bundle, firmware ---------------------------------------------------------------------


def check_bundle(explicit: Path | None, env: dict[str, str], home: Path) -> tuple[Check, KrunBundle | None]:
    try:
        b = bundle_mod.locate(explicit, env=env, home=home)
    except KrunBundleMissing as exc:
        return Check("krun.bundle", "fail", exc.message, exc.fix), None
    return Check("krun.bundle", "ok", f"krunkit at {b.krunkit} -> {bundle_mod.real_executable(b.krunkit)}"), b


def check_firmware(b: KrunBundle, krunkit: versions.Version | None, compat: dict[str, Any]) -> Check:
    since = versions.Version.parse(compat["krunkit_firmware"]["since"])
    if krunkit is not None and krunkit < since:
        return Check(
            "krunkit.firmware", "skip", f"krunkit {krunkit} < {since} boots through libkrun-efi's own firmware"
        )
    real = bundle_mod.real_executable(b.krunkit)
    cands = bundle_mod.firmware_candidates(real)
    found = next((c for c in cands if c.is_file()), None)
    if found:
        return Check("krunkit.firmware", "ok", f"{found}")
    return Check(
        "krunkit.firmware",
        "fail",
        "no KRUN_EFI.silent.fd in "
        + ", ".join(str(c.parent) for c in cands)
        + ' (krunkit: "can\'t find a firmware to load")',
        "rebuild the bundle with krunkit's postInstall copying edk2/KRUN_EFI.silent.fd to share/krunkit/",
    )


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


# --- versions -------------------------------------------------------------------------------


def libkrun_version(b: KrunBundle) -> versions.Version | None:
    try:
        return versions.parse_libkrun_pc(b.libkrun_pc.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    return versions.parse_libkrun_path(str(b.libkrun.resolve()))


def check_versions(
    compat: dict[str, Any], podman_out: str | None, krunkit_out: str | None, libkrun: versions.Version | None
) -> tuple[list[Check], versions.Version | None]:
    checks: list[Check] = []
    pv = kv = None
    if podman_out is None:
        checks.append(
            Check(
                "podman.version",
                "fail",
                "podman is not installed",
                f"install podman >= {compat['podman_min']} (the pkg installer or Homebrew)",
            )
        )
    else:
        try:
            pv = versions.parse_podman(podman_out)
            checks.append(Check("podman.version", "ok", f"podman {pv}"))
        except ValueError as exc:
            checks.append(Check("podman.version", "fail", str(exc), "check `podman --version`"))
    if krunkit_out is not None:
        try:
            kv = versions.parse_krunkit(krunkit_out)
        except ValueError as exc:
            checks.append(Check("krunkit.version", "fail", str(exc), "the bundle's krunkit does not run"))
    seen = ", ".join(f"{n} {v}" for n, v in (("podman", pv), ("krunkit", kv), ("libkrun", libkrun)) if v is not None)
    problems = versions.pairing_problems(compat, podman=pv, krunkit=kv, libkrun=libkrun)
    if problems:
        checks.append(Check("versions.pairing", "fail", "; ".join(p.what for p in problems), problems[0].fix))
    elif kv is None or libkrun is None:
        checks.append(
            Check(
                "versions.pairing",
                "warn",
                f"could not read every version ({seen or 'none'})",
                "make sure the bundle has bin/krunkit and lib/pkgconfig/libkrun.pc",
            )
        )
    else:
        checks.append(Check("versions.pairing", "ok", f"{seen} pair per pins.json compat"))
    return checks, kv


# --- libkrun symbols, virglrenderer ----------------------------------------------------------


def check_libkrun_symbols(probe: dylib.SymbolProbe, required: list[tuple[str, str]]) -> list[Check]:
    if not probe.loaded:
        return [
            Check(
                "libkrun.load",
                "fail",
                f"dlopen {probe.path}: {probe.error}",
                "reinstall the krun bundle; libkrun must load for krunkit to start",
            )
        ]
    out = []
    gpu_sym = required[0][0]
    if probe.has(gpu_sym):
        out.append(Check("libkrun.gpu", "ok", f"{probe.path} exports {gpu_sym}"))
    else:
        out.append(
            Check(
                "libkrun.gpu",
                "fail",
                f"{probe.path} has no {gpu_sym}: libkrun was built without GPU=1, so a GPU VM fails "
                "with ENOTSUP (errno 45)",
                "use the bundle's libkrun (built with GPU=1): nix profile add .#krun",
            )
        )
    for sym, why in required[1:]:
        if probe.has(sym):
            out.append(Check(f"libkrun.{sym}", "ok", f"{probe.path} exports {sym}"))
        else:
            out.append(
                Check(
                    f"libkrun.{sym}",
                    "fail",
                    f"{probe.path} lacks {sym}: {why}",
                    "install krunkit and libkrun as the pinned pair",
                )
            )
    return out


def check_linked_virglrenderer(linked: str | None, resolved: list[Path], ours: Path) -> Check:
    if linked is None:
        return Check(
            "libkrun.links-virglrenderer",
            "fail",
            "libkrun does not link libvirglrenderer: no virtio-gpu",
            "use a libkrun built with GPU=1 against the bundle's virglrenderer",
        )
    existing = next((p for p in resolved if p.exists()), None)
    if existing is not None and existing.resolve() == ours.resolve():
        return Check("libkrun.links-virglrenderer", "ok", f"{linked} -> {existing.resolve()}")
    where = existing.resolve() if existing else "nothing on disk"
    return Check(
        "libkrun.links-virglrenderer",
        "fail",
        f"libkrun links {linked} -> {where}, not ours ({ours.resolve()})",
        "rebuild libkrun against the bundle's virglrenderer (APIR needs the patched one)",
    )


def check_loaded_virglrenderer(lsof_output: str | None, ours: Path) -> Check:
    if lsof_output is None:
        return Check("krunkit.virglrenderer", "skip", "lsof is not installed")
    files = lsof.parse_fields(lsof_output)
    if not files:
        return Check("krunkit.virglrenderer", "skip", "krunkit is not running (no machine started)")
    libs = lsof.libraries_named(files, "libvirglrenderer")
    if not libs:
        return Check(
            "krunkit.virglrenderer",
            "fail",
            "krunkit runs but mapped no libvirglrenderer: GPU is off",
            "restart with `provision launch` (krunkit must come from the bundle)",
        )
    want = ours.resolve()
    if all(Path(p).resolve() == want for p in libs):
        return Check("krunkit.virglrenderer", "ok", f"krunkit mapped {', '.join(libs)}")
    return Check(
        "krunkit.virglrenderer",
        "fail",
        f"krunkit mapped {', '.join(libs)}, not ours ({want})",
        "stop the machine and run `provision launch` so podman starts the bundle's krunkit",
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
    missing = [p.name for p in (b.ggml_backend, b.ggml_metal) if not p.is_file()]
    if missing:
        return Check(
            "apir.bundle",
            "warn",
            f"bundle lacks {', '.join(missing)}: only the Venus route is available",
            "install the full bundle (ggml-virtgpu-backend is part of .#krun)",
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


# --- orchestration --------------------------------------------------------------------------


def darwin_checks(ctx: DoctorContext) -> list[Check]:
    machine_name = ctx.machine or podman_machine.DEFAULT_MACHINE
    checks: list[Check] = []
    c, b = check_bundle(ctx.krun, ctx.env, ctx.home)
    checks.append(c)
    podman = shutil.which("podman", path=ctx.env.get("PATH"))
    pv_out = run_tool([podman, "--version"]) if podman else None
    kv_out = run_tool([str(b.krunkit), "--version"]) if b else None
    libkrun_v = libkrun_version(b) if b else None
    vchecks, kv = check_versions(ctx.compat, pv_out[1] if pv_out else None, kv_out[1] if kv_out else None, libkrun_v)
    checks += vchecks
    conf = read_containers_conf(containers_conf_files(ctx.env, ctx.home))
    found, tried = find_helper("krunkit", ctx.env, conf, Path(podman).resolve().parent if podman else None)
    checks.append(check_podman_finds_krunkit(found, tried, b))
    try:
        podman_v = versions.parse_podman(pv_out[1]) if pv_out else None
    except ValueError:
        podman_v = None
    checks.append(check_provider(ctx.env, conf, podman_v))
    if b is not None:
        checks.append(check_firmware(b, kv, ctx.compat))
        checks += check_libkrun_symbols(
            dylib.probe_symbols(b.libkrun, [s for s, _ in versions.required_symbols(ctx.compat, kv)]),
            versions.required_symbols(ctx.compat, kv),
        )
        checks.append(_static_virgl_link(b))
        lsof_out = run_tool(lsof.command_cmd("krunkit"))
        checks.append(check_loaded_virglrenderer(lsof_out[1] if lsof_out else None, b.virglrenderer))
        checks.append(check_apir_bundle(b))
    checks.append(check_apir_env(ctx.env, machine_state.recorded_route(machine_name)))
    checks.append(check_dyld(ctx.env))
    machine = None
    if podman:
        res = run_tool(
            podman_machine.inspect_cmd(machine_name), env={**ctx.env, "CONTAINERS_MACHINE_PROVIDER": "libkrun"}
        )
        if res and res[0] == 0:
            machine = podman_machine.find(podman_machine.parse_inspect(res[1]), machine_name)
    checks.append(check_machine_memory(ctx.compat, machine, ctx.vram_mib))
    if ctx.guest_image and podman:
        checks += _guest(ctx, podman)
    return checks


def _static_virgl_link(b: KrunBundle) -> Check:
    real = b.libkrun.resolve()
    listed = run_tool(dylib.otool_l_cmd(real))
    if listed is None:
        return Check("libkrun.links-virglrenderer", "skip", "otool is not installed (Xcode command line tools)")
    linked = dylib.find_linked(dylib.parse_otool_L(listed[1]), "libvirglrenderer")
    loads = run_tool(dylib.otool_load_commands_cmd(real))
    rpaths = dylib.parse_rpaths(loads[1]) if loads else []
    resolved = dylib.resolve_install_name(linked, binary=real, rpaths=rpaths) if linked else []
    return check_linked_virglrenderer(linked, resolved, b.virglrenderer)


def _guest(ctx: DoctorContext, podman: str) -> list[Check]:
    from provision.hosts.darwin.guest_checks import GUEST_SCRIPT, guest_checks

    res = run_tool(
        [
            podman,
            "run",
            "--rm",
            "--device",
            "/dev/dri",
            "--security-opt",
            "label=disable",
            ctx.guest_image or "",
            "sh",
            "-c",
            GUEST_SCRIPT,
        ],
        timeout=300,
    )
    if res is None:
        return []
    return guest_checks(res[1], ctx.pinned_mesa, copr_expected=True)
