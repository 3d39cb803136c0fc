"""The embedded simulated GPU host: simulated GPUs, a fake nvidia-smi and an SGLang-like server.

`__version__` is the SGLang release this simulated host plays (TUNEDASH_SIM_SGLANG_VERSION, app.sim.versions):
tunedash's flag discovery reads it the way `import sglang; print(sglang.__version__)` reads the real one,
without importing the server module itself.
"""

import os as _os

__version__ = _os.environ.get("TUNEDASH_SIM_SGLANG_VERSION") or "0.5.10"  # app.sim.versions.version_from_env
