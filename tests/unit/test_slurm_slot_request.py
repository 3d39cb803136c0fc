"""`tune --slots` over several allocations, the pure parts: a slot's own salloc request and the GRES indices
Slurm gave a job (docs/architecture.md#tune---slots-n-over-several-allocations-built)."""

from __future__ import annotations

from app.core.hosts.slurm_facts import gres_gpu_indices
from app.core.hosts.slurm_request import SlurmRequest


def test_a_slot_asks_under_its_own_name_with_a_deadline() -> None:
    request = SlurmRequest(partition="gpu", gpus=2, time="30")
    slot = request.for_slot(2, 60, gpus=1)
    assert slot.salloc_argv() == ["salloc", "--no-shell", "-N1", "-J", "tunedash@slot2", "--immediate=60",
                                  "-p", "gpu", "--gpus=2", "--time=30"]  # the profile's request, not `gpus`
    assert request.salloc_argv()[:5] == ["salloc", "--no-shell", "-N1", "-J", "tunedash"]  # slot 0 unchanged
    assert slot.describe() != request.describe()  # a recorded allocation of one is never taken for the other's


def test_beside_an_attached_job_a_slot_asks_for_the_profiles_gpus() -> None:
    slot = SlurmRequest(job=4242).for_slot(1, 5, gpus=2)
    assert slot.job is None
    assert slot.salloc_argv() == ["salloc", "--no-shell", "-N1", "-J", "tunedash@slot1", "--immediate=5", "--gpus=2"]


def test_gres_indices_are_read_from_scontrol() -> None:
    assert gres_gpu_indices("   Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)\n") == (0,)
    assert gres_gpu_indices("Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:a100:4(IDX:0-1,4,6)") == (0, 1, 4, 6)
    assert gres_gpu_indices("Nodes=n1 CPU_IDs=0 Mem=0 GRES=") == ()
    assert gres_gpu_indices("JobId=7 JobName=x\n   TresPerNode=gres:gpu:1") == ()
