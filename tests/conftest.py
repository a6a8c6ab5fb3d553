import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# Without a GPU the Triton kernels run in Triton's interpreter. It is chosen when a kernel
# is decorated, so it must be set before domino_ops.triton's kernel modules are imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    import triton_interpreter_speedup

    triton_interpreter_speedup.install()

# `make test` runs the suite in one pytest-xdist worker per core (whole files per worker, so
# a module's fixtures load once). Each worker gets its share of the cores for torch's
# intra-op threads, and so do the processes tests start: two workers of two threads each
# on two cores ran slower than one process, one thread each runs the Python-bound tests
# (the Triton interpreter, the SIMT emulator, nvcc) side by side.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _XDIST_WORKERS > 1:
    _threads = max(1, (os.cpu_count() or 1) // _XDIST_WORKERS)
    torch.set_num_threads(_threads)
    os.environ["OMP_NUM_THREADS"] = str(_threads)

# The SIMT emulator module domino_simt (the CUDA kernels compiled as host C++, test
# infrastructure) is never installed: `make simt`, which `make test` runs, builds it into
# build/simt/. This is the one place that knows where; tests `import domino_simt`.
SIMT_BUILD_DIR = Path(__file__).resolve().parents[1] / "build" / "simt"
sys.path.insert(0, str(SIMT_BUILD_DIR))


def pytest_report_header(config):
    spec = importlib.util.find_spec("domino_simt")
    return f"CUDA kernels under the SIMT emulator: {spec.origin if spec else 'domino_simt not built (make simt)'}"


# Kernels are timed in benchmarks/, never here: no deadlines. CI runs a moderate number of
# examples per property; DOMINO_HYPOTHESIS_PROFILE=thorough runs many more.
settings.register_profile("ci", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile("thorough", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.load_profile(os.environ.get("DOMINO_HYPOTHESIS_PROFILE", "ci"))

POISON_TOKEN = -7


@pytest.fixture(autouse=True, scope="session")
def round_costs_of_this_run(tmp_path_factory):
    """The engine's measured round costs go to a directory of this test run, not the user's
    cache: a measurement taken while the suite loads the machine must not outlive it. Tests
    that assert on the budget's choices rig the costs instead (``gen._costs``), so one
    timed repeat per size is enough here (the SmolLM2 tests measure once per batch size)."""
    from domino import budget

    mp = pytest.MonkeyPatch()
    # Under pytest-xdist one directory serves every worker of this run (a worker's base
    # temporary directory sits in the run's), so a model is measured once per run, not once
    # per worker; the costs are written atomically (budget.round_costs).
    base = tmp_path_factory.getbasetemp()
    where = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "round_costs"
    where.mkdir(exist_ok=True)
    mp.setattr(budget, "cost_cache_dir", lambda: where)
    measure = budget.measure_round_costs
    mp.setattr(budget, "measure_round_costs",
               lambda gen, batch_size=1, **kw: measure(gen, batch_size, **{**kw, "repeats": 1}))
    yield
    mp.undo()


# The CPU kernels are compiled once per instruction set (csrc/cpu/isa.h). Every test in
# these files runs once per build this machine supports (or only the one DOMINO_CPU_ISA
# names), through the autouse `cpu_isa` fixture below.
CPU_KERNEL_TEST_FILES = {"test_domino_head_rollout.py", "test_sample.py", "test_verify_greedy.py",
                         "test_verify_sampling.py", "test_bad_input.py"}


def cpu_isas_to_test() -> list[str]:
    env = os.environ.get("DOMINO_CPU_ISA", "auto")
    if env not in ("", "auto"):
        return [env]
    from domino_ops import cpu
    return cpu.supported_isas()


def pytest_generate_tests(metafunc):
    if os.path.basename(str(metafunc.definition.path)) in CPU_KERNEL_TEST_FILES:
        metafunc.parametrize("cpu_isa", cpu_isas_to_test(), indirect=True)


@pytest.fixture(autouse=True)
def cpu_isa(request):
    """The CPU kernel build a test runs (None: the process default)."""
    name = getattr(request, "param", None)
    if name is None:
        yield None
        return
    from domino_ops import cpu
    with cpu.forced_isa(name):
        yield name


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# The files that take longest (a quiet 2-core AVX2 VM, 2026-12-05), run first: pytest-xdist
# hands each worker whole files in collection order, and a long file started last would
# leave the other worker idle at the end. Within a file the order is unchanged; a file not
# named here keeps its place after these.
LONGEST_FILES_FIRST = ["test_kernel_backends.py", "test_smollm2.py", "test_training.py", "test_cpu_isa.py",
                       "test_speculative_tree.py", "test_cuda_resources.py", "test_domino_head_expand.py",
                       "test_triton_aot.py", "test_batch_invariance.py", "test_speculative_sampling.py",
                       "test_fuzz_extreme_values.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable
