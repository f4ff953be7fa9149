# megalab: one make target per experiment. `make list` shows them; `make <TAB>` completes them.
#
#   make 101-gpt2xl-dp1-gbs1-bf16            run it (a GPU run, ends as a row in results/)
#   DRY_RUN=1 make 128-gpt2xl-dp8-gbs128-zero2   print the preflight and the exact torchrun command
#   make show-command ID=101                  the torchrun command alone
#
# Variables: set them in the environment (ITERS=20 make 101), or as make arguments. Their one table
# is megalab/core/variables.py; `make help` prints it. Every value is data: make takes it as its
# text (no make function in it runs), recipes read it from the environment as one quoted word, and
# the launcher builds argv without a shell. The one hook is PY, the Python command every target
# runs: a command by design. Some values name code to run, as named and never as shell text:
# MEGATRON_LM's pretrain_gpt.py, VENV's Python, DOCKER_CMD in the container. make's own hooks stay
# make's: MAKEFLAGS, GNUMAKEFLAGS, MAKEFILES and MAKEOVERRIDES in the environment, and NAME:= or
# NAME!= on the command line, are evaluated by make before it reads this file.
#
# Tab completion (bash-completion; the docker image has it): `make 1<TAB>` lists chapter 1's 17
# targets, `make 101<TAB>` completes 101-gpt2xl-dp1-gbs1-bf16. Elsewhere: install bash-completion
# (apt install bash-completion; macOS: brew install bash-completion@2) and source it from ~/.bashrc
# (. /usr/share/bash-completion/bash_completion); zsh completes make targets by itself.

# ---- every value as its text ----------------------------------------------------------------------
# The variables of megalab/core/variables.py, in its order (tests/test_plan.py checks this line).
override VARIABLES := ITERS WARMUP GPU_MEM_GB GPU DRY_RUN OUTDIR SPEC TE FAST CUDA_GRAPH EXTRA_ARGS MEGATRON_LM VERBOSE SAVE SAVE_INTERVAL LOAD WANDB WANDB_PROJECT WANDB_ENTITY DATA TOKENIZER_MODEL SPLIT VOCAB_FILE MERGE_FILE NNODES NODE_RANK MASTER_ADDR MASTER_PORT ALLOW_BUSY_GPUS WATCHDOG_SILENT_S WATCHDOG_STARTUP_S EXIT_GRACE_S GPUS_PER_NODE SBATCH_ARGS SRUN_ARGS DOCKER_IMAGE DOCKER_SHM DOCKER_ARGS DOCKER_CMD IDS CHAPTER STALE REPEATS BUDGET_S GPUS STRICT ID GREP PORT HOST BENCH_ARGS DATA_SOURCE TOKENIZER DATA_PREFIX WORKERS LIMIT_DOCS FORCE VENV TORCH_SPEC PY
# make expands a variable set on its command line or in the environment wherever it reads one (an
# export to a recipe included, even `make help`'s): `ITERS=$(shell ...)` would run. First, before
# anything reads them, each of these and every command-line variable becomes its own text, once (a
# `:=` of `$(value ...)` expands nothing inside), and stays exported as make would export it.
override literal = $(eval override $(1) := $$(value $(1)))$(eval export $(1))
$(foreach v,$(VARIABLES),$(if $(filter environment%,$(origin $v)),$(call literal,$v)))
$(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $v)),$(call literal,$v)))
# What the Makefile itself defines is `override`, so that `make -e` (the environment over the
# Makefile) cannot swap code in; $(MAKE) is make's own path, one quoted word.
override SHELL := /bin/bash
override .SHELLFLAGS := -c
override MAKE := '$(subst ','\'',$(value MAKE_COMMAND))'
MAKEFLAGS += -r
.SUFFIXES:
.DEFAULT_GOAL := help

# A make value as one shell word: single-quoted, its own single quotes escaped.
override quote = '$(subst ','\'',$(1))'

