"""Ahead-of-time compile of every Triton kernel for the GPUs (sm_80, sm_90), without one."""

import os
import re
import subprocess
import sys

import pytest

from kernel_backends import TRITON

pytestmark = pytest.mark.skipif(TRITON.skip_reason is not None, reason=str(TRITON.skip_reason))


def test_every_kernel_compiles_for_sm80_and_sm90_without_spills():
    """Runs python -m domino_ops.triton.aot without the interpreter (an interpreted kernel
    cannot be compiled): a kernel that would not compile for the GPU fails here."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # one process per architecture, both at once (each compile is single-threaded)
    procs = [subprocess.Popen([sys.executable, "-m", "domino_ops.triton.aot", "--capability", cc],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for cc in ("80", "90")]
    stdout = ""
    for proc in procs:
        out, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, err[-3000:]
        stdout += out
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
