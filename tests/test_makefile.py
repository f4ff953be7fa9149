"""The Makefile and what stands behind it: targets from the catalog (ids held to plain names), `make
help`'s campaign and page variables, tab completion as documented, the defaults the Makefile repeats,
an OUTDIR inside the repository out of git's sight, the campaign on a machine without GPUs, batch's
input, the sbatch job's environment, docker-run's OUTDIR (issues 31 and 33)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megalab.core import catalog, variables
from megalab.core.variables import LaunchError
from megalab.harness import batch, campaign, docker, scratch, slurm

ROOT = Path(__file__).resolve().parent.parent


def _make(*args, cwd=ROOT, **env):
    env = {**{k: v for k, v in os.environ.items() if k not in variables.BY_NAME}, "PY": sys.executable, **env}
    return subprocess.run(["make", "-s", *args], cwd=cwd, capture_output=True, text=True, env=env)


@pytest.fixture
def repo(tmp_path):
    """A copy of what make needs: the Makefile, megalab, configs."""
    for name in ("Makefile", "megalab", "configs"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, tmp_path / name)
    return tmp_path


# ---- targets ------------------------------------------------------------------------------------------

def test_own_goals_are_every_rule_but_the_targets():
    """OWN_GOALS, the goals for which make reads no target ids, is every rule of the Makefile but the targets'
    (a rule left out of it reads the catalog for nothing; a target cannot be in it)."""
    text = (ROOT / "Makefile").read_text()
    own = set(re.search(r"^override OWN_GOALS := ((?:.*\\\n)*.*)$", text, re.M).group(1).replace("\\\n", " ").split())
    rules = {m.group(1) for m in re.finditer(r"^([a-z][-a-z]*):(?!=)", text, re.M)}
    assert own == rules and not own & set(catalog.catalog())


def test_a_make_of_its_own_commands_alone_reads_no_target_ids(tmp_path):
    py = tmp_path / "py"  # notes each call, then runs Python
    py.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    for goals, reads in ((["help"], False), (["-n", "tables", "check"], False), ([], True),
                         (["-n", "tables", "101-gpt2xl-dp1-gbs1-bf16"], True), (["-n", "slurm-101-gpt2xl-dp1-gbs1-bf16"], True)):
        (tmp_path / "calls").write_text("")
        _make(*goals, PY=str(py))
        assert ("-m megalab targets" in (tmp_path / "calls").read_text()) == reads, goals


def test_targets_come_from_the_catalog_block_style_entries_too(repo):
    chapter = repo / "configs" / "experiments" / "01-dp-zero2.yaml"
    chapter.write_text(chapter.read_text() + "\n  - id: 199-block-style\n    about: written block style\n"
                       "    model: gpt2-xl\n    gpus: 1\n    gbs: 1\n")
    out = _make("-pRrq", cwd=repo)
    assert re.search(r"^199-block-style:", out.stdout, re.M) and re.search(r"^101-gpt2xl-dp1-gbs1-bf16:", out.stdout, re.M)
    assert re.search(r"^slurm-199-block-style:", out.stdout, re.M)


def test_a_catalog_id_that_is_not_a_plain_name_is_refused_naming_file_and_entry(repo, tmp_path):
    mark = tmp_path / "ran"
    chapter = repo / "configs" / "experiments" / "01-dp-zero2.yaml"
    text = chapter.read_text()
    chapter.write_text(text.replace("- {id: 104-gpt2xl-dp4-gbs4,", f"- {{id: '104`touch {mark}`',", 1))
    assert "104`touch" in chapter.read_text()
    for goal in ("list", "104", "slurm-104", "help"):
        out = _make(goal, cwd=repo)
        assert not mark.exists(), goal
        if goal != "help":
            (line,) = [l for l in out.stderr.splitlines() if l.startswith("megalab:")]
            assert "configs/experiments/01-dp-zero2.yaml: entry 2 (id '104`touch" in line and "fix:" in line, line
            assert out.returncode == 2


@pytest.mark.parametrize("ident", ["101-gpt2xl", "a.b_c-1", "X9"])
def test_plain_ids_pass(ident):
    catalog.check_id({"id": ident}, ROOT / "configs" / "x.yaml", 1)


@pytest.mark.parametrize("ident", ["a b", "a;b", "$(x)", "`x`", "-x", ".x", "a'b", "a\nb", "", 101, None])
def test_other_ids_are_refused(ident):
    with pytest.raises(catalog.CatalogError, match=r"^configs/x\.yaml: entry 3 \(id .*\): .*; fix: ") as e:
        catalog.check_id({"id": ident}, ROOT / "configs" / "x.yaml", 3)
    assert "\n" not in str(e.value).replace(repr(ident), "")


# ---- make help and the header -------------------------------------------------------------------------

def test_help_lists_the_campaign_variables_strict_and_the_hook():
    out = _make("help").stdout
    for name in ("CHAPTER", "IDS", "STALE", "REPEATS", "BUDGET_S", "GPUS", "STRICT", "HOST", "PY"):
        assert re.search(rf"^  {name} +\S", out, re.M), name
    assert "DRY_RUN=1: what would run and about how long, GPUS=N: for N GPUs not here" in out
    assert re.search(r"^  PY .*the one hook", out, re.M) and "The one hook is PY" in out


def test_the_completion_note_counts_what_make_1_tab_lists():
    header = (ROOT / "Makefile").read_text().split("\n\n", 1)[0]
    count = int(re.search(r"`make 1<TAB>` lists chapter 1's (\d+)", header).group(1))
    assert count == sum(1 for t in catalog.catalog() if t.startswith("1"))


def test_the_makefile_repeats_the_tables_defaults():
    text = (ROOT / "Makefile").read_text()
    for name, default in re.findall(r"^([A-Z_]+) \?= ?(.*)$", text, re.M):
        assert str(variables.BY_NAME[name].default or "") == default, name


def test_no_make_reference_to_a_user_value_in_a_recipe():
    """Recipes read user values as "$$VAR"; a make reference is allowed only inside $(filter ...), whose
    result is a constant, or PY (the hook) and the Makefile's own."""
    text = (ROOT / "Makefile").read_text()
    recipes = "\n".join(l for l in text.splitlines() if l.startswith("\t"))
    recipes = re.sub(r"\$\(filter [^,]+,\$\((\w+)\)\)", "", recipes)
    user = {v.name for v in variables.VARIABLES} - {"PY"}
    used = set(re.findall(r"\$[({](\w+)[)}]", recipes)) & user
    assert not used, used


