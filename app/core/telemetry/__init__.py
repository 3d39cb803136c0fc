"""GPU telemetry: nvidia-smi parsing and streaming, NVML, and the free check.

`smi_parse` turns nvidia-smi CSV into typed rows (never raises; counts skipped lines), `smi` is the
nvidia-smi source over a Host (one `-lms` stream plus process lists) and picks a source per profile, `nvml`
the local NVML source, `freecheck` the rule that says a GPU is back at idle, `topology` the GPUs' compute
capability and interconnect (`compute_cap`, `topo -m`). May import app.core.hosts and
app.core.data.
"""
