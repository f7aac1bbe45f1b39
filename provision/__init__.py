"""krun-gpu's provisioning tool: guest images, models, VMs and checks for GPU llama.cpp."""

__version__ = "0.1.0"
