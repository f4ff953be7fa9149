"""Hostile values through every make entry point: nothing a user sets is ever run as code (issue 31).

Every variable of megalab/core/variables.py (the Makefile's list, so a new variable is covered by
itself), PY aside (the one hook: a command by design), gets a hostile value in each make call below:
make syntax ($(shell ...), $$(...), ${shell ...}, $(file ...), $(eval ...)), shell syntax ($(...),
backticks, ;, &&, |, a newline) or a quote breakout (' " \\). Each value names its own marker file,
which exists only if something (make, a recipe's shell, the launcher, an sbatch script on a node,
docker-run) ran it. The values go in as make arguments and through the environment (also under
make -e, and inside a parent make's MAKEFLAGS, as sbatch once carried it to every node), to every
entry point: help, list, a dry run, show-command, profile, slurm (a dry run, and a submission whose
script runs as a node would, under a fake sbatch and srun), docker-build and docker-run (a fake
docker), campaign and batch (dry runs), tables, check, compare, clean, quickstart (and make -n
quickstart), show-arguments, tensorboard, prepare-data, bench, which-python and an unknown goal. The
PY that make starts records its argv and environment first: every value must arrive there verbatim.

Each entry runs twice per channel: every variable hostile (most are refused in one line, early), and
"deep": the numbers, choices and flags valid, and the few strings the launcher checks before it plans
(VALIDATED), so that the rest reach the plan, the sbatch script, the docker argv. All of it runs in a
copy of the repository (pages rewritten, OUTDIR values made into folders there). The audit's figures,
tried and executed, print at the end (pytest -s shows them).
"""
import collections
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import megatron_verdict
from megalab.core import variables

ROOT = Path(__file__).resolve().parent.parent
HOOKS = {"PY"}  # a command by design: the Makefile's header and `make help` say so
NAMES = [v.name for v in variables.VARIABLES if v.name not in HOOKS]
# Checked by the launcher before it plans (refused in one line, as the all-hostile calls show): valid in
# the deep calls, so that the other values get as far as the plan, the script, the docker argv.
VALIDATED = {"GPU", "GPU_MEM_GB", "FAST", "LOAD"} | {v.name for v in variables.VARIABLES if v.pattern}  # SPLIT, MASTER_ADDR: a shape
TEXT = {"str", "path", "words"}  # the types whose values the launcher takes as they are (not numbers, choices, flags)
DEEP = [v.name for v in variables.VARIABLES
        if getattr(v.type, "__name__", str(v.type)).lower() in TEXT and v.name not in HOOKS | VALIDATED]
WORD_LISTS = {v.name for v in variables.VARIABLES if "shlex" in v.help}  # split as shell words, by design


def payloads(m: str) -> list[tuple[str, str]]:
    """(kind, value): each value touches the marker file m if anything ever runs it."""
    return [("make", f"$(shell touch {m})"), ("make", f"$$(shell touch {m})"), ("make", f"${{shell touch {m}}}"),
            ("make", f"$(file >{m},x)"), ("make", f"$(eval $$(shell touch {m}))"),
            ("shell", f"$(touch {m})"), ("shell", f"`touch {m}`"), ("shell", f"x; touch {m}"),
            ("shell", f"x && touch {m}"), ("shell", f"x | touch {m}"), ("shell", f"x\ntouch {m}"),
            ("quote", f"'; touch {m}; '"), ("quote", f'"; touch {m}; "'), ("quote", f"\\'; touch {m} #"),
            ("quote", f'\\"; touch {m} #'), ("quote", f'"$(touch {m})"'), ("quote", f"x\\\ntouch {m}")]


KINDS = len(payloads("m"))
AUDIT: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
HITS: list[str] = []


