"""The embedded simulated GPU host: simulated GPUs, a fake nvidia-smi and an SGLang-like server."""
