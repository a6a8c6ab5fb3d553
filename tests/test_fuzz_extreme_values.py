"""The hostile-value fuzz suite (tests/fuzz_extreme_values.py) on every backend, each in a
process of its own so that a crash fails one test, not the run; at least half of each op's
examples that are not hostile must reach the op's answer, not a refusal
(fuzz_extreme_values.MIN_CHECKED). The processes start together (one thread each) and each
test waits for its own; DOMINO_FUZZ_EXAMPLES sets the examples per op (a soak: thousands,
by hand)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "fuzz_extreme_values.py"
# Examples per op: the interpreted Triton kernels cost ~0.1 s a call.
EXAMPLES = {"reference": 20, "native": 40, "direct": 40, "emulated_cuda": 40, "triton": 12}


@pytest.fixture(scope="module")
def fuzz_runs():
    """backend -> its running fuzz process (started at once, all of them)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = {be: subprocess.Popen(
        [sys.executable, str(SCRIPT), "--backend", be,
         "--examples", os.environ.get("DOMINO_FUZZ_EXAMPLES", str(n))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for be, n in EXAMPLES.items()}
    yield procs
    for p in procs.values():
        p.kill()


@pytest.mark.parametrize("backend", list(EXAMPLES))
def test_hostile_values_get_a_clear_error_or_the_documented_answer(fuzz_runs, backend):
    try:
        out, _ = fuzz_runs[backend].communicate(timeout=600)
    except subprocess.TimeoutExpired:
        fuzz_runs[backend].kill()
        out, _ = fuzz_runs[backend].communicate()
        pytest.fail(f"the {backend} fuzz run hung; its last case:\n{out[-3000:]}")
    code = fuzz_runs[backend].returncode
    assert code == 0 and out.rstrip().endswith("fuzz ok"), (
        f"{backend}: exit code {code} (negative: killed by signal {-code})\n{out[-6000:]}")
    # each op's count of the examples that reached its answer's checks (the script asserts
    # that they are at least half of the ordinary ones: a refused call passes)
    assert out.count("returned and were checked") == 5, out[-3000:]
