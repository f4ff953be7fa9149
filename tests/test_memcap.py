"""megalab/runtime/memcap.py: the GPU_MEM_GB cap counts memory outside PyTorch's allocator.

A fake device stands in for the GPU: 140 GiB total, a context of 0.5 GiB, then NCCL buffers that
appear after start-up. The allocator's fraction must shrink by exactly what NCCL took, so the
process as a whole stays under the cap (the rows that ended `ok` above an 80 GB card's memory).
"""
import pytest
import torch

from megalab.runtime import memcap

GiB = 2**30


class FakeDevice:
    def __init__(self):
        self.total = 140 * GiB
        self.outside = int(0.5 * GiB)  # CUDA context
        self.reserved = 0
        self.fractions = []

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (self.total - self.outside - self.reserved, self.total))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: self.reserved)
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: self.fractions.append(f))
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def test_cap_subtracts_memory_outside_the_allocator_as_it_grows(monkeypatch, capsys):
    dev = FakeDevice()
    dev.install(monkeypatch)
    cap = memcap.MemoryCap(80.0, device=0)
    cap.apply()
    first = dev.fractions[-1]
    assert first * dev.total == pytest.approx(cap.cap - 0.5 * GiB)
    dev.reserved = 30 * GiB          # the allocator's own blocks never count twice
    cap.step(iteration=1)
    assert len(dev.fractions) == 1   # nothing new outside the allocator: not re-applied
    dev.outside += 2 * GiB           # NCCL's communicators at the first collective
    cap.step(iteration=2)
    assert dev.fractions[-1] * dev.total == pytest.approx(cap.cap - 2.5 * GiB)
    # allocator limit + memory outside it == the cap: the whole process fits an 80 GB card
    assert dev.fractions[-1] * dev.total + dev.outside == pytest.approx(cap.cap)
    out = capsys.readouterr().out
    assert "gpu_mem_cap_gb=80 cap_mib=81559" in out and "re-applied outside_allocator_mib=2560" in out


def test_cap_is_left_alone_after_the_first_iterations_and_while_capturing(monkeypatch):
    dev = FakeDevice()
    dev.install(monkeypatch)
    cap = memcap.MemoryCap(80.0, device=0, reapply_iterations=3)
    cap.apply()
    dev.outside += GiB
    cap.step(iteration=4)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    cap.step(iteration=2)
    assert len(dev.fractions) == 1


@pytest.mark.parametrize("gb", [80.0, 141.0, 40.5])
def test_the_runtime_cap_and_the_launcher_read_one_conversion(gb):
    """GPU_MEM_GB becomes GiB in one function (memcap.nominal_gb_to_gib), which the launcher's plan reads too. The
    launcher passes the cap as text the entry point parses back once (variables.gb_text: 80.0 -> "80")."""
    from megalab.core import variables

    text = variables.gb_text(gb)
    assert float(text) == gb and (text == "80") == (gb == 80.0)
    cap = memcap.MemoryCap(float(text), device=0)
    assert cap.cap / GiB == memcap.nominal_gb_to_gib(gb)


def test_nominal_gb_become_gib_in_one_function():
    import re
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1] / "megalab"
    formula = re.compile(r"81559\s*/\s*80|H100_80GB_MIB\s*/\s*80|\* *1e9 */ *2 *\*\* *30.*gpu_mem")
    where = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if formula.search(p.read_text()))
    assert where == ["runtime/memcap.py"]
    text = (pkg / "runtime" / "memcap.py").read_text()
    assert len(formula.findall(text)) == 1
