"""Doctor checks for the macOS route (podman machine + krunkit + the krun bundle).

Each ``check_*`` takes what was probed (paths, tool output, env) and returns Checks, so the
tests drive them with real artifacts and recorded outputs; ``darwin_checks`` does the probing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from provision.adapters import dylib, lsof, podman_machine, runner
from provision.core.diagnostics import Check, DoctorContext
from provision.core.errors import KrunBundleMissing
from provision.hosts.darwin import bundle as bundle_mod
from provision.hosts.darwin import machine_state, versions
from provision.hosts.darwin.bundle import KrunBundle
from provision.hosts.darwin.podman_checks import (
    check_apir_bundle,
    check_apir_env,
    check_dyld,
    check_machine_memory,
    check_podman_finds_krunkit,
    check_provider,
    containers_conf_files,
    find_helper,
    read_containers_conf,
)

# --- bundle, firmware ---------------------------------------------------------------------


def check_bundle(
    explicit: Path | None, env: dict[str, str], home: Path, route: str | None = None
) -> tuple[Check, KrunBundle | None]:
    try:
        b = bundle_mod.locate(explicit, env=env, home=home, route=route)
    except KrunBundleMissing as exc:
        return Check("krun.bundle", "fail", exc.message, exc.fix), None
    return Check("krun.bundle", "ok", f"krunkit at {b.krunkit} -> {bundle_mod.real_executable(b.krunkit)}"), b


def check_virglrenderer_in_force(b: KrunBundle, recorded_route: str | None) -> Check:
    """Which virglrenderer krunkit of this bundle loads: the krunkit one (Venus) or the APIR one."""
    lib = b.virglrenderer
    real = lib.resolve() if lib.exists() else None
    which = {"venus": "the krunkit virglrenderer (Venus on MoltenVK)", "apir": "the APIR virglrenderer"}.get(
        b.route or "", "a bundle that names no route (built before the Venus/APIR split)"
    )
    evidence = f"{b.root} is the {b.route or 'unmarked'} bundle: {which}, {lib} -> {real or 'missing'}"
    if real is None:
        return Check("krun.virglrenderer-in-force", "fail", evidence, "rebuild the bundle: nix build .#krun")
    if recorded_route and b.route and recorded_route != b.route:
        return Check(
            "krun.virglrenderer-in-force",
            "fail",
            evidence + f"; the machine was last launched on the {recorded_route} route",
            f"provision launch --route {recorded_route} (it finds that route's bundle), or --route {b.route}",
        )
    return Check("krun.virglrenderer-in-force", "ok", evidence)


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


# --- orchestration --------------------------------------------------------------------------


def darwin_checks(ctx: DoctorContext) -> list[Check]:
    machine_name = ctx.machine or podman_machine.DEFAULT_MACHINE
    checks: list[Check] = []
    # the bundle of the route the machine was last launched on: that is the virglrenderer in force
    c, b = check_bundle(ctx.krun, ctx.env, ctx.home, machine_state.recorded_route(machine_name))
    checks.append(c)
    podman = runner.found("podman", path=ctx.env.get("PATH"))
    pv_out = runner.probe([podman, "--version"]) if podman else None
    kv_out = runner.probe([str(b.krunkit), "--version"]) if b else None
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
        checks.append(check_virglrenderer_in_force(b, machine_state.recorded_route(machine_name)))
        checks.append(check_firmware(b, kv, ctx.compat))
        checks += check_libkrun_symbols(
            dylib.probe_symbols(b.libkrun, [s for s, _ in versions.required_symbols(ctx.compat, kv)]),
            versions.required_symbols(ctx.compat, kv),
        )
        checks.append(_static_virgl_link(b))
        lsof_out = runner.probe(lsof.command_cmd("krunkit"))
        checks.append(check_loaded_virglrenderer(lsof_out[1] if lsof_out else None, b.virglrenderer))
        checks.append(check_apir_bundle(b))
    checks.append(check_apir_env(ctx.env, machine_state.recorded_route(machine_name)))
    checks.append(check_dyld(ctx.env))
    machine = None
    if podman:
        res = runner.probe(
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
    listed = runner.probe(dylib.otool_l_cmd(real))
    if listed is None:
        return Check("libkrun.links-virglrenderer", "skip", "otool is not installed (Xcode command line tools)")
    linked = dylib.find_linked(dylib.parse_otool_L(listed[1]), "libvirglrenderer")
    loads = runner.probe(dylib.otool_load_commands_cmd(real))
    rpaths = dylib.parse_rpaths(loads[1]) if loads else []
    resolved = dylib.resolve_install_name(linked, binary=real, rpaths=rpaths) if linked else []
    return check_linked_virglrenderer(linked, resolved, b.virglrenderer)


def _guest(ctx: DoctorContext, podman: str) -> list[Check]:
    from provision.hosts.darwin.guest_checks import GUEST_SCRIPT, guest_checks

    res = runner.probe(
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
