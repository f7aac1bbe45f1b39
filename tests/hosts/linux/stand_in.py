"""A stand-in QEMU installed as an unpacked host-tools bundle: what a test needs to plan and "run" a
guest without the real tools. It writes what it received (argv, environment, uid, working directory,
a file only its root holds) to the guest's stdout serial file, which the real watch loop copies to
provision's stdout, and ends the guest through the console as an init would."""

from __future__ import annotations

import json
from pathlib import Path

from provision.core import catalog
from provision.hosts.linux.run import facts
from provision.hosts.linux.tools import bundle, bundle_archive, host_tools
from tests.hosts.linux.test_doctor_linux import QEMU_HELP

TREE_MARK = "krun-plan-test-root"
# The run branch (QEMU's own flags start with -accel); everything else answers the tools' probes.
STAND_IN = """#!/bin/sh
case "$1" in
  --version) echo 'QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2)'; exit 0 ;;
  -display) printf 'Available display backend types:\\nnone\\nsdl\\negl-headless\\n'; exit 0 ;;
  -accel) ;;
  *) cat <<'EOF'
""" + QEMU_HELP + """EOF
  exit 0 ;;
esac
for a in "$@"; do
  case "$a" in
    file,id=con,path=*) con="${a#file,id=con,path=}" ;;
    file,id=out,path=*) out="${a#file,id=out,path=}" ;;
    serial,id=out,path=*) out="${a#serial,id=out,path=}" ;;
  esac
done
{
  printf '@@argv\\n'; printf '%s\\0' "$0" "$@"
  printf '\\n@@env\\n'; cat /proc/$$/environ
  printf '\\n@@pid\\n%s' "$$"
  printf '\\n@@uid\\n%s' "$(id -u)"
  printf '\\n@@cwd\\n%s' "$(pwd -P)"
  printf '\\n@@root\\n'; cat /""" + TREE_MARK + """ 2>/dev/null || printf 'host'
  printf '\\n@@end\\n'
} > "$out"
printf 'KRUN-INIT up=1\\nKRUN-EXIT=0\\n' > "$con"
"""


def install_bundle(*stacks: catalog.Stack) -> Path:
    """An installed bundle whose QEMU is the stand-in, with a guest disk for each of ``stacks`` (image tag and
    all); the first is the bundle's default guest."""
    top = bundle_archive.default_install_dir()
    files = {host_tools.QEMU: STAND_IN, host_tools.RENDER_SERVER: "", host_tools.EGL_LOADER: "",
             "usr/lib/x86_64-linux-gnu/libvirglrenderer.so.1": "",
             # the bundle's lavapipe, as a bundle built without --host-driver carries it: a GPU route is reachable
             "usr/share/vulkan/icd.d/lvp_icd.x86_64.json": '{"ICD": {"library_path": "libvulkan_lvp.so"}}'}  # fmt: skip
    guests = {}
    for stack in stacks:
        guest = f"{bundle.GUEST_DIR}/{stack.name}"
        files |= {f"{guest}/vmlinuz": "k", f"{guest}/initrd.img": "i", f"{guest}/root.img": "r"}
        guests[stack.name] = {"stack": stack.name, "image": facts.image_tag(stack), "image_id": "sha256:" + "0" * 64,
                              "kernel": f"{stack.name}/vmlinuz", "initrd": f"{stack.name}/initrd.img",
                              "disk": f"{stack.name}/root.img"}  # fmt: skip
    for rel, text in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(text)
        (top / rel).chmod(0o755)
    manifest = {"format": bundle_archive.FORMAT, "guest": guests[stacks[0].name], "guests": guests,
                "files": bundle_archive.hashes(top)}  # fmt: skip
    (top / bundle_archive.MANIFEST).write_text(json.dumps(manifest))
    return top