VENV ?= .venv
# The Python of every target. .venv is the test venv (`make test`, `make setup`, the no-GPU quickstart):
# it may hold a CPU build of torch, so it is used only where no GPU is visible (nvidia-smi -L fails),
# never on a GPU machine or in `make docker-run` (repo mounted), where python3 brings the CUDA torch
# and Transformer Engine of the system or NGC image. PY=... always wins; `make which-python` and every
# preflight say which Python and torch a run uses.
ifeq ($(PY),)
override HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
override PY := $(if $(HAVE_GPU),python3,$(if $(wildcard $(VENV)/bin/python),$(call quote,$(VENV)/bin/python),python3))
endif

# Target ids, from the catalog (core/catalog.py holds each id to a plain name: letters, digits, . _ -), read
# where a goal may be one: not for a make of this file's own commands alone (OWN_GOALS, every rule below
# but the targets; tests/test_makefile.py holds the list to the rules), which never names a target. No goal
# at all (`make`, tab completion's `make -pq`) reads them too.
override OWN_GOALS := help list which-python show-command batch campaign docker-found docker-build docker-run \
    setup test quickstart quickstart-python tables compare transcript bench bench-report plots check prepare-data clean \
    monitor-gpu tensorboard show-arguments count-arguments
# `make help FAST` (any make variable): the words after help are topics, not goals: that variable's reference
# (FAST: the lever table, docs/levers.md). make builds them as goals too, each a no-op.
override HELP_TOPICS := $(if $(filter help,$(MAKECMDGOALS)),$(filter-out help,$(MAKECMDGOALS)))
override TARGETS := $(if $(filter-out $(OWN_GOALS) $(HELP_TOPICS),$(or $(MAKECMDGOALS),.no-goal)),$(shell $(PY) -m megalab targets 2>/dev/null))


.PHONY: help list setup test quickstart tables compare check transcript clean batch campaign $(TARGETS)

help:
ifneq ($(HELP_TOPICS),)
	@exec $(PY) -m megalab variables $(foreach t,$(HELP_TOPICS),$(call quote,$t))
else
	@awk '!/^#/ {exit} {sub(/^# ?/, ""); print}' Makefile
	@echo
	@echo "Everyday commands:"
	@sed -n 's/^#> /  make /p' Makefile
	@echo
	@$(PY) -m megalab variables 2>/dev/null || echo "Variables: see megalab/core/variables.py"
endif

#> help FAST               one variable's reference (FAST: every fast-path lever, where it is on, its evidence)
#> list                    every target: id, GPUs, what it shows
#> show-command ID=<id>    the exact torchrun command of a target (profile-<id> too)
#> quickstart              the first run (on a CPU: a plan and the tables)
#> test                    the CPU test suite
#> tables                  rebuild results/*.md (+ a CSV per chapter, results/README.md) and results/data/README.md from the run records (STRICT=1: refuse rows not of today's code/defaults)
#> compare                 your runs (OUTDIR=outdir) beside the committed ones -> OUTDIR/compare/results/ (results/ untouched)
#> transcript              rewrite results/quickstart/transcript.txt where any machine can (GPU-only sections stay, labelled)
#> check                   the papers' scaling claims against the records (STRICT=1: fails on a FAIL or verdict no page explains)
#> plots                   redraw results/plots/*.svg (make tables does it too)
#> bench                   stock local spec vs megalab's spec on one GPU -> results/bench/README.md
#> bench-report            rebuild results/bench/README.md from the committed bench runs
#> prepare-data            tokenize a corpus for DATA=... runs
#> batch IDS="101 111"     several targets in a row, past failures (a kill of make ends the run in flight as killed)
#> campaign CHAPTER=1      a chapter's rows that fit here, REPEATS=3 times each, pass after pass (IDS=, STALE=1, BUDGET_S=; DRY_RUN=1: what would run and about how long, GPUS=N: for N GPUs not here)
#> profile-<id>            a target with Megatron's timers and a torch profiler trace (Perfetto)
#> resume-<id>             train ITERS/2, checkpoint, resume to ITERS, check the loss continues
#> monitor-gpu             live GPU view (nvitop if installed, else nvidia-smi -l 1)
#> tensorboard             serve OUTDIR in TensorBoard on 127.0.0.1:6006 (HOST=0.0.0.0: every interface; PORT=)
#> show-arguments          every Megatron flag of the installed version, by group (GREP=ckpt)
#> count-arguments         how many Megatron flags, per group
#> slurm-<id>              write and submit an sbatch script: one torchrun per node (GPUS_PER_NODE=8; DRY_RUN=1: write only)
#> docker-build            build the NGC-based image (docker/Dockerfile)
#> docker-run              a shell in it with the GPUs, the repo mounted (DOCKER_CMD=... to run one command)
#> setup                   .venv for tests (system torch if importable, else CPU torch) and megatron-core
#> which-python            the Python make runs targets with, and its torch
#> clean                   remove outdir/ and caches; never results/

