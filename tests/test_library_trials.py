"""The bench page's library trials: read from the committed outputs, the verdict from the numbers, a cut file safe."""
from pathlib import Path

from megalab.results import library_trials as lt

CP = """# a note
302-cp2-gpt2-1.2B-gbs8-len4096: micro-batch 8, 16 heads (16 K/V groups) of 96, sequence 4096, CP=2 (2048 tokens a rank); x
| implementation | ms per call (slowest rank) | / ideal | peak MiB above inputs | max abs error | note |
| --- | --- | --- | --- | --- | --- |
| megalab p2p (ring) | {ours} | 1.92 | 1202 | 3.1e-02 |  |
| megalab a2a | 5.575 | 1.92 | 770 | 4.9e-04 |  |
| torch ring (allgather) | 6.101 | 2.10 | 1586 | 3.1e-02 |  |
| torch ring (alltoall) | {theirs} | 2.07 | 1490 | 3.1e-02 |  |
"""

GEMM = """## run 1
# NVIDIA H200 grouped_gemm 0.3.0 built with GROUPED_GEMM_CUTLASS=1: 16384 tokens, top-8 of 64 experts (131072 rows)
| library | fc1 forward | six GEMMs | x 16 layers | TFLOP/s |
| --- | --- | --- | --- | --- |
| torch._grouped_mm (today) | 0.489 | 2.900 | 46.4 | 568 |
| grouped_gemm (MegaBlocks) | 0.664 | 3.900 | 62.4 | 422 |
| quack-kernels | 0.4 | {quack} | 1 | 1 |
"""


def test_cp_verdict_follows_the_numbers():
    won = "\n".join(lt.cp_section(CP.format(ours="5.566", theirs="6.008")))
    assert "faster at 1 of 1 shapes; it stays" in won and "| +8% |" in won
    lost = "\n".join(lt.cp_section(CP.format(ours="7.000", theirs="6.008")))
    assert "faster at 0 of 1" in lost and "lever trial of torch's ring is due" in lost and "| -14% |" in lost


def test_gemm_verdict_follows_the_numbers_and_names_the_build():
    slow = "\n".join(lt.gemm_section(GEMM.format(quack="3.100")))
    assert "torch._grouped_mm, what runs today, is the fastest" in slow
    assert "grouped_gemm (MegaBlocks), CUTLASS build" in slow
    fast = "\n".join(lt.gemm_section(GEMM.format(quack="2.700")))
    assert "quack-kernels is the fastest, 3.2 ms a step ahead" in fast


def test_each_routing_gets_a_table_of_its_own():
    other = GEMM.format(quack="2.7").replace("top-8 of 64 experts", "top-4 of 32 experts").replace("2.900", "1.4")
    page = "\n".join(lt.gemm_section(GEMM.format(quack="3.1") + other))
    assert "**16384 tokens, top-8 of 64 experts**: torch._grouped_mm" in page
    assert "**16384 tokens, top-4 of 32 experts**: torch._grouped_mm" in page  # 1.4 beats 2.7 there
    assert not lt.gemm_runs(GEMM.format(quack="3.1").replace("16384 tokens, ", ""))  # no routing named


def test_a_cut_or_damaged_file_gives_fewer_rows_never_a_wrong_one():
    text = CP.format(ours="5.566", theirs="6.008")
    cut = text[: text.index("| torch ring (allgather)")]  # torch's rows lost: no comparison to make
    assert lt.cp_rows(cut) == []
    assert "not run, or cut short" in "\n".join(lt.cp_section(cut))
    assert lt.gemm_runs(GEMM.format(quack="2.7").replace("| torch._grouped_mm (today) | 0.489 | 2.900", "| torch")) == []
    assert lt.gemm_runs("| library | six GEMMs |\n| x | 1.0 |") == []  # rows outside a run


def test_section_only_for_files_present(tmp_path: Path):
    assert lt.section(tmp_path, lambda p: p.read_text()) == []
    (tmp_path / lt.GEMM_TRIAL).write_text(GEMM.format(quack="2.7"))
    page = lt.section(tmp_path, lambda p: p.read_text())
    assert page[0] == "## Libraries tried against what runs today" and not any("ring attention" in x for x in page)
