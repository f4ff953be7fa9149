"""The one GPU datasheet table: dense bf16 peak, memory as sold and as NVML reports it, HBM and GPU-to-GPU
link bandwidth, a short name.

MFU (the record, the tables), the estimator's memory and step time, and the bench page's ceiling all
read it here, so a new GPU is one line. Lookup is by the NVML name (`NVIDIA H100 80GB HBM3`,
`NVIDIA A100-SXM4-40GB`): the entry whose match words all occur in it, most specific first.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    short: str  # how pages name the model when NVML's name is not at hand
    match: tuple[str, ...]  # words that must all occur in the upper-cased NVML name
    tflops_bf16: float  # dense (no sparsity) bf16 peak, vendor datasheet
    memory_gb: int  # as sold (decimal GB)
    memory_mib: int | None = None  # what NVML reports as total where measured; None: unknown
    hbm_tbps: float | None = None  # HBM bandwidth, TB/s (vendor datasheet)
    link_gbps: float | None = None  # GPU-to-GPU bandwidth per direction, GB/s: NVLink's total / 2, else PCIe

    @property
    def memory_gib(self) -> float:
        """Usable memory: NVML's total where known, else the sold GB in GiB."""
        return self.memory_mib / 1024 if self.memory_mib else self.memory_gb * 1e9 / 2**30


GPUS: tuple[GPU, ...] = (
    # SXM parts: NVLink 4 is 900 GB/s per GPU in both directions together (450 each way), NVLink 3 600,
    # the H800's 400, NVLink 5 1800; PCIe cards: Gen4 x16, 32 GB/s each way.
    GPU("H100 80GB", ("H100",), 989.0, 80, 81559, hbm_tbps=3.35, link_gbps=450),
    GPU("H200", ("H200",), 989.0, 141, 143771, hbm_tbps=4.8, link_gbps=450),  # the H100's compute, more/faster memory
    GPU("GH200", ("GH200",), 989.0, 96, hbm_tbps=4.0, link_gbps=450),
    GPU("H800", ("H800",), 989.0, 80, hbm_tbps=3.35, link_gbps=200),
    GPU("A100 80GB", ("A100", "80GB"), 312.0, 80, 81920, hbm_tbps=2.039, link_gbps=300),
    GPU("A100 40GB", ("A100", "40GB"), 312.0, 40, 40960, hbm_tbps=1.555, link_gbps=300),
    GPU("A100", ("A100",), 312.0, 40, 40960, hbm_tbps=1.555, link_gbps=300),  # a name that does not say its memory
    GPU("B200", ("B200",), 2250.0, 192, hbm_tbps=8.0, link_gbps=900),
    GPU("L40S", ("L40S",), 362.0, 48, hbm_tbps=0.864, link_gbps=32),
    GPU("A10", ("A10",), 125.0, 24, hbm_tbps=0.6, link_gbps=32),
)

# The GPU a plan assumes when none is named, and the card GPU_MEM_GB=N caps against: N nominal GB are
# eightieths of an H100 80GB's NVML total (megalab/runtime/memcap.py, nominal_gb_to_gib), so "80" is that card.
DEFAULT_GPU_NAME = "NVIDIA H100 80GB HBM3"


# GPU=<key>: the planning GPU on a machine without one (make variable GPU, `python -m megalab plan --gpu`),
# as the NVML name such a card reports, so that lookup() and the pages read it like a real one.
PLANNING_KEYS = {
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "a100": "NVIDIA A100-SXM4-80GB",
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "b200": "NVIDIA B200",
    "gh200": "NVIDIA GH200 480GB",
    "l40s": "NVIDIA L40S",
}


def planning_name(key: str) -> str:
    """GPU=h200 -> 'NVIDIA H200'. A full NVML name the datasheet knows is taken as it is; anything
    else raises ValueError with the keys to choose from."""
    if key.lower() in PLANNING_KEYS:
        return PLANNING_KEYS[key.lower()]
    if lookup(key):
        return key
    raise ValueError(f"GPU={key} is not a GPU megalab knows; fix: one of {', '.join(PLANNING_KEYS)}")


def holding(mem_gb: float) -> str:
    """The NVML name of the smallest planning GPU with at least GPU_MEM_GB=mem_gb (the H100 when none
    is that big): with no GPU here, GPU_MEM_GB=141 plans for an H200, not an H100 80GB."""
    cards = sorted((lookup(n).memory_gb, n) for n in PLANNING_KEYS.values())
    return next((n for gb, n in cards if gb >= mem_gb), DEFAULT_GPU_NAME)


def lookup(gpu_name: str | None) -> GPU | None:
    """The datasheet entry for an NVML name; None when absent or unknown."""
    if not gpu_name:
        return None
    name = gpu_name.upper()
    for gpu in sorted(GPUS, key=lambda g: -sum(len(w) for w in g.match)):  # GH200 before H200, A100 before A10
        if all(w in name for w in gpu.match):
            return gpu
    return None


def peak_tflops(gpu_name: str | None) -> float | None:
    """Dense bf16 peak TFLOP/s for an NVML name; None when unknown (MFU is then not given)."""
    gpu = lookup(gpu_name)
    return gpu.tflops_bf16 if gpu else None


def default_gpu() -> GPU:
    gpu = lookup(DEFAULT_GPU_NAME)
    assert gpu is not None
    return gpu


def short_gpu_name(name: str | None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100 80GB'; 'NVIDIA H200' -> 'H200' (NVML's words, the vendor and
    the memory type dropped: the record's own name, never rewritten to the datasheet's)."""
    if not name:
        return "GPU"
    words = [w for w in name.split() if not w.upper().startswith("HBM")]
    if words and words[0].upper() == "NVIDIA" and len(words) > 1:
        words = words[1:]
    return " ".join(words)