$(HELP_TOPICS):
	@:

list:
	@$(PY) -m megalab list

.PHONY: which-python
which-python:
	@$(PY) -m megalab python

.PHONY: show-command
show-command:
	@[ -n "$$ID" ] || { echo 'show-command: set ID, e.g. make show-command ID=101' >&2; exit 2; }
	@$(PY) -m megalab show-command "$$ID"

$(TARGETS):
	@exec $(PY) -m megalab run '$@'

# batch and campaign run their launches in one Python that make starts in place of the shell (exec):
# a signal to make reaches the run in flight, which ends `killed`, and no further launch starts
# (megalab/harness/makeparent.py).
# Several targets in one go (IDS="101 111 ..."), going on past failures: an OOM row is a result too.
batch:
	@exec $(PY) -m megalab batch

# One measurement campaign on this machine (megalab/harness/campaign.py): CHAPTER=, IDS= or STALE=1, REPEATS=3, BUDGET_S=.
campaign:
	@exec $(PY) -m megalab campaign

# ---- beyond one node: SLURM (megalab/harness/slurm.py). GPUS_PER_NODE (8) sets the nodes; SBATCH_ARGS
# (e.g. '--partition=gpu --time=1:00:00') go to sbatch, SRUN_ARGS (e.g. pyxis' --container-image) to srun.
$(addprefix slurm-,$(TARGETS)): slurm-%:
	@exec $(PY) -m megalab slurm '$*'

# ---- docker/Dockerfile: NGC PyTorch (Transformer Engine included) + megalab. docker-run's argv is
# built by megalab/harness/docker.py (the repo mounted over the image's copy, OUTDIR at /outdir,
# DOCKER_ARGS and DOCKER_CMD split as shell word lists): no value passes through a shell.
DOCKER_IMAGE ?= megalab
.PHONY: docker-build docker-run
docker-found:
	@command -v docker >/dev/null || { echo "make: docker not found; fix: install Docker and the NVIDIA Container Toolkit" >&2; exit 2; }
docker-build: docker-found
	docker build -f docker/Dockerfile -t "$$DOCKER_IMAGE" .
docker-run: docker-found
	@exec $(PY) -m megalab docker-run

# Anything else is not a target: let the catalog say so (with the closest ids) instead of make.
.DEFAULT:
	@$(PY) -m megalab $(if $(filter slurm-%,$@),slurm,run) $(call quote,$(@:slurm-%=%))

