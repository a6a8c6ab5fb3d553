"""Ahead-of-time compile of every Triton kernel for the GPUs (sm_80, sm_90), without one."""

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from kernel_backends import TRITON

pytestmark = pytest.mark.skipif(TRITON.skip_reason is not None, reason=str(TRITON.skip_reason))


def test_every_kernel_compiles_for_sm80_and_sm90_without_spills():
    """Runs python -m domino_ops.triton.aot without the interpreter (an interpreted kernel
    cannot be compiled): a kernel that would not compile for the GPU fails here."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}

    def compile_for(capability: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "domino_ops.triton.aot", "--capability", capability],
                              capture_output=True, text=True, env=env, timeout=1200)

    # one process per architecture, both at once (each compile is single-threaded)
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(compile_for, ("80", "90")))
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    stdout = "".join(run.stdout for run in runs)
    rows = re.findall(r"^(sm_\d+)\s+(\S+)\s+regs\s+(\d+)\s+spill bytes\s+(\d+)", stdout, re.M)
    print(stdout)
    from domino_ops.triton import aot
    assert len(rows) == 2 * len(aot._specs()), stdout  # every variant for both architectures
    compiled = {name.split("[")[0] for _, name, _, _ in rows}
    from domino_ops.triton import OPS
    for op in OPS:  # every op's kernel module contributes (e.g. _tree_sampling_kernel)
        module = __import__(f"domino_ops.triton.{op}", fromlist=["_"])
        kernels = {k for k, v in vars(module).items() if k.endswith("_kernel") and hasattr(v, "fn")}
        assert kernels & compiled, f"no kernel of {op} compiled ahead of time"
    spilled = [(arch, name) for arch, name, _, spills in rows if int(spills) > 0]
    assert not spilled, f"register spills: {spilled}"
