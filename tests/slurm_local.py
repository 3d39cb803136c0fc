"""The one-node Slurm of scripts/slurm-local, as tests find it: its SLURM_CONF, and why Slurm tests skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.helpers import REPO

SLURM_DIR = Path(os.environ.get("TUNEDASH_SLURM_DIR", "/tmp/tunedash-slurm"))
SLURM_CONF = SLURM_DIR / "etc" / "slurm.conf"


def slurm_missing() -> str:
    """Why the Slurm tests cannot run here ("" when they can): no Slurm installed, or the one-node cluster of
    scripts/slurm-local not up (`.ci/run` brings it up)."""
    if shutil.which("srun") is None or shutil.which("slurmctld") is None:
        return "Slurm is not installed (apt-get install -y slurm-wlm munge; .ci/run does it)"
    status = subprocess.run([str(REPO / "scripts" / "slurm-local"), "status"], capture_output=True, check=False,
                            env={**os.environ, "TUNEDASH_SLURM_DIR": str(SLURM_DIR)})
    if status.returncode != 0:
        return f"the one-node Slurm is not up (run `scripts/slurm-local start`; it uses {SLURM_DIR})"
    return ""
