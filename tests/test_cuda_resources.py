"""The CUDA kernels compile for sm_80 and sm_90 without local memory (no register spills,
no stack frame): nvcc's -Xptxas -v report is parsed per kernel (the same flags as the
build)."""

import functools
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"
# every kernel source, so that a new one cannot be left out
KERNELS = sorted(p.stem for p in (CSRC / "cuda").glob("*.cu"))
ARCHS = (80, 90)
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def ptxas_report(kernel: str) -> dict[int, dict[str, dict[str, int]]]:
    """{arch: {kernel function: {registers, spill_bytes, stack_bytes, shared_bytes}}} from
    one nvcc call per source for both architectures (the front end runs once)."""
    source = CSRC / "cuda" / f"{kernel}.cu"
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [NVCC, "-std=c++20", "-O3", f"-I{CSRC}", *[f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS],
             "-Xptxas=-v", "--fatbin", str(source), "-o", str(Path(tmp) / f"{kernel}.fatbin")],
            capture_output=True, text=True, check=True).stderr
    reports, report, name = {a: {} for a in ARCHS}, None, None
    for line in out.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)' for 'sm_(\d+)'", line):
            name, report = m.group(1), reports[int(m.group(2))]
        elif name and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            report[name] = {"stack_bytes": int(m.group(1)), "spill_bytes": int(m.group(2)) + int(m.group(3))}
        elif name and (m := re.search(r"Used (\d+) registers", line)):
            smem = re.search(r"(\d+) bytes smem", line)
            report[name].update(registers=int(m.group(1)), shared_bytes=int(smem.group(1)) if smem else 0)
    return reports


@functools.cache
def ptxas_reports() -> dict[str, dict[int, dict[str, dict[str, int]]]]:
    """{source: ptxas_report(source)} for every kernel source, the nvcc calls run as many at
    a time as there are cores (each is one single-threaded compile)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip(KERNELS, pool.map(ptxas_report, KERNELS)))


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("kernel", KERNELS)
def test_no_local_memory_spills(kernel):
    for arch, report in ptxas_reports()[kernel].items():
        assert report and all("registers" in r for r in report.values()), f"unparsed ptxas report for sm_{arch}: {report}"
        for name, r in report.items():
            print(f"sm_{arch} {name}: {r}")
            assert r["spill_bytes"] == 0, f"{name} spills on sm_{arch}: {r}"
            assert r["stack_bytes"] == 0, f"{name} uses a local-memory stack frame on sm_{arch}: {r}"