class Env:
    """The copy of the repository, its fakes and the make call that audits one set of values."""

    def __init__(self, base: Path):
        self.base = base
        self.repo = base / "repo"
        shutil.copytree(ROOT, self.repo, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "outdir", ".pytest_cache", "*.egg-info", "tests"))
        shutil.copytree(ROOT / "tests" / "fixtures", self.repo / "tests" / "fixtures")
        self.bin = base / "bin"
        self.bin.mkdir()
        self.rec = base / "rec"
        self.calls = 0
        py = sys.executable
        # PY: notes its argv and environment, then runs Python (REC_ONLY=1: only notes, for the recipes
        # whose Python would need a GPU, the network or TensorBoard)
        self.recorder = self._script("py", f"""\
            #!{py}
            import json, os, sys, time
            if os.environ.get("REC_DIR"):
                with open(os.path.join(os.environ["REC_DIR"], f"{{time.time_ns()}}-{{os.getpid()}}.json"), "w") as f:
                    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
            if os.environ.get("REC_ONLY") == "1":
                sys.exit(0)
            os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
            """)
        self._script("docker", f"#!{py}\nimport json, os, sys\n"
                     f"json.dump(sys.argv[1:], open({str(base / 'docker.json')!r}, 'w'))\n")
        # a parent make: what it puts in MAKEFLAGS for the command-line values it was given
        (base / "parent.mk").write_text(
            "$(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $v)),$(eval override $v := $$(value $v))))\n"
            "dump: ; @printf '%s' \"$$MAKEFLAGS\"\n")

    def _script(self, name: str, text: str) -> Path:
        path = self.bin / name
        path.write_text(textwrap.dedent(text))
        path.chmod(0o755)
        return path

    def hostile(self, names, marks: Path, offset: int, quote_word_lists: bool = False) -> dict[str, str]:
        out = {}
        for i, name in enumerate(names):
            k = (i + offset) % KINDS
            value = payloads(str(marks / f"{name}.{k}"))[k][1]
            out[name] = shlex.quote(value) if quote_word_lists and name in WORD_LISTS else value
        return out

    def base_env(self, **extra) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in variables.BY_NAME and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES",
                                                           "GNUMAKEFLAGS", "MAKEFILES", "REC_ONLY")}
        env.update(PY=str(self.recorder), PATH=f"{self.bin}:{os.environ['PATH']}", REC_DIR=str(self.rec), **extra)
        return env

    def parent_makeflags(self, values: dict[str, str]) -> str:
        out = subprocess.run(["make", "-s", "-f", str(self.base / "parent.mk"), "dump",
                              *(f"{k}={v}" for k, v in values.items())], capture_output=True, text=True, check=True)
        return out.stdout

    def make(self, entry: str, goal: list[str], values: dict[str, str], channel: str, marks: Path,
             valid: dict[str, str] | None = None, extra: dict[str, str] | None = None, timeout: int = 300):
        """One audited make call: (the CompletedProcess, the PY records but the target list's)."""
        shutil.rmtree(self.rec, ignore_errors=True)
        self.rec.mkdir()
        env = self.base_env(**(valid or {}), **(extra or {}))
        argv = ["make", "-s", *goal]
        if channel == "argument":
            argv += [f"{k}={v}" for k, v in values.items()]
        elif channel in ("environment", "environment, make -e"):
            env.update(values)
            if channel.endswith("-e"):
                argv.insert(1, "-e")
        elif channel == "parent make's MAKEFLAGS":
            env["MAKEFLAGS"] = self.parent_makeflags(values)
        out = subprocess.run(argv, cwd=self.repo, env=env, capture_output=True, text=True, timeout=timeout)
        hit = sorted(p.name for p in marks.iterdir()) if marks.exists() else []
        AUDIT[entry]["tried"] += len(values)
        AUDIT[entry]["executed"] += len(hit)
        AUDIT[entry]["calls"] += 1
        HITS.extend(f"{entry} ({channel}): {h}" for h in hit)
        if "Traceback (most recent call last)" in out.stderr:
            AUDIT[entry]["tracebacks"] += 1
        records = [json.loads(p.read_text()) for p in sorted(self.rec.glob("*.json"))]
        return out, [r for r in records if r["argv"][:3] != ["-m", "megalab", "targets"]]

    def marks(self) -> Path:
        self.calls += 1
        path = self.base / "marks" / str(self.calls)
        path.mkdir(parents=True)
        return path


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return Env(tmp_path_factory.mktemp("payloads"))


SET_BY_RECIPE = {"quickstart": {"DRY_RUN"}}  # its no-GPU branch shows a dry run, whatever DRY_RUN says


def _verbatim(records, values, channel, entry=""):
    """Every value reached the Python make started exactly as sent (make took it as its text)."""
    for rec in records:
        for k, v in values.items():
            if k in SET_BY_RECIPE.get(entry, ()):
                continue
            assert rec["env"].get(k) == v, f"{k} changed on its way ({channel}): {rec['env'].get(k)!r} != {v!r}"