# ---- set-up on a CPU machine (CI, laptops): a venv with CPU torch and megatron-core 0.19.2 -------
# megatron-core 0.17+ declares Python >= 3.12 and ships cp312 wheels only; its source imports on
# 3.11 (megalab/_compat.py supplies typing.override), so it is installed from the sdist there.
TORCH_SPEC ?= torch==2.13.0
override MCORE_VERSION := 0.19.2
# --system-site-packages: a torch (and TE) the system already has (NGC, GPU rigs) is the one the venv
# uses, never replaced by a CPU build; only where none is importable does a CPU torch go in. The stamp
# is checked in the recipe, not named as a make target: a target name is make syntax, VENV is text.
# triton stays, on a CPU too: megatron.training imports it unguarded (megatron/core/transformer/moe/ops/paged_stash.py);
# it depends on nothing, so its gigabyte unpacks beside torch's, in a pip of its own.
# Bytecode: where PYTHONDONTWRITEBYTECODE is set (CI) no import writes it later, and each process would compile
# torch from source (a fresh `make test` 4m30 -> 6m without it). pip compiles one file at a time, so the installs
# skip it and compileall does it once at the end on every core, leaving out what no megalab process imports: the
# packages' own test suites, pip, fontTools and transformers' model folders (its tokenizers, auto and gpt2 stay).
.PHONY: setup test
setup:
	@[ "$$VENV/.stamp" -nt pyproject.toml ] && exit 0; \
	command -v python3 >/dev/null || { echo "setup: python3 not found; fix: install Python 3.10+" >&2; exit 2; }; \
	set -ex; \
	python3 -m venv --system-site-packages "$$VENV"; \
	set --; "$$VENV/bin/python" -c "import torch" 2>/dev/null || set -- "$$TORCH_SPEC"; \
	"$$VENV/bin/pip" install -q --no-compile --no-deps triton & triton=$$!; \
	"$$VENV/bin/pip" install -q --no-compile "$$@" numpy pybind11 setuptools wheel typing_extensions packaging; \
	wait $$triton; \
	"$$VENV/bin/pip" install -q --no-compile --no-build-isolation --no-deps --ignore-requires-python megatron-core==$(MCORE_VERSION); \
	"$$VENV/bin/pip" install -q --no-compile --no-build-isolation -e '.[dev,data]'; \
	"$$VENV/bin/python" -m compileall -q -j 0 -x '/tests?/|/transformers/models/(?!auto/|gpt2/)|/site-packages/(pip|fontTools)/' "$$VENV/lib" >/dev/null || true; \
	touch "$$VENV/.stamp"

# pytest-xdist: one worker per core (tests/conftest.py keeps the input audit on one of them, first)
test: setup
	"$$VENV/bin/python" -m pytest -q -n auto --dist loadgroup tests

# The first run: on a GPU the smallest chapter-1 experiment; without one, its plan and the tables
# (torch-free: the base dependencies do; `make setup` only where PY lacks them). The setup check is a
# line of its own: make runs a $(MAKE) line even under -n, and it alone.
quickstart: quickstart-python
	@if nvidia-smi -L >/dev/null 2>&1; then \
	    ITERS=$${ITERS:-20} exec $(PY) -m megalab run 101-gpt2xl-dp1-gbs1-bf16; \
	else \
	    echo "quickstart: no GPU found (nvidia-smi -L failed): showing the plan of 101 and the committed results"; \
	    if $(PY) -c "import yaml, pandas, matplotlib" 2>/dev/null; then py=($(PY)); else py=("$$VENV/bin/python"); fi; \
	    DRY_RUN=1 "$${py[@]}" -m megalab run 101-gpt2xl-dp1-gbs1-bf16 && \
	    "$${py[@]}" -m megalab tables && \
	    echo "tables rebuilt: see results/01-dp-zero2.md"; \
	fi
quickstart-python:
	@nvidia-smi -L >/dev/null 2>&1 || $(PY) -c "import yaml, pandas, matplotlib" 2>/dev/null || \
	    $(MAKE) --no-print-directory setup

# STRICT reaches a recipe only as $(filter 1,...): --strict or nothing, never its text.
tables:
	@exec $(PY) -m megalab tables $(if $(filter 1,$(STRICT)),--strict)

# Your own runs (OUTDIR, default outdir/) beside the committed ones, written to OUTDIR/compare/.
.PHONY: compare
compare:
	@exec $(PY) -m megalab compare "$${OUTDIR:-outdir}"

# results/quickstart/transcript.txt: what any machine can re-derive of the quickstart transcript (megalab
# transcript; --check, --gpu).
transcript:
	@exec $(PY) -m megalab transcript

