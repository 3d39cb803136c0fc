"""The simulated server's decode speed: step time and accepted tokens from the resolved flags (speed_model.toml).

Two levels of noise, as on a real GPU server:
- per step: `noise_sigma`, relative gaussian noise on each decode step's time (trial-to-trial spread);
- per launch: each SpeedModel (one per launched server) draws a speed factor f = exp(N(0, launch_sigma)) once,
  and every sampled step time is divided by it, so the tok/s per stream the load generator measures is
  f times the config's nominal speed for the whole life of that launch. It stands for what differs between
  two launches of the same flags on a real server: which batch sizes got CUDA graphs captured, the memory
  layout the allocator ended up with, the clocks the GPUs settled at. An assumption (default 3%), not a
  measurement; set `launch_sigma = 0` in a TUNEDASH_SIM_SPEED_FILE to turn it off.
The launch's seed: `launch_seed`, else $TUNEDASH_SIM_LAUNCH_SEED, else `seed` when one is given (a seeded
model is fully deterministic), else fresh entropy, so two launches of one config differ like real ones.
The GPUs' own speed (gpu_factor: one pair behind a slower link, app/sim/placement.py) divides the step time too.
The nominal figures (mean_step_ms, mean_stream_tok_s) leave the launch factor and gpu_factor out.
"""

from __future__ import annotations

import math
import os
import random
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPEED_FILE = Path(__file__).with_name("speed_model.toml")
SPEED_FILE_ENV = "TUNEDASH_SIM_SPEED_FILE"
LAUNCH_SEED_ENV = "TUNEDASH_SIM_LAUNCH_SEED"


def launch_factor(sigma: float, seed: int) -> float:
    """One launch's speed factor: log-normal, median 1, sigma of its log `sigma`."""
    if sigma < 0:
        raise ValueError(f"launch_sigma must be >= 0 (got {sigma})")
    return math.exp(random.Random(seed).gauss(0.0, sigma)) if sigma > 0 else 1.0


def _launch_seed(launch_seed: int | None, seed: int | None) -> int:
    if launch_seed is not None:
        return launch_seed
    env = os.environ.get(LAUNCH_SEED_ENV, "").strip()
    if env:
        try:
            return int(env)
        except ValueError:
            raise ValueError(f"${LAUNCH_SEED_ENV}: expected an integer, got {env!r}") from None
    return seed if seed is not None else random.SystemRandom().getrandbits(63)


def load_params(override: Path | None = None) -> dict[str, Any]:
    """speed_model.toml, with the keys of `override` (or $TUNEDASH_SIM_SPEED_FILE) on top."""
    with SPEED_FILE.open("rb") as fh:
        params = tomllib.load(fh)
    path = override or (Path(os.environ[SPEED_FILE_ENV]) if os.environ.get(SPEED_FILE_ENV) else None)
    if path is not None:
        with path.open("rb") as fh:
            extra = tomllib.load(fh)
        for key, value in extra.items():
            if isinstance(value, dict):
                params.setdefault(key, {}).update(value)
            else:
                params[key] = value
    return params


@dataclass(frozen=True)
class SpeedConfig:
    """The flags (resolved) that the speed model looks at."""

    weights_gib: float
    tp_size: int = 1
    spec_algorithm: str | None = None
    spec_steps: int = 0
    spec_topk: int = 1
    spec_draft_tokens: int = 0
    cuda_graph: bool = True
    cuda_graph_max_bs: int = 32
    piecewise_cuda_graph: bool = False
    single_batch_overlap: bool = False
    overlap_schedule: bool = True
    torch_compile: bool = False