# ---- an OUTDIR inside the repository -----------------------------------------------------------------

def test_an_outdir_made_inside_the_repository_is_kept_out_of_git(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("outdir/\n")
    (repo / "mine").mkdir()
    for path in ("runs2/x", "outdir/y", "results/runs/z", "mine", "a b*/c", "runs2/v"):  # mine: the user's
        scratch.make_dir(repo / path, repo)
        (repo / path / "run.json").write_text("{}")
    scratch.make_dir(tmp_path / "elsewhere", repo)
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "-uall"], capture_output=True,
                            text=True).stdout.split("\n")
    assert sorted(l for l in status if l) == ["?? .gitignore", "?? mine/run.json", "?? results/runs/z/run.json"]
    exclude = (repo / ".git" / "info" / "exclude").read_text()
    assert exclude.count("/runs2/") == 1 and "outdir" not in exclude and not (repo / "runs2" / ".gitignore").exists()


def test_the_launcher_makes_its_outdir_through_scratch():
    from megalab.harness import launch

    assert "scratch.make_dir(outdir)" in Path(launch.__file__).read_text()


# ---- campaign, batch, slurm, docker -------------------------------------------------------------------

def test_a_campaign_without_gpus_says_to_use_gpus(monkeypatch, capsys):
    monkeypatch.setattr(campaign.monitor, "gpu_inventory", lambda: {"count": 0})
    monkeypatch.setenv("DRY_RUN", "1")
    assert campaign.cli([], environ={"CHAPTER": "1"}) == 0
    out = capsys.readouterr().out
    (line,) = [l for l in out.splitlines() if "GPUS=" in l]
    assert "no GPU here" in line and "DRY_RUN=1 GPUS=8 make campaign" in line
    monkeypatch.delenv("DRY_RUN")
    with pytest.raises(LaunchError, match=r"no GPU here .*; fix: .*DRY_RUN=1 GPUS=8 make campaign") as e:
        campaign.cli([], environ={"CHAPTER": "1"})
    assert "\n" not in str(e.value)
    monkeypatch.setenv("DRY_RUN", "1")
    assert campaign.cli([], environ={"CHAPTER": "1", "GPUS": "8"}) == 0
    assert "no GPU here" not in capsys.readouterr().out


