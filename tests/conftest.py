import contextlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The suite starts some hundreds of Python processes that import megalab. Where the environment says not to write
# bytecode (PYTHONDONTWRITEBYTECODE: the GPU rig's, pyinfo.recompiles), each would compile megalab's sources again
# (a page build's imports 1.1 -> 0.65 s with them): they are compiled once here, into megalab's __pycache__ as Python
# writes it by default (git ignores it). Python reads them whatever the variable says, each only while it matches its
# source; copies of the checkout that tests make keep them (copy2 keeps the sources' times).
if sys.dont_write_bytecode:
    import compileall

    compileall.compile_dir(ROOT / "megalab", quiet=2)
os.environ.setdefault("PYTHONWARNINGS", "ignore")
# `make` in a test runs this interpreter, never the PY a parent make exported: `make test` on a fresh
# clone parses the Makefile before .venv exists, so its PY is python3, which lacks the venv's packages.
os.environ["PY"] = sys.executable
# and as a user typing it would: not as a sub-make of `make test` (MAKELEVEL makes its lines `make[1]:`,
# MAKEFLAGS would carry the parent's flags and overrides in)
for _name in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES"):
    os.environ.pop(_name, None)
# Megatron-check verdicts (megalab/harness/validate.py) go to a fresh folder per test session, never ~/.cache
import tempfile  # noqa: E402