class SpeedModel:
    """Per-step decode time and tokens accepted per step."""

    def __init__(self, cfg: SpeedConfig, params: dict[str, Any] | None = None, seed: int | None = None,
                 launch_seed: int | None = None, gpu_factor: float = 1.0) -> None:
        self.cfg = cfg
        self.p = params if params is not None else load_params()
        self.rng = random.Random(seed)
        self.launch_seed = _launch_seed(launch_seed, seed)
        self.launch_factor = launch_factor(float(self.p.get("launch_sigma", 0.0)), self.launch_seed)
        if not gpu_factor > 0:
            raise ValueError(f"gpu_factor must be > 0 (got {gpu_factor})")
        self.gpu_factor = gpu_factor  # the speed of the GPUs it runs on (app/sim/placement.py), 1 by default

    @property
    def draft_tokens(self) -> int:
        """Draft tokens verified per step beyond the bonus token."""
        if not self.cfg.spec_algorithm:
            return 0
        if self.cfg.spec_topk <= 1:
            return self.cfg.spec_steps
        return max(self.cfg.spec_draft_tokens - 1, self.cfg.spec_steps)

    @property
    def accept_decay(self) -> float:
        """Each later draft position is accepted with this factor less often than the one before (1: no decay)."""
        return float(self.p.get("accept_decay", 1.0)) if self.cfg.spec_algorithm else 1.0

    def position_accept(self, i: int) -> float:
        """The chance draft token i (1-based) is accepted given every one before it was: accept_prob up to
        position accept_decay_after, then accept_decay times less at each later position."""
        after = int(self.p.get("accept_decay_after", 0))
        return self.accept_prob * self.accept_decay ** max(i - after, 0)

    @property
    def accept_prob(self) -> float:
        if not self.cfg.spec_algorithm:
            return 0.0
        p = float(self.p["accept_prob"].get(self.cfg.spec_algorithm, self.p["accept_prob"]["EAGLE"]))
        if self.cfg.spec_topk > 1:
            p = 1 - (1 - p) / math.sqrt(self.cfg.spec_topk)
        return p

    def uses_cuda_graph(self, batch: int) -> bool:
        return self.cfg.cuda_graph and batch <= self.cfg.cuda_graph_max_bs

    def overhead_factor(self, batch: int) -> float:
        f = 1.0
        if not self.uses_cuda_graph(batch):
            f *= self.p["no_cuda_graph_overhead_factor"]
        if self.cfg.piecewise_cuda_graph:
            f *= self.p["piecewise_overhead_factor"]
        if self.cfg.single_batch_overlap:
            f *= self.p["single_batch_overlap_overhead_factor"]
        if self.cfg.overlap_schedule:  # with speculation (spec v2) the overlap hides less of the step
            spec = "spec_" if self.cfg.spec_algorithm else ""
            f *= self.p[f"{spec}overlap_schedule_overhead_factor"]
        return float(f)

    def mean_step_ms(self, batch: int = 1, context: float = 0.0) -> float:
        """One decode step's nominal time for `batch` sequences of `context` tokens each (prompt + generated)."""
        p = self.p
        batch = max(batch, 1)
        grow = 1 + p["batch_cost"] * (batch - 1)
        target = p["target_ms_per_weight_gib"] * self.cfg.weights_gib / max(self.cfg.tp_size, 1)
        if self.cfg.torch_compile:
            target *= p["torch_compile_target_factor"]
        spec = 0.0
        if self.cfg.spec_algorithm:
            draft = p.get("draft_step_ms_by_algorithm", {}).get(self.cfg.spec_algorithm, p["draft_step_ms"])
            spec = self.cfg.spec_steps * draft + self.draft_tokens * p["verify_per_draft_token_ms"]
        # verifying: every sequence's draft tokens go through the target; past a few streams (the knee) decoding
        # stops being memory-bound and their compute grows with the batch
        knee = float(p.get("verify_batch_knee", 1))
        verify_batch = (self.draft_tokens * float(p.get("verify_batch_ms_per_draft_token", 0.0))
                        * max(batch - knee, 0.0))
        # attention: each sequence reads its KV every step; each draft token adds its share (draft + verify)
        ktok = max(context, 0.0) / 1000 * batch
        kv = ktok * (float(p.get("kv_ms_per_ktok", 0.0))
                     + self.draft_tokens * float(p.get("spec_kv_ms_per_ktok", 0.0)))
        return float(p["overhead_ms"] * self.overhead_factor(batch) + (target + spec) * grow + verify_batch + kv)

    def mean_accept_len(self) -> float:
        """Expected tokens per sequence per step (1 without speculative decoding)."""
        total, reach = 1.0, 1.0
        for i in range(1, self.draft_tokens + 1):
            reach *= self.position_accept(i)
            total += reach
        return total

    def mean_stream_tok_s(self, batch: int = 1, context: float = 0.0) -> float:
        """Expected tokens/s of one stream when `batch` streams of `context` tokens decode together."""
        return 1000.0 * self.mean_accept_len() / self.mean_step_ms(batch, context)

    def sample_step_ms(self, batch: int, context: float = 0.0) -> float:
        """One step's time: the nominal mean, this launch's factor, the step's own noise."""
        step = self.mean_step_ms(batch, context) / (self.launch_factor * self.gpu_factor)
        return max(0.1, step * (1 + self.rng.gauss(0, self.p["noise_sigma"])))

    def sample_accept(self) -> int:
        """Tokens one sequence gains in one step (1 + accepted drafts)."""
        n = 1
        for i in range(1, self.draft_tokens + 1):
            if self.rng.random() >= self.position_accept(i):
                break
            n += 1
        return n
