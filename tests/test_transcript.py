"""The quickstart page and its transcript: the dependencies it lists are pyproject.toml's, and transcript.txt
is what `megalab transcript` regenerates (what only a GPU run shows is labelled as such, with where it ran)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from conftest import megatron_verdict
from megalab.__main__ import main
from megalab.results import transcript

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "tutorials" / "00-quickstart.md"


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=;!~]", requirement, maxsplit=1)[0]


def test_the_quickstart_lists_every_dependency_and_extra_of_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    page = QUICKSTART.read_text(encoding="utf-8")
    missing = [d for d in map(_name, project["dependencies"]) if d not in page]
    assert not missing, f"tutorials/00-quickstart.md does not list {missing} (pyproject.toml's dependencies)"
    extras = [e for e in project["optional-dependencies"] if f".[{e}]" not in page]
    assert not extras, f"tutorials/00-quickstart.md does not name the extras {extras}"
    listed = re.search(r"brings megalab's dependencies: (.*?), and the `megalab` command", page, re.S).group(1)
    names = {n.strip() for n in re.split(r",|\band\b", listed.replace("\n", " ")) if n.strip()}
    assert names == set(map(_name, project["dependencies"])), "the list names a package pyproject.toml does not"


def test_the_quickstart_gives_no_stale_cuda_graph_advice():
    page = QUICKSTART.read_text(encoding="utf-8")
    assert "CUDA_GRAPH=1 make 101" not in page and "CUDA_GRAPH=auto" in page


def test_the_transcript_is_what_megalab_transcript_regenerates(capsys):
    # speed only (conftest): the preflight's Megatron check, cached
    megatron_verdict(transcript.TARGET, {"DRY_RUN": "1", "GPU": transcript.GPU, "ITERS": transcript.ITERS})
    assert main(["transcript", "--check"]) == 0, \
        "results/quickstart/transcript.txt: run `.venv/bin/python -m megalab transcript`"
    assert "up to date" in capsys.readouterr().out


def test_every_section_says_whether_it_is_regenerated_or_a_gpu_run():
    text = (ROOT / transcript.TRANSCRIPT).read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings and all(transcript.HEADING.match(h) for h in headings), headings
    kinds = {t: tag.split(":")[0] for t, tag, _ in transcript.sections(text)}
    assert kinds["2. First run: the run"] == "GPU run" and "commit" in dict(
        (t, tag) for t, tag, _ in transcript.sections(text))["2. First run: the run"]
    assert [t for t, k in kinds.items() if k == "regenerated"] == [
        "2. First run: the preflight", "3. Reading a row", "4. Your own runs go to outdir/"]


def test_render_replaces_regenerated_sections_and_keeps_the_gpu_ones():
    kept = [("1. Install", "GPU run: rig", "+ pip\n"), ("2. First run: the preflight", "regenerated: old", "old\n"),
            ("2. First run: the run", "GPU run: rig, commit abc", "result ok\n")]
    text = transcript.render(kept, {"2. First run: the preflight": ("regenerated: new", "new\n")})
    assert transcript.sections(text) == [kept[0], ("2. First run: the preflight", "regenerated: new", "new\n"), kept[2]]
    try:
        transcript.render(kept[:1], {"2. First run: the preflight": ("regenerated: new", "new\n")})
    except transcript.TranscriptError as e:
        assert "fix:" in str(e) and "\n" not in str(e)
    else:
        raise AssertionError("a transcript without a regenerated section is refused")