# (entry, make arguments, the valid values of its deep call (None: no deep call), more environment)
ENTRIES = [
    ("help", ["help"], None, {}),
    ("list", ["list"], None, {}),
    ("which-python", ["which-python"], None, {}),
    ("run, dry", ["101-gpt2xl-dp1-gbs1-bf16"], {"DRY_RUN": "1"}, {}),
    ("profile, dry", ["profile-101"], None, {}),
    ("unknown goal", ["999-no-such-target"], None, {}),
    ("show-command", ["show-command"], {"ID": "101"}, {}),
    ("slurm, dry", ["slurm-101-gpt2xl-dp1-gbs1-bf16"], {"DRY_RUN": "1"}, {}),
    ("docker-build", ["docker-build"], None, {}),
    ("docker-run", ["docker-run"], {}, {}),
    ("campaign, dry", ["campaign"], {"DRY_RUN": "1", "IDS": "101 111"}, {}),
    ("batch, dry", ["batch"], {"DRY_RUN": "1", "IDS": "101"}, {}),
    ("tables", ["tables"], None, {}),
    ("check", ["check"], None, {}),
    ("compare", ["compare"], None, {}),
    ("clean", ["clean"], None, {}),
    ("quickstart", ["quickstart"], None, {}),
    ("make -n quickstart", ["-n", "quickstart"], None, {}),
    ("show-arguments", ["show-arguments"], None, {"REC_ONLY": "1"}),
    ("tensorboard", ["tensorboard"], None, {"REC_ONLY": "1"}),
    ("prepare-data", ["prepare-data"], None, {"REC_ONLY": "1"}),
    ("bench", ["bench"], None, {"REC_ONLY": "1"}),
]
CHANNELS = ["argument", "environment"]