def test_batch_goes_on_past_a_refused_target_and_needs_ids(monkeypatch, capsys):
    seen = []

    def run(target):
        seen.append(target)
        if target == "nope":
            raise catalog.CatalogError("unknown target 'nope'; fix: make list")
        return 1 if target == "oom" else 0

    monkeypatch.setattr(batch.launch, "run", run)
    # a refused id ends the batch in exit 2 after the runs it could do (issue 60); a run that failed is a result
    assert batch.cli([], environ={"IDS": "101 nope oom 111"}) == 2
    assert seen == ["101", "nope", "oom", "111"]
    captured = capsys.readouterr()
    assert "batch: 2 of 4 run(s) did not end ok" in captured.out and "megalab: unknown target 'nope'" in captured.err
    assert "1 of 4 target(s) refused" in captured.err and "(nope)" in captured.err
    assert batch.cli([], environ={"IDS": "101 oom"}) == 0
    with pytest.raises(LaunchError, match=r'no targets; fix: make batch IDS="101 111"'):
        batch.cli([], environ={"IDS": " "})


def test_batch_stops_at_a_killed_run(monkeypatch, capsys):
    seen = []

    def run(target):
        seen.append(target)
        raise SystemExit(143)  # what launch does after a signal ended the run

    monkeypatch.setattr(batch.launch, "run", run)
    with pytest.raises(SystemExit) as e:
        batch.cli([], environ={"IDS": "101 111 121"})
    assert e.value.code == 143 and seen == ["101"]
    assert "batch: stopped at 101 by a signal; 2 target(s) not started" in capsys.readouterr().out


def test_the_job_takes_from_the_submitting_shell_only_what_it_needs():
    env = {"PATH": "/bin", "HOME": "/h", "NCCL_SOCKET_IFNAME": "ib0", "HF_TOKEN": "t", "LC_ALL": "C",
           "MAKEFLAGS": "s -- OUTDIR=/x", "MAKELEVEL": "1", "MFLAGS": "-s", "OUTDIR": "/x", "ITERS": "5",
           "CUDA_VISIBLE_DEVICES": "0", "SECRET_THING": "s", "BASH_FUNC_f%%": "() { :; }", "A,B": "1"}
    assert slurm.job_env(env) == ["HF_TOKEN", "HOME", "LC_ALL", "NCCL_SOCKET_IFNAME", "PATH"]


def test_sbatch_runs_without_makes_variables(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\nenv > {tmp_path}/env\necho 'Submitted batch job 7'\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for k, v in {"MAKEFLAGS": "s -- OUTDIR=/elsewhere", "MAKELEVEL": "1", "SBATCH_EXPORT": "ALL"}.items():
        monkeypatch.setenv(k, v)
    assert slurm.submit("101", {"OUTDIR": str(tmp_path / "out"), "PATH": os.environ["PATH"]}) == 0
    seen = (tmp_path / "env").read_text()
    assert "MAKEFLAGS" not in seen and "MAKELEVEL" not in seen and "SBATCH_EXPORT" not in seen
    (job,) = (tmp_path / "out" / "slurm").iterdir()
    text = (job / "job.sbatch").read_text()
    assert "#SBATCH --export=PATH\n" in text and "\nunset MAKEFLAGS " in text and "srun --export=ALL " in text


def test_an_outdir_with_a_line_break_is_refused_before_any_script(tmp_path):
    with pytest.raises(LaunchError, match="line break.*; fix: ") as e:
        slurm.submit("101", {"OUTDIR": str(tmp_path / "a\nb"), "DRY_RUN": "1"})
    assert "\n" not in str(e.value).replace(str(tmp_path / "a\nb"), "") and not (tmp_path / "a\nb").exists()


def test_docker_run_refuses_an_outdir_with_a_colon(tmp_path):
    with pytest.raises(LaunchError, match="holds a ':'.*; fix: "):
        docker.argv({"OUTDIR": str(tmp_path / "a:/etc")}, tty=False)


@pytest.mark.parametrize("flags", [[], ["-e"]])
def test_the_makefiles_own_variables_cannot_be_swapped_for_code(tmp_path, flags):
    """make -e puts the environment over the Makefile's assignments: its own variables are override."""
    names = ["TARGETS", "quote", "literal", "HAVE_GPU", "VARIABLES", "MCORE_VERSION", "MAKE", "MAKE_COMMAND",
             "SHELL", ".SHELLFLAGS", "VENV"]
    env = {n: f"$(shell touch {tmp_path / n})" for n in names}
    for goal in ("help", "101"):
        _make(*flags, goal, **env, DRY_RUN="1")
    without_py = {k: v for k, v in os.environ.items() if k not in variables.BY_NAME}  # PY computed here
    subprocess.run(["make", "-s", *flags, "which-python"], cwd=ROOT, capture_output=True, env={**without_py, **env})
    assert not list(tmp_path.iterdir())
