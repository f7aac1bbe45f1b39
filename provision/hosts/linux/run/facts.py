"""What the host has for one run, gathered before it is planned (runplan.plan_run is pure).

``gather(req, dry_run=True)`` reads only: a disk, run directory or model not made yet shows as
the path it will have, the guest user as the run would add it, and no image is built. Order,
each with its own error: the stack's hosts -> host tools (E020) -> the route's host side -> disks.
"""

from __future__ import annotations

from pathlib import Path

from provision.core import settings as settings_mod
from provision.core.catalog import Stack
from provision.core.errors import VmFailed
from provision.hosts import RunRequest
from provision.hosts.linux.run import accel as accel_mod
from provision.hosts.linux.run import display as gl_display
from provision.hosts.linux.run import isolation, run_dirs, runplan
from provision.hosts.linux.tools import bundle, host_tools
from provision.images import disks as vmdisk

AT_RUN_TIME = "(made at run time)"


def gather(
    req: RunRequest, *, dry_run: bool, settings: settings_mod.Settings | None = None
) -> runplan.HostFacts:
    stack, gpu = req.stack, req.gpu
    if "linux" not in stack.hosts:
        raise VmFailed(f"stack {stack.name!r} is not made for Linux hosts (hosts: {', '.join(stack.hosts)})")
    tools = _tools(stack, gpu)
    apir = stack.route == "apir" and gpu
    route_env: dict[str, str] = {}
    if apir:
        from provision.hosts.linux.apir import host_side

        # APIR: QEMU loads our virglrenderer, which loads the host ggml (Venus capset re-routed). Per
        # run, never kept: `provision bench` runs an APIR guest and then a Venus one.
        route_env = host_side.require(tools).qemu_env()
    accel = accel_mod.host_accelerator()
    render_node = has_render_node()
    root = bundle.root_disk_for(tools, stack) or (planned_root_disk(stack) if dry_run else root_disk(stack))
    model_disk = None
    guest_model = runplan.guest_model(req)
    if req.model_path is not None and guest_model is not None:
        model_disk = (_cache("model-disks") / f"{AT_RUN_TIME}.img" if dry_run
                      else vmdisk.model_disk(req.model_path, guest_model, dict(req.model_extras)))  # fmt: skip
    return runplan.HostFacts(
        tools=tools,
        accel=accel,
        render_node=render_node,
        root=root,
        run_dir=_cache("runs") / AT_RUN_TIME if dry_run else run_dirs.new(),
        model_disk=model_disk,
        route_env=route_env,
        # no X server: SDL's offscreen driver makes QEMU's GL context over EGL
        display_env=gl_display.run_env(tools.root if tools.is_chroot else Path("/")) if gpu and not render_node
        else {},
        watch_workers=apir,
        guest_debug=(settings or settings_mod.current()).typed.guest_debug,
        user=isolation.run_user(tools.root, is_chroot=tools.is_chroot, accel=accel, gpu=gpu, dry_run=dry_run),
    )


def _cache(name: str, settings: settings_mod.Settings | None = None) -> Path:
    """Where the cache keeps ``name``, made only when a run writes there."""
    return (settings or settings_mod.current()).typed.cache / name


def _tools(stack: Stack, gpu: bool) -> host_tools.HostTools:
    if stack.route == "apir" and gpu:
        from provision.hosts.linux.apir import host_side

        host_side.require(host_tools.locate())  # E020 naming `host-tools --apir`, before any VM
    return host_tools.require(gpu=gpu)


def has_render_node() -> bool:
    return any(Path("/dev/dri").glob("renderD*")) if Path("/dev/dri").is_dir() else False


def planned_root_disk(stack: Stack) -> vmdisk.RootDisk:
    """Where the stack's VM disk is (already made) or will be (named by its image), for a dry run."""
    ref = image_tag(stack)
    made = vmdisk.made_disk(_cache("vm-disks"), ref)
    if made is not None:
        return made
    where = _cache("vm-disks") / f"(made at run time from {ref})"
    return vmdisk.RootDisk(where / "root.img", where / "vmlinuz", where / "initrd.img", "")


def image_tag(stack: Stack) -> str:
    from provision.core import pins as pins_mod
    from provision.images import build as images

    return images.default_tag(images.render_stack(stack, pins_mod.default()))


def image_for(stack: Stack) -> tuple[str, str]:
    """(image ref, image id) of the stack's image: the one already built for these pins, else a build."""
    from provision.images import announce

    return announce.build_unasked(stack.name, needed_by="this command")


def root_disk(stack: Stack) -> vmdisk.RootDisk:
    ref, image_id = image_for(stack)
    return vmdisk.root_disk(ref, image_id)
