# Rendered by provision from containerfiles/debian-packages.containerfile.j2 for stack llama-linux.
# Do not edit: change provision/data/stacks.yaml or provision/data/pins.json and render again.
# Debian packages only (no compilers); apt checks the archive signatures.
FROM localhost/krun-gpu-base/debian-sid:528771bb1fc3
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      mesa-vulkan-drivers=26.2.6-1 \
      vulkan-tools=1.4.341.0+dfsg1-1 \
      llama.cpp-tools=1:0.7.0+dfsg-2 \
      llama.cpp-tests=1:0.7.0+dfsg-2 \
      libggml0-backend-vulkan=0.27.0-1 \
      linux-image-amd64=7.2.13-1 \
      initramfs-tools=0.151 \
      kmod=34.2-2+b2 \
      udev=262.1-1 \
 && rm -rf /var/lib/apt/lists/*
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
      krun-gpu.pin.debian.linux-image-amd64="7.2.13-1" \
      krun-gpu.pin.debian.initramfs-tools="0.151" \
      krun-gpu.pin.debian.kmod="34.2-2+b2" \
      krun-gpu.pin.debian.udev="262.1-1" \
      org.opencontainers.image.base.name="localhost/krun-gpu-base/debian-sid:528771bb1fc3" \
      krun-gpu.pin.debian.suite="sid"
