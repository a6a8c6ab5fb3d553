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
    where = tmp_path_factory.mktemp("round_costs")
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
