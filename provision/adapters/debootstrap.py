"""debootstrap: Debian root filesystems for base images and host-tools chroots.

Always the client's default mirror (no mirror argument). The mirror may serve a dated
snapshot whose Release file has expired, so apt inside is told not to check validity.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from provision.adapters import partials, runner
from provision.core.errors import ImageBuildFailed
from provision.core.log import say

APT_SNAPSHOT_CONF = 'Acquire::Check-Valid-Until "false";\n'
APT_NO_RECOMMENDS = 'APT::Install-Recommends "false";\n'


def command(suite: str, dest: Path, *, variant: str = "minbase", include: Sequence[str] = ()) -> list[str]:
    cmd = ["debootstrap", f"--variant={variant}"]
    if include:
        cmd.append("--include=" + ",".join(include))
    return [*cmd, suite, str(dest)]


def make_rootfs(suite: str, dest: Path, *, variant: str = "minbase", include: Sequence[str] = ()) -> Path:
    """Create ``dest`` atomically: built in a sibling temp dir, renamed only when complete.

    debootstrap mounts /proc and /sys in its target; it runs in a private mount namespace so a
    killed debootstrap leaves no mount behind, and the leftover temp dir is removed next time.
    """
    runner.which("debootstrap", fix="apt-get install debootstrap (scripts/setup-debian does)")
    if dest.exists():
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    partials.remove(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    cmd = command(suite, tmp, variant=variant, include=include)
    say("debootstrap")(f"debootstrap: {' '.join(cmd)}")
    private = ["unshare", "--mount", "--propagation", "private", *cmd]
    done = runner.run(private, name="debootstrap", stderr=runner.STDOUT)
    if done.status != 0:
        tail = "\n".join(done.out.splitlines()[-15:])
        raise ImageBuildFailed(f"debootstrap {suite} failed (exit {done.status}):\n{tail}")
    conf = tmp / "etc/apt/apt.conf.d"
    (conf / "99krun-gpu-snapshot").write_text(APT_SNAPSHOT_CONF)
    (conf / "99krun-gpu-norecommends").write_text(APT_NO_RECOMMENDS)
    tmp.rename(dest)
    return dest