# Stock local spec vs megalab's spec on one GPU (configs/bench.yaml) -> results/bench/README.md.
# Resumable: runs already recorded in results/bench/runs are not repeated. BENCH_ARGS e.g.
# "--parts cases,ablation --budget-s 500". Needs a GPU; `bench-report` rebuilds the page anywhere.
.PHONY: bench bench-report
bench:
	@set -f; exec $(PY) -m megalab bench run $$BENCH_ARGS

bench-report:
	@$(PY) -m megalab bench-report

# The results pages' figures (results/plots/*.svg); `make tables` redraws them too, as the pages link them.
.PHONY: plots
plots:
	@$(PY) -m megalab plots

# The papers' scaling claims (configs/checks.yaml) against the records -> results/checks.md.
# A FAIL is a finding and exits 0; STRICT=1 makes it an error.
check:
	@exec $(PY) -m megalab check $(if $(filter 1,$(STRICT)),--strict)

# ---- data: tokenize a corpus into Megatron's indexed dataset (python -m megalab prepare-data --help)
#   make prepare-data                          openwebtext-10k (Hub), GPT-2 BPE -> data/openwebtext-10k_text_document
#   make prepare-data DATA_SOURCE='corpus/*.jsonl' TOKENIZER=train:8192    offline: a BPE trained on the corpus
# Also: DATA_PREFIX=, WORKERS=, LIMIT_DOCS=, FORCE=1, VOCAB_FILE=/MERGE_FILE= (with TOKENIZER=gpt2).
DATA_SOURCE ?= stas/openwebtext-10k
TOKENIZER ?= gpt2
DATA_PREFIX ?=
.PHONY: prepare-data
prepare-data:
	@$(PY) -m megalab prepare-data --source "$$DATA_SOURCE" --tokenizer "$$TOKENIZER" \
	    $${DATA_PREFIX:+--out "$$DATA_PREFIX"} $${WORKERS:+--workers "$$WORKERS"} \
	    $${LIMIT_DOCS:+--limit-docs "$$LIMIT_DOCS"} $(if $(filter 1,$(FORCE)),--force) \
	    $(if $(filter gpt2,$(TOKENIZER)),$${VOCAB_FILE:+--vocab-file "$$VOCAB_FILE"} $${MERGE_FILE:+--merge-file "$$MERGE_FILE"})

# Removes local scratch only; committed results/ are never touched.
clean:
	rm -rf outdir .pytest_cache
	find . -name __pycache__ -type d -prune -not -path "./$${VENV#./}/*" -exec rm -rf {} +

# ---- everyday commands around runs ---------------------------------------------------------------
# profile-<id> and resume-<id> need no rule here: the catch-all above hands them to the launcher.
.PHONY: monitor-gpu tensorboard show-arguments count-arguments
monitor-gpu:
	@nvidia-smi -L >/dev/null 2>&1 || { echo "monitor-gpu: no NVIDIA GPU here (nvidia-smi -L failed); fix: run it on the GPU machine" >&2; exit 2; }
	@if $(PY) -c "import nvitop" 2>/dev/null; then exec $(PY) -m nvitop; else exec nvidia-smi -l 1; fi

# On 127.0.0.1 unless HOST= says otherwise: TensorBoard serves the run logs to whoever reaches the port.
tensorboard:
	@$(PY) -c "import tensorboard" 2>/dev/null || { echo "tensorboard: not installed; fix: pip install tensorboard (or pip install -e '.[logging]')" >&2; exit 2; }
	exec $(PY) -m tensorboard.main --logdir "$${OUTDIR:-outdir}" --host "$${HOST:-127.0.0.1}" --port "$${PORT:-6006}"

show-arguments:
	@exec $(PY) -m megalab arguments $${GREP:+"$$GREP"}

count-arguments:
	@$(PY) -m megalab arguments --count

# ---- exports, last: an `export NAME` defines NAME (empty), and so would hide a `NAME ?= default`.
# Every variable that is set, as its text; an unset one stays out of the recipes' environment.
export $(foreach v,$(VARIABLES),$(if $(filter undefined,$(origin $v)),,$v))
