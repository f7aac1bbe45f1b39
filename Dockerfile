# Rendered by provision from containerfiles/debian-packages.containerfile.j2 for stack llama-linux.
# Do not edit: change provision/data/stacks.yaml or provision/data/pins.json and render again.
# Debian packages only (no compilers).
# Built with the network off (provision runs this build in a network namespace of its own, or
# with --network=none) and --pull=never: every FROM is a local image, and the packages come
# from the package stages (Containerfile.packages-*), built first and alone with the network
# on. A download that nothing pins fails this build.

# --- kernel: vmlinuz, initrd and the modules the guest loads after the initrd ---------
FROM localhost/krun-gpu-packages/debian-kernel:992026e11aa7 AS kernel
# The initrd (built by initramfs-tools in the package stage) brings the boot drivers; the root
# file system keeps only the closure of the modules init loads, and depmod describes those.
RUN set -- /lib/modules/* \
 && kver="${1##*/}" \
 && modprobe --set-version "$kver" --show-depends --all virtio_gpu virtio_blk ext4 > /tmp/deps \
 && sed -n 's/^insmod \([^ ]*\).*/\1/p' /tmp/deps > /tmp/keep \
 && find "/lib/modules/$kver/kernel" -type f > /tmp/all \
 && grep -vxF -f /tmp/keep /tmp/all > /tmp/drop \
 && xargs rm -f < /tmp/drop \
 && find "/lib/modules/$kver/kernel" -type d -empty -delete \
 && depmod "$kver" \
 && modprobe --set-version "$kver" --show-depends --all virtio_gpu virtio_blk ext4 \
 && rm -f /tmp/deps /tmp/keep /tmp/all /tmp/drop

# --- runtime: tools and runtime libraries only ----------------------------------------
FROM localhost/krun-gpu-packages/debian-runtime:c204c907f65f
COPY --from=kernel /boot/ /boot/
COPY --from=kernel /usr/lib/modules/ /usr/lib/modules/
RUN llama-cli --version
RUN test -x /usr/libexec/x86_64-linux-gnu/llama.cpp-tests/test-backend-ops
ENV GGML_VK_VISIBLE_DEVICES=0
ENV VK_DRIVER_FILES=/usr/share/vulkan/icd.d/virtio_icd.json
LABEL \
      org.opencontainers.image.title="krun-gpu-llama-linux" \
      org.opencontainers.image.description="Venus route for Linux hosts (QEMU + virglrenderer), boots as a VM too" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.vendor="krun-gpu" \
      krun-gpu.stack="llama-linux" \
      krun-gpu.route="venus" \
      krun-gpu.gpu="true" \
      krun-gpu.gpu-vram-mib="2048" \
      krun-gpu.device="Vulkan0" \
      krun-gpu.pin.debian.mesa-vulkan-drivers="26.2.6-1" \
      krun-gpu.pin.debian.vulkan-tools="1.4.341.0+dfsg1-1" \
      krun-gpu.pin.debian.llama.cpp-tools="1:0.7.0+dfsg-2" \
      krun-gpu.pin.debian.llama.cpp-tests="1:0.7.0+dfsg-2" \
      krun-gpu.pin.debian.libggml0-backend-vulkan="0.27.0-1" \
      krun-gpu.pin.debian.kmod="34.2-2+b2" \
      krun-gpu.pin.debian.linux-image-amd64="7.2.13-1" \
      krun-gpu.pin.debian.initramfs-tools="0.151" \
      krun-gpu.pin.debian.udev="262.1-1" \
      org.opencontainers.image.base.name="localhost/krun-gpu-base/debian-sid:6e4a3e5dc8c9" \
      krun-gpu.pin.debian.suite="sid"
