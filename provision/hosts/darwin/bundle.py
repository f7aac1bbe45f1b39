"""The krun bundle (``nix profile add .#krun``): krunkit, libkrun, virglrenderer and the ggml
APIR backend side by side under one prefix. Found via ``--krun PATH`` or the Nix profiles.

Layout (the flake's symlinkJoin): ``bin/krunkit``, ``lib/libkrun.1.dylib``,
``lib/libvirglrenderer.1.dylib``, ``lib/libggml-virtgpu-backend.dylib``, ``lib/libggml-metal.dylib``,
``share/krunkit/KRUN_EFI.silent.fd``. podman finds krunkit through
``CONTAINERS_HELPER_BINARY_DIR=<bundle>/bin``.

Two bundles exist on macOS, each saying its route in ``share/krun-gpu/route``: ``.#krun`` (Venus,
libkrun linked to the krunkit virglrenderer) and ``.#krun-apir`` (libkrun linked to the APIR
virglrenderer, installed in a profile of its own since both ship bin/krunkit). ``--route apir``
must never run the Venus bundle's krunkit, nor ``--route venus`` the APIR one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from provision.apir.route import KNOWN_REGS
from provision.core.errors import KrunBundleMissing

LIBKRUN = "libkrun.1.dylib"
VIRGLRENDERER = "libvirglrenderer.1.dylib"
GGML_BACKEND = "libggml-virtgpu-backend.dylib"
GGML_METAL = "libggml-metal.dylib"
GGML_METAL_REG = KNOWN_REGS["metal"]
FIRMWARE = "KRUN_EFI.silent.fd"
ROUTE_FILE = Path("share") / "krun-gpu" / "route"
ROUTES = ("venus", "apir")
# Where `provision launch --route apir` looks first: `nix profile add --profile <this> .#krun-apir`.
APIR_PROFILE = "krun-apir"


@dataclass(frozen=True)
class KrunBundle:
    root: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def krunkit(self) -> Path:
        return self.bin_dir / "krunkit"

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"

    @property
    def libkrun(self) -> Path:
        return self.lib_dir / LIBKRUN

    @property
    def virglrenderer(self) -> Path:
        return self.lib_dir / VIRGLRENDERER

    @property
    def ggml_backend(self) -> Path:
        return self.lib_dir / GGML_BACKEND

    @property
    def ggml_metal(self) -> Path:
        return self.lib_dir / GGML_METAL

    @property
    def libkrun_pc(self) -> Path:
        return self.lib_dir / "pkgconfig" / "libkrun.pc"

    @property
    def route(self) -> str | None:
        """The route this bundle was built for (share/krun-gpu/route), None for a bundle without it."""
        try:
            text = (self.root / ROUTE_FILE).read_text(errors="replace").strip()
        except OSError:
            return None
        return text if text in ROUTES else None

    def serves(self, route: str | None) -> bool:
        # A bundle from before the split says no route; it carried the APIR virglrenderer for both.
        return route is None or self.route is None or self.route == route


def profile_candidates(env: dict[str, str], home: Path) -> list[Path]:
    """Nix profiles in the order nix itself prefers them."""
    user = env.get("USER") or env.get("LOGNAME") or ""
    state = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else home / ".local" / "state"
    out = [home / ".nix-profile", state / "nix" / "profile"]
    if user:
        out.append(Path("/nix/var/nix/profiles/per-user") / user / "profile")
    out += [Path("/nix/var/nix/profiles/default"), Path("/run/current-system/sw")]
    return out


def apir_profile(env: dict[str, str], home: Path) -> Path:
    state = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else home / ".local" / "state"
    return state / "nix" / "profiles" / APIR_PROFILE


def install_hint(route: str | None, env: dict[str, str], home: Path) -> str:
    if route == "apir":
        return f"install it with `nix profile add --profile {apir_profile(env, home)} .#krun-apir`, or pass --krun PATH"
    return "install it with `nix profile add .#krun` (Nix < 2.30: `nix profile install .#krun`), or pass --krun PATH"


def locate(
    explicit: Path | None = None,
    *,
    env: dict[str, str] | None = None,
    home: Path | None = None,
    route: str | None = None,
) -> KrunBundle:
    """The bundle to use (for `route`, when given), or E030 naming every place looked at."""
    env = dict(os.environ) if env is None else env
    home = home or Path.home()
    flake_attr = ".#krun-apir" if route == "apir" else ".#krun"
    if explicit is not None:
        b = KrunBundle(explicit)
        if not b.krunkit.exists():
            raise KrunBundleMissing(
                f"--krun {explicit}: no bin/krunkit there",
                fix=f"point --krun at the prefix of `nix build {flake_attr}` (the directory holding bin/krunkit)",
            )
        if not b.serves(route):
            raise KrunBundleMissing(
                f"--krun {explicit} is the {b.route} bundle ({explicit / ROUTE_FILE}); --route {route} needs its own",
                fix=f"point --krun at the prefix of `nix build {flake_attr}`",
            )
        return b
    tried = profile_candidates(env, home)
    if route == "apir":
        tried = [apir_profile(env, home), *tried]
    for root in tried:
        if (root / "bin" / "krunkit").exists() and KrunBundle(root).serves(route):
            return KrunBundle(root)
    where = f"no krun bundle for the {route} route" if route else "no krun bundle"
    raise KrunBundleMissing(
        f"{where}: bin/krunkit of that route is in none of " + ", ".join(str(p) for p in tried),
        fix=install_hint(route, env, home),
    )


# makeWrapper scripts end with: exec -a "$0" "/nix/store/…-krunkit-1.3.2/bin/.krunkit-wrapped" "$@"
_WRAPPED = re.compile(r'^exec\b.*?"(/[^"]+)"\s+"\$@"', re.MULTILINE)


def real_executable(path: Path) -> Path:
    """Follow symlinks, then a Nix wrapper script, to the binary that actually runs."""
    real = path.resolve()
    try:
        head = real.read_bytes()[:4096]
    except OSError:
        return real
    if head.startswith(b"#!"):
        m = _WRAPPED.search(head.decode("utf-8", "replace"))
        if m:
            return Path(m.group(1)).resolve()
    return real


def firmware_candidates(krunkit_real: Path) -> list[Path]:
    """Where krunkit (>= 1.2) looks for its EFI firmware, relative to its own executable."""
    exe_dir = krunkit_real.parent
    return [
        exe_dir.parent / "share" / "krunkit" / FIRMWARE,
        exe_dir / "share" / "krunkit" / FIRMWARE,
        exe_dir.parent.parent / "share" / "krunkit" / FIRMWARE,
    ]