@pytest.mark.parametrize("entry,goal,valid,extra", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_no_value_runs_as_code(env, entry, goal, valid, extra):
    calls = [(c, NAMES, None) for c in CHANNELS]
    if valid is not None:  # one channel will do: make took both channels' values as text above
        calls += [(CHANNELS[len(entry) % 2], [n for n in DEEP if n not in valid], valid)]
    if entry in ("help", "list"):  # make's other ways in: -e, and a parent make's MAKEFLAGS
        calls += [("environment, make -e", NAMES, None), ("parent make's MAKEFLAGS", NAMES, None)]
    for n, (channel, names, ok) in enumerate(calls):
        marks = env.marks()
        values = env.hostile(names, marks, offset=env.calls + n, quote_word_lists=ok is not None)
        out, records = env.make(entry, goal, values, channel, marks, valid=ok, extra=extra)
        assert not list(marks.iterdir()), f"{entry} ({channel}) ran {sorted(os.listdir(marks))}:\n{out.stderr[-2000:]}"
        _verbatim(records, values, channel, entry)
        if entry not in ("clean", "docker-build", "unknown goal") and not entry.startswith("make -n"):
            assert records, f"{entry} ({channel}): make never started PY:\n{out.stderr[-2000:]}"


def test_the_deep_calls_get_past_the_checks(env):
    """The deep calls are worth their name: the plan is built and printed, values in it verbatim."""
    marks = env.marks()
    values = env.hostile([n for n in DEEP if n != "ID"], marks, offset=0, quote_word_lists=True)
    out, _ = env.make("show-command", ["show-command"], values, "environment", marks,
                      valid={"ID": "101", "SPLIT": "98,2,0"})
    argv = shlex.split(out.stdout)
    assert argv and argv[0] == "torchrun" and values["DATA"] in argv and "98,2,0" in argv, out.stderr[-3000:]
    assert shlex.split(values["EXTRA_ARGS"])[0] in argv


def test_docker_run_gets_the_values_as_argv_items(env):
    marks = env.marks()
    names = [n for n in DEEP if n.startswith("DOCKER_") or n == "OUTDIR"]
    values = env.hostile(names, marks, offset=3, quote_word_lists=True) | {"OUTDIR": str(env.base / "o $(x)")}
    out, _ = env.make("docker-run", ["docker-run"], values, "argument", marks)
    assert out.returncode == 0, out.stderr
    argv = json.loads((env.base / "docker.json").read_text())
    assert f"{env.base / 'o $(x)'}:/outdir" in argv and "--shm-size=16g" in argv  # DOCKER_SHM: a size, checked
    i = argv.index(values["DOCKER_IMAGE"])
    assert argv[i - 1] == shlex.split(values["DOCKER_ARGS"])[-1] and argv[i + 1:] == shlex.split(values["DOCKER_CMD"])
    assert not list(marks.iterdir())


def test_slurm_job_runs_as_nodes_with_their_own_outdir_and_the_values_verbatim(env):
    """make slurm-<id> VAR=... submits (a fake sbatch runs the job as Slurm would: only the script's
    --export names, SLURM_*; a fake srun runs its command once per node). Each node's make must start the
    launcher with its own OUTDIR and the submission's values as sent: the submitting make's MAKEFLAGS (its
    command line, OUTDIR included) reaches neither sbatch nor a node."""
    py, d, channel = sys.executable, env.base / "slurm", "argument"
    d.mkdir()
    env._script("sbatch", f"""\
        #!{py}
        import json, os, subprocess, sys
        d = {str(d)!r}
        json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, open(os.path.join(d, "sbatch.json"), "w"))
        script = sys.argv[-1]
        names = next(l.strip().split("=", 1)[1] for l in open(script) if l.startswith("#SBATCH --export="))
        job = {{k: os.environ[k] for k in ([] if names == "NIL" else names.split(",")) if k in os.environ}}
        job.update(SLURM_NNODES="2", SLURM_JOB_NODELIST="node-[a-b]", SLURM_JOB_ID="42", SLURM_CPUS_ON_NODE="2",
                   SLURM_EXPORT_ENV=names)
        json.dump(job, open(os.path.join(d, "job.json"), "w"))
        subprocess.run(["bash", script], env=job, cwd=d)
        print("Submitted batch job 42")
        """)
    env._script("srun", f"""\
        #!{py}
        import json, os, subprocess, sys
        opts, cmd = sys.argv[1:-3], sys.argv[-3:]
        job = dict(os.environ)
        if "--export=ALL" not in opts:  # srun takes sbatch's --export from SLURM_EXPORT_ENV
            keep = job.get("SLURM_EXPORT_ENV", "").split(",")
            job = {{k: v for k, v in job.items() if k in keep or k.startswith("SLURM_")}}
        json.dump(opts, open(os.path.join({str(d)!r}, "srun.json"), "w"))
        for node in range(int(job["SLURM_NNODES"])):  # the node's own PY: one that notes what it got
            subprocess.run(cmd, env={{**job, "SLURM_NODEID": str(node), "PY": {str(env.recorder)!r},
                                     "REC_DIR": {str(env.rec)!r}, "REC_ONLY": "1"}})
        """)
    env._script("scontrol", "#!/bin/sh\necho node-a\necho node-b\n")
    marks = env.marks()
    # Megatron's check at submission loads the tokenizer and parses EXTRA_ARGS: those get values it takes
    names = [n for n in DEEP if n not in ("OUTDIR", "DATA", "TOKENIZER_MODEL", "VOCAB_FILE", "MERGE_FILE")]
    values = env.hostile(names, marks, offset=5, quote_word_lists=True)
    values["EXTRA_ARGS"] = f"--data-cache-path {values['EXTRA_ARGS']}"
    values["OUTDIR"] = str(d / "out; $(touch x)")  # no line break: one an #SBATCH line cannot hold is refused
    megatron_verdict("slurm-128-gpt2xl-dp8-gbs128-zero2", {**values, "GPUS_PER_NODE": "4"})  # speed only (conftest)
    out, records = env.make("slurm, submitted", ["slurm-128-gpt2xl-dp8-gbs128-zero2"], values, channel, marks,
                            valid={"GPUS_PER_NODE": "4"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert not list(marks.iterdir())
    sbatch = json.loads((d / "sbatch.json").read_text())
    job_env = json.loads((d / "job.json").read_text())
    for make_var in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        assert make_var not in sbatch["env"] and make_var not in job_env, make_var
    assert not set(job_env) & set(variables.BY_NAME)  # the make variables travel in the script, quoted
    assert "--export=ALL" in json.loads((d / "srun.json").read_text())
    (job,) = (Path(values["OUTDIR"]) / "slurm").iterdir()
    runs = [r for r in records if r["argv"][:3] == ["-m", "megalab", "run"]]
    assert sorted(r["env"]["OUTDIR"] for r in runs) == [f"{job}/node0", f"{job}/node1"]
    for r in runs:
        assert "=" not in r["env"].get("MAKEFLAGS", ""), r["env"]["MAKEFLAGS"]  # no command line of the submitter
        for k in variables.FORWARDED:
            if k in values:
                assert r["env"][k] == values[k], k


# Issue 60's second round through make itself: a bad value is refused in one line naming it, with its fix and a
# non-zero exit, never a traceback; batch refuses an unknown id after the runs it could do (their plans printed).
SECOND_ROUND = [
    ("batch, an unknown id beside a good one", ["batch"], {"DRY_RUN": "1", "IDS": "999-nope 101"}, "999-nope"),
    ("docker-run, DOCKER_SHM not a size", ["docker-run"], {"DOCKER_SHM": "abc"}, "DOCKER_SHM=abc"),
    ("docker-run, DOCKER_SHM out of range", ["docker-run"], {"DOCKER_SHM": "2t"}, "DOCKER_SHM=2t"),
    ("docker-run, DOCKER_SHM with a command", ["docker-run"], {"DOCKER_SHM": "16g --privileged"}, "DOCKER_SHM="),
    ("a target, ITERS past its bound", ["101-gpt2xl-dp1-gbs1-bf16"], {"DRY_RUN": "1", "ITERS": "9" * 23}, "ITERS="),
    ("a target, a watchdog of 1e300 s", ["101-gpt2xl-dp1-gbs1-bf16"], {"DRY_RUN": "1", "WATCHDOG_SILENT_S": "1e300"},
     "WATCHDOG_SILENT_S="),
    ("a target, micro-batch 0 in EXTRA_ARGS", ["101-gpt2xl-dp1-gbs1-bf16"],
     {"DRY_RUN": "1", "EXTRA_ARGS": "--micro-batch-size 0"}, "--micro-batch-size 0"),
    ("a target, no attention heads in EXTRA_ARGS", ["101-gpt2xl-dp1-gbs1-bf16"],
     {"DRY_RUN": "1", "EXTRA_ARGS": "--num-attention-heads 0"}, "--num-attention-heads 0"),
]


def test_the_second_rounds_values_are_refused_in_one_line(env):
    megatron_verdict("101-gpt2xl-dp1-gbs1-bf16")  # speed only: batch's dry run of 101 (conftest)
    env.rec.mkdir(exist_ok=True)  # where the PY that make starts notes its argv
    offenders = []
    for name, goal, values, needle in SECOND_ROUND:
        out = subprocess.run(["make", "-s", *goal, *(f"{k}={v}" for k, v in values.items())], cwd=env.repo,
                             env=env.base_env(), capture_output=True, text=True, timeout=300)
        lines = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("make")]
        said = [ln for ln in lines if needle in ln and "fix" in ln]
        if out.returncode == 0 or "Traceback" in out.stderr or not said or (goal != ["batch"] and len(lines) != 1):
            offenders.append(f"{name}: exit {out.returncode}, stderr {out.stderr[-600:]!r}")
        if goal == ["batch"] and "torchrun --standalone" not in out.stdout:  # 101 ran (dry) after 999-nope's refusal
            offenders.append(f"{name}: no plan of 101 printed: {out.stdout[-600:]!r}")
    assert not offenders, "\n".join(offenders)


def test_zz_audit(capsys):
    """The closing figures: hostile values tried and executed, per entry point (PY, the hook, aside)."""
    tried = sum(c["tried"] for c in AUDIT.values())
    executed = sum(c["executed"] for c in AUDIT.values())
    with capsys.disabled():
        print(f"\nmake payload audit: {tried} hostile values tried in {sum(c['calls'] for c in AUDIT.values())} make "
              f"calls through {len(AUDIT)} entry points ({len(NAMES)} variables x {KINDS} payloads, rotated; "
              f"hooks aside: {', '.join(sorted(HOOKS))}): {executed} executed")
        for entry, c in AUDIT.items():
            print(f"  {entry:<22} {c['calls']:>3} calls {c['tried']:>5} values {c['executed']:>3} executed"
                  + (f"  ({c['tracebacks']} call(s) ended in a traceback)" if c["tracebacks"] else ""))
    assert executed == 0, HITS
