"""GPU_MEM_GB=80: make a bigger GPU (an H200) run out of memory where an 80 GB card would.

PyTorch can only cap its own caching allocator (set_per_process_memory_fraction). The rest of a
process's footprint lives outside it: the CUDA context, NCCL's communicator buffers (allocated at
each group's first collective, during the first iterations), cuBLAS workspaces. A cap set once at
start-up therefore let a capped run use the cap *plus* NCCL's buffers, and end `ok` above an 80 GB
card's physical memory. So the cap is applied again during the first
iterations, each time subtracting what is then in use outside the allocator: whatever NCCL takes,
the allocator gets less, and the process as a whole stays under the card's size, as on a real card.

Nominal GB are scaled like the H100 80GB's (81559 MiB for "80"), so GPU_MEM_GB=80 reproduces the
reference card: nominal_gb_to_gib is that conversion, the one the launcher's plan and the pages read too (so this
module imports torch only where it caps).
"""
from __future__ import annotations

import os

H100_80GB_MIB = 81559  # NVML's total for an H100 80GB HBM3: what "80" means


def nominal_gb_to_gib(gb: float) -> float:
    """GPU_MEM_GB=N as GiB: N eightieths of an H100 80GB's 81559 MiB (80 -> 79.65 GiB)."""
    return gb * (H100_80GB_MIB / 80) / 1024


class MemoryCap:
    """The process-wide cap, re-applied while memory outside the allocator can still grow."""

    def __init__(self, cap_gb: float, device: int, reapply_iterations: int = 3):
        self.cap_gb = cap_gb
        self.cap = nominal_gb_to_gib(cap_gb) * 2**30
        self.device = device
        self.reapply_iterations = reapply_iterations
        self.fraction = None

    def outside_allocator(self) -> int:
        """Bytes this process holds outside PyTorch's allocator (context, NCCL, cuBLAS workspaces)."""
        import torch

        free, total = torch.cuda.mem_get_info(self.device)
        return (total - free) - torch.cuda.memory_reserved(self.device)

    def apply(self, announce: bool = False) -> None:
        import torch

        total = torch.cuda.mem_get_info(self.device)[1]
        outside = self.outside_allocator()
        fraction = max(0.0, min(1.0, (self.cap - outside) / total))
        if self.fraction is not None and abs(fraction - self.fraction) < 1e-3:
            return  # nothing new outside the allocator: keep the hot path quiet
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        first, self.fraction = self.fraction is None, fraction
        if int(os.environ.get("LOCAL_RANK", 0)) != 0:
            return
        if first:
            print(f"megalab: gpu_mem_cap_gb={self.cap_gb:.15g} cap_mib={self.cap / 2**20:.0f} "
                  f"allocator_fraction={fraction:.4f} device_total_mib={total / 2**20:.0f}", flush=True)
        elif announce:
            print(f"megalab: gpu_mem_cap re-applied outside_allocator_mib={outside / 2**20:.0f} "
                  f"allocator_fraction={fraction:.4f}", flush=True)

    def step(self, iteration: int) -> None:
        """Called from each forward step: re-apply during the first iterations only."""
        import torch

        if iteration <= self.reapply_iterations and not torch.cuda.is_current_stream_capturing():
            self.apply(announce=True)


_CAP: MemoryCap | None = None


def install() -> MemoryCap | None:
    """Set the cap from MEGALAB_GPU_MEM_GB (the launcher passes GPU_MEM_GB), before anything is allocated."""
    global _CAP
    import torch

    cap_gb = os.environ.get("MEGALAB_GPU_MEM_GB")  # the launcher's GPU_MEM_GB (plan.py writes it, variables.gb_text)
    if not cap_gb:
        return None
    device = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(device)
    torch.zeros(1, device="cuda")  # create the context so it is counted
    _CAP = MemoryCap(float(cap_gb), device)
    _CAP.apply()
    return _CAP


def step(iteration: int) -> None:
    if _CAP is not None:
        _CAP.step(iteration)