os.environ["MEGALAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="megalab-cache-")

import socket  # noqa: E402

import pytest  # noqa: E402


# Worker processes share the machine's cores: torch and the BLAS libraries in a test (and in the processes
# it starts) take one thread each, so two workers never oversubscribe the cores into spinning threads.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

# Module fixtures that are expensive to make (module -> fixtures): the tests that share one are kept on one
# xdist worker, so that it is made once. The input audit, the longest, goes first.
# "*": the whole module (test_estimate: its fixtures, and the CLI test, read the same TensorBoard files,
# which validation.py keeps per process). test_fuzz_inputs' "built": the sandbox its CLI tests copy.
# test_onegpu_goals's "trials": the levers-tried rows of the committed records. test_make_payloads: its copy of the
# repository (the committed records with it), and the closing figures that count every call of the module.
SHARED = {"test_fuzz_inputs": ("audit", "built"), "test_estimate": ("*",), "test_dataset": ("rows",),
          "test_onegpu_goals": ("trials",), "test_make_payloads": ("*",)}


def pytest_configure(config):
    """At its end a worker runs the garbage collector five times over a heap that holds torch and Megatron before it
    reports unraisable exceptions (pytest's unraisableexception plugin: about 2 s a worker here); once finds what the
    suite's objects leave (they hold no reference cycles that need more passes). The plugin still reports them."""
    with contextlib.suppress(ImportError, AttributeError):
        from _pytest.unraisableexception import gc_collect_iterations_key

        config.stash[gc_collect_iterations_key] = 1


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """GPU-only tests (@pytest.mark.gpu) run only when asked for: MEGALAB_GPU_TESTS=1 or -m gpu.
    A plain `pytest` on a GPU host never starts GPU work.

    Under pytest-xdist (`make test`: -n auto --dist loadgroup) the tests that share the input audit
    (tests/test_fuzz_inputs.py's module fixture, the suite's longest setup) are one group, so the audit is
    made once, on one worker; they go first, so that it runs while the other workers take the rest. So do
    the estimator tests that share the validation rows (SHARED), and the modules whose checks run in Triton's
    interpreter (interpreted(): one worker starts the warm interpreter, its imports of torch, Triton and Megatron
    taking 5-6 s), next."""
    if not (os.environ.get("MEGALAB_GPU_TESTS") == "1" or "gpu" in (config.getoption("-m") or "")):
        skip = pytest.mark.skip(reason="GPU test: MEGALAB_GPU_TESTS=1 or pytest -m gpu runs it")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    groups, interprets = {}, {}
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
        shared = [f for f in SHARED.get(module, ()) if f == "*" or f in getattr(item, "fixturenames", ())]
        if module and module not in interprets:
            interprets[module] = "interpreted(" in Path(item.module.__file__).read_text(encoding="utf-8")
        if shared:
            groups[id(item)] = f"{module}:{shared[0]}"
        elif interprets.get(module):
            groups[id(item)] = "interpreter"
        if id(item) in groups:
            item.add_marker(pytest.mark.xdist_group(groups[id(item)]))
    order = lambda i: (not groups[id(i)].endswith(":audit"), groups[id(i)] != "interpreter")  # noqa: E731
    first = sorted((i for i in items if id(i) in groups), key=order)
    items[:] = first + [i for i in items if id(i) not in groups]


# The multi-process tests' ranks (gloo on CPU) start from a fork server of each worker's own, which imports torch
# and Megatron once (these modules, megalab.runtime.spec first: it lets megatron-core import on Python 3.11);
# a spawned rank would import them again, 3-4 s each.
RANK_PRELOAD = ["megalab.runtime.spec", "megalab.runtime.grouped_experts", "megalab.runtime.cross_entropy",
                "megatron.core.models.gpt.gpt_model", "megatron.core.transformer.moe.moe_layer",
                "megatron.core.transformer.moe.experts", "torch.distributed"]


# The tests that start ranks: one xdist group, so that one worker starts the fork server (RANK_PRELOAD's imports,
# 4.5 s) rather than each.
RANKS = pytest.mark.xdist_group("ranks")


def start_ranks(fn, nprocs: int, *args) -> None:
    """fn(rank, *args) in `nprocs` processes, joined, as torch.multiprocessing.spawn runs it (an exception in a
    rank fails the test), each with this process's environment of the moment, as a spawned rank would have.
    Forked from the fork server (RANK_PRELOAD), never from this process, which may hold world1's process
    group: a forked child could not drop it."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)  # before its first start
    mp.start_processes(_rank, args=(fn, dict(os.environ), *args), nprocs=nprocs, join=True, start_method="forkserver")


def _rank(rank: int, fn, environ: dict, *args) -> None:
    os.environ.clear()
    os.environ.update(environ)
    fn(rank, *args)


def free_port() -> int:
    """A TCP port nobody listens on, for a test's own gloo rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tiny_gpt(**config):
    """For a fresh interpreter (the Triton-interpreter tests of megalab's kernels inside Megatron's layers): a
    one-process gloo group, Megatron's model-parallel state and Megatron's own GPT with megalab's layer spec (2 layers,
    hidden 40, 4 heads, vocab 64, sequence 16, on CPU; CONFIG overrides the TransformerConfig). Yields (model, run):
    run() is the mean loss on one fixed batch, after torch.manual_seed(1), and every parameter's gradient (None where
    it has none)."""
    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megalab.runtime import spec

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    cfg = TransformerConfig(**{"num_layers": 2, "hidden_size": 40, "num_attention_heads": 4,
                               "use_cpu_initialization": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                               "masked_softmax_fusion": False, "gradient_accumulation_fusion": False,
                               "persist_layer_norm": False, **config})
    torch.manual_seed(0)
    model = GPTModel(config=cfg, transformer_layer_spec=spec.megalab_layer_spec(cfg), vocab_size=64,
                     max_sequence_length=16)
    b, s = 2, 16
    ids = torch.randint(0, 64, (b, s))
    pos = torch.arange(s).expand(b, s)
    labels = torch.randint(0, 64, (b, s))
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)[None, None]

    def run():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout draws each time
        loss = model(ids, pos, mask, labels=labels).mean()
        loss.backward()
        return loss.detach(), {n: None if q.grad is None else q.grad.clone() for n, q in model.named_parameters()}

    try:
        yield model, run
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def assert_same_run(got, want):
    """Two of tiny_gpt's run() results: the losses, and every parameter's gradient (each there), within fp32's
    rounding."""
    import torch

    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-4)
    for n, g in got[1].items():
        assert g is not None and want[1][n] is not None, f"{n}: no gradient"
        torch.testing.assert_close(g, want[1][n], atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")


@pytest.fixture(scope="module")
def world1():
    """A one-process gloo group and Megatron's model-parallel state (TP = PP = 1)."""
    from megalab._compat import ensure_typing_override

    ensure_typing_override()
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        pytest.skip("another test left Megatron's model-parallel state initialised")
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    if own_group:
        dist.destroy_process_group()


def megatron_verdict(goal: str, env: dict[str, str] | None = None) -> None:
    """Speed only, before a test runs `make GOAL` (a target, its profile-/resume-/slurm- variant) with ENV in a
    subprocess: the same plan's Megatron check here first, as a dry run's preflight. Megatron is imported
    once per worker and checks a plan in 0.01 s here. An accepted verdict goes to the verdict cache that ENV
    names (MEGALAB_CACHE_DIR, read by the subprocess), with Megatron's flag table, so the subprocess's
    preflight finds it instead of importing megatron.training (4 s). Nothing else changes: a rejection is
    never cached (the subprocess checks it again), a plan built otherwise here only misses the cache, and
    the subprocess's Megatron line says the same check passed before. test_catalog's dry run of 128 keeps a
    check of its own, in a fresh process."""
    import contextlib
    import io

    from megalab.core.variables import Options
    from megalab.harness import launch, slurm

    full = {**os.environ, **(env or {}), "DRY_RUN": "1"}
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(full)  # what the preflight reads besides Options (the wandb mode, the Python line)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            if goal.startswith("slurm-"):
                launch.megatron_check(slurm.planned(goal.removeprefix("slurm-"), full))
            else:
                launch.run(goal, Options.from_env(full))
    except (Exception, SystemExit):  # a refusal: the subprocess gives it, as it would have
        pass
    finally:
        os.environ.clear()
        os.environ.update(saved)


def typed(records: dict) -> dict:
    """Hand-made records (target -> the run.json fields a test needs) as RunRecords, each record's target
    its key unless it names one: pages and checks read typed records only."""
    from megalab.core.records import RunRecord

    return {t: r if isinstance(r, RunRecord) else RunRecord.of({"target": t, **r}) for t, r in records.items()}


# The commit before issue 59's renovation changed files under megalab/runtime (the lever table, the one GPU_MEM_GB
# conversion), which made every record older. Tests of today's runs read the records' code against it
# (pin_last_runs) until the rows are re-run.
ISSUE_59_BASE = "5972c4c424bb09e304810c671a8c82d4d66ec014"
# The run code of a campaign (flat_adam's round, 2026-11-26): an import-circle fix under megalab/runtime after its
# runs made every record older. Tests that check selection or verdicts on the committed records pin a campaign's
# code as today's (pin_code), so they read a campaign's worth of today's runs whatever changed since.
CAMPAIGN_COMMIT = "735e7c7d6314afacd5f098c8e1368e7c4add5e2b"
# The run code of device_norm's round (the fourth session of 2026-11-26): the default re-measured, goal rows included.
ROUND_COMMIT = "9fb5a1825b13a9742b506e536d9b075e46195678"
# The sixth session's default (no_rerun with the CUDA graph): the graphed one-GPU rows re-measured at this commit.
NO_RERUN_COMMIT = "542a644e59625408815762655805ec0645c76d68"
# The seventh session's default (device_norm in): every one-GPU row and the two-GPU tour re-measured at this commit.
DEVICE_NORM_COMMIT = "5d31ca8dc6ffad7bca5e655b34f7ec4e59a10806"
# The eighth session's run code (CUDA_GRAPH=auto's room rule): 111 and 112 graphed by default, the 4x H100 rows.
GRAPH_ROOM_COMMITS = ("1c266dac672fc0242c30ebc4bf8619ce0f78b21e", "8ce1249db2cdaafc583ff4e5a6dc8d84e978d5d7")
# The ninth session's default (triton_norm in): the goals' launches and their bases without it, on one H100, and
# the other one-GPU rows once each on a second.
TRITON_NORM_COMMITS = ("6f7efc0b0b77f2af9aa80e4b594f1ad123438046", "bd4b70664834035ff881ee68aaaad2ad793be3d4",
                       "5b4096e5dd9a536094e58ea98eb95e852b001082")
# The tenth session's runs (param_grad; before bias_gelu and norm_residual joined GPT-2's default): every one-GPU
# row once or more, 113 and 121 among them.
PARAM_GRAD_COMMITS = ("a4943fd733d605320039c5ea8ee99b501cf0fdf8", "93a96f01339d71b7bfb9912ff70d376a55a8dce4",
                      "cfd4ea3ed4ef11285f2a766ea431a40d64b7cc8e")
# The fourteenth session's commit (triton_norm's and dropout_add's backward loops pipelined): its launches of 111,
# 112, 101 and 600 on one H100, and two of 111 at the commit before (7f7d795) between them.
PIPELINED_COMMIT = "80644e5e000616377f0394d5095f7e25e1e75972"
# The fifteenth session's commit (the norm's backward at 3 programs an SM, qkv_pack in one launch): its launches of
# 111, 112, 101 and 600 and of eight chapter rows on one-GPU H100s, and two of 111 at the commit before (0c57b23).
GRID_TUNING_COMMIT = "a92b95eef00d0b57d6d5062c6d9de15c0a96f690"
BEFORE_GRID_TUNING = "0c57b231f59d1be424a265568b236bb89ac43400"
# The launcher's default fast path before triton_norm joined it.
BEFORE_TRITON_NORM = ("fused_adam", "foreach_norm", "foreach_scale", "bf16_ce", "addmm_bias", "clip_in_adam",
                      "flat_adam", "device_norm")


@pytest.fixture
def pin_code(monkeypatch):
    """pin_code(*commits): those commits' records count as today's code; every other commit is judged as usual."""
    import functools

    from megalab.core import provenance

    real = provenance._code_state

    def pin(*commits: str) -> str:
        @functools.lru_cache(maxsize=256)
        def pinned(c, root, unused, tree_commit):
            return (provenance.CURRENT, "") if c in commits else real(c, root, unused, tree_commit)

        monkeypatch.setattr(provenance, "_code_state", pinned)
        return commits[0]
    return pin


def _default_without(monkeypatch, later: tuple[str, ...]):
    """FAST's default with the levers that joined it later taken out, for the test; the pages' predictions are planned
    once per process with the default's levers (dropout_add moves the memory estimate): none made under this default
    may outlive the test."""
    from megalab.results import predicted
    from megalab.runtime import levers

    real = levers.default
    monkeypatch.setattr(levers, "default", lambda n, cfg: tuple(x for x in real(n, cfg) if x not in later))
    predicted._predicted.cache_clear()
    yield
    predicted._predicted.cache_clear()


@pytest.fixture
def before_layer_levers(monkeypatch):
    """The default as it was before the eleventh session: without bias_gelu and norm_residual for GPT-2's layer (nor the
    twelfth session's dropout_add, nor the thirteenth's qkv_pack, nor the seventeenth's sdpa_gqa for GQA presets, nor
    the eighteenth's gelu_epilogue)."""
    from megalab.runtime import levers

    yield from _default_without(monkeypatch, (levers.BIAS_GELU, levers.NORM_RESIDUAL, levers.DROPOUT_ADD,
                                              levers.QKV_PACK, levers.SDPA_GQA, levers.GELU_EPILOGUE))


@pytest.fixture
def before_gelu_epilogue(monkeypatch):
    """The default as it was before the eighteenth session: without gelu_epilogue for GPT-2's layer."""
    from megalab.runtime import levers

    yield from _default_without(monkeypatch, (levers.GELU_EPILOGUE,))


@pytest.fixture
def before_triton_norm(pin_code, before_layer_levers, monkeypatch):
    """The committed records as they were read before the ninth session: the default without triton_norm (nor the
    eleventh session's levers), and the seventh and eighth sessions' run code counted as today's (their pages'
    state, kept testable)."""
    from megalab.runtime import levers

    real = levers.default  # before_layer_levers' default, without triton_norm too
    monkeypatch.setattr(levers, "default", lambda n, cfg: tuple(x for x in real(n, cfg) if x != levers.TRITON_NORM))
    monkeypatch.setattr(levers, "EVERY", BEFORE_TRITON_NORM)
    return pin_code(DEVICE_NORM_COMMIT, *GRAPH_ROOM_COMMITS)


@contextlib.contextmanager
def code_as_at_base():
    """A record's code is today's where it equals ISSUE_59_BASE's (its run code, less the files its run did not use):
    the verdicts as they were before issue 59's runtime changes, for the block."""
    import functools

    from megalab.core import git, provenance

    real = provenance._code_state

    @functools.lru_cache(maxsize=256)
    def pinned(c, root, unused, tree_commit):
        if c and not c.endswith("-dirty"):
            diff = git.run(root, "diff", "--name-only", c, ISSUE_59_BASE, "--", *provenance.CODE_PATHS)
            if diff is not None and diff.returncode == 0 and not set(diff.stdout.split()) - unused:
                return provenance.CURRENT, ""
        return real(c, root, unused, tree_commit)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(provenance, "_code_state", pinned)
        yield


@pytest.fixture
def pin_last_runs():
    with code_as_at_base():
        yield


@pytest.fixture
def pin_campaign_code(pin_code):
    """Records of the newest campaign's commit (DEVICE_NORM_COMMIT) and of CAMPAIGN_COMMIT count as today's code."""
    return pin_code(DEVICE_NORM_COMMIT, CAMPAIGN_COMMIT)


@contextlib.contextmanager
def applied(names):
    """The levers as fastpath.apply would note them installed (megalab/runtime/levers.py), for the block."""
    from megalab.runtime import levers

    before = levers.applied()
    levers.mark_applied(names)
    try:
        yield
    finally:
        levers.mark_applied(before)


_WARM = []


def interpreted(call: str, timeout: int = 600):
    """`call` (Python, e.g. "import test_x as t; t._check()") in a fresh interpreter with Triton's interpreter on:
    Triton reads TRITON_INTERPRET when it is imported, so megalab's kernels run on CPU only in a new process.
    A fork of a warm one (tests/interpreter.py: the imports made once per worker), as subprocess.run answers."""
    import atexit

    from tests.interpreter import Warm

    if not _WARM:
        _WARM.append(Warm(f"{ROOT}{os.pathsep}{ROOT / 'tests'}"))
        atexit.register(_WARM[0].close)
    return _WARM[0].run(call, timeout)


def keep_megatrons_wgrad_lookup(monkeypatch):
    """Undo install_wgrad_fusion after the test: Megatron's layers module and sys.modules as they were."""
    from megatron.core.tensor_parallel import layers

    monkeypatch.setattr(layers, "_grad_accum_fusion_available", layers._grad_accum_fusion_available)
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", None, raising=False)
    monkeypatch.delitem(sys.modules, "fused_weight_gradient_mlp_cuda", raising=False)
    return layers


class CpuBuffer:
    """Megatron's global memory buffer (CUDA memory), on the CPU."""

    def get_tensor(self, shape, dtype, name, mem_alloc_context=None):
        import torch

        return torch.empty(shape, dtype=dtype)


class NullRngTracker:
    """Megatron's CUDA RNG tracker, whose fork dropout enters even for p=0: nothing to fork on the CPU."""

    def fork(self, name="model-parallel-rng"):
        return contextlib.nullcontext()


@pytest.fixture
def megatron_on_cpu(world1, monkeypatch):
    """Megatron's layers without CUDA: DotProductAttention's score buffer and the RNG tracker stood in for."""
    from megatron.core import parallel_state, tensor_parallel

    monkeypatch.setattr(parallel_state, "get_global_memory_buffer", lambda: CpuBuffer())
    monkeypatch.setattr(tensor_parallel, "get_cuda_rng_tracker", lambda *a, **k: NullRngTracker())
