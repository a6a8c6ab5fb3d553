"""The GPU kernel backends the kernel-contract suite (test_kernel_backends.py) runs, with the
shapes each is tested at:

- emulated CUDA: every kernel in csrc/cuda/, executed by the host SIMT emulator
  (torch.ops.domino_simt.*: same kernel sources, same tensor adapters as the real CUDA ops);
- CUDA: the same kernels compiled into domino_ops._C, on CUDA tensors (torch.ops.domino_ops.*),
  where there is a GPU and the extension was built with its CUDA kernels; skipped elsewhere;
- Triton: python/domino_ops/triton/, under Triton's interpreter (TRITON_INTERPRET=1, set in
  conftest) or on a GPU when there is one.

Both take the dispatcher ops' schemas (outputs passed in)."""

from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

import domino_ops
from domino_ops import triton as triton_ops

F32, BF16 = torch.float32, torch.bfloat16


def emulated_cuda_kernel(op):
    """The emulated CUDA kernel of ``op`` (e.g. "sample"): torch.ops.domino_simt.<op>."""
    # The one place the tests reach the emulator module (importing it registers the ops);
    # where that module comes from may change, so keep it here only.
    import domino_simt  # noqa: F401  (built by `make simt`; tests/conftest.py puts it on sys.path)
    return getattr(torch.ops.domino_simt, op)


@dataclass(frozen=True)
class KernelBackend:
    """One backend and its test tables; sizes follow its tile sizes (and its speed)."""

    id: str  # the pytest id
    device: str  # where its tensors live
    kernel: Callable[[str], Callable]  # op name -> the op with outputs passed in
    skip_reason: Optional[str]  # why it cannot run here, or None
    verify_greedy_sizes: dict  # b, k, V lists
    sample_vocab: list
    verify_sampling_shapes: list  # (b, k, V) cases
    target_population: int  # rounds in the verify_sampling distribution test
    head_sizes: dict  # b, k, V, r, G, H lists
    race_cases: list  # (V, N, weight dtype) cases of the head's exponential-race test


# Compiled for the emulator the kernels run 64-thread blocks, so small shapes span several
# tiles: vocabularies above 64 several of the logits kernel's tiles (64 rows), ranks above
# 64 several of its a-chunks (test_emulated_cuda_head_rollout_takes_a_rank_of_any_size).
# Its populations are the CUDA backend's or a fifth of them (~0.6 ms a head sequence).
EMULATED_CUDA = KernelBackend(
    id="emulated_cuda", device="cpu", kernel=emulated_cuda_kernel, skip_reason=None,
    verify_greedy_sizes=dict(b=[1, 2, 33], k=[1, 3, 7], V=[1, 17, 300]),
    sample_vocab=[1, 2, 17, 300],
    verify_sampling_shapes=[(1, 1, 5), (4, 5, 300), (3, 2, 17)],
    target_population=4000,
    head_sizes=dict(b=[1, 2, 9, 33],  # 33: three groups of 16 accumulators, the last partial
                    k=[1, 3], V=[1, 17, 257, 700], r=[1, 3, 16, 33], G=[1, 5, 16], H=[1, 8]),
    # N 4000 resolves a race at a temperature off by 20 % (see that test)
    race_cases=[(5, 4000, BF16), (5, 4000, F32)],
)

def cuda_kernel(op):
    """The CUDA kernel of ``op`` built into domino_ops._C: torch.ops.domino_ops.<op>, which
    dispatches to it for CUDA tensors."""
    return getattr(torch.ops.domino_ops, op)


def _cuda_skip_reason() -> Optional[str]:
    if not torch.cuda.is_available():
        return "no GPU here: the CUDA kernels run under the SIMT emulator (emulated_cuda) instead"
    if not domino_ops.cuda_compiled:
        return "domino_ops was built without its CUDA kernels (DOMINO_CUDA=OFF, or no nvcc at build time)"
    return None


# On a GPU the row ops run at real vocabularies (151936) and batches; the head's sizes stay
# where the float64 CPU oracle is quick (its real shapes are test_cuda_graph.py's, against
# eager calls), with more than one group of 8 sequences, several logits tiles and GRU chunks.
CUDA = KernelBackend(
    id="cuda", device="cuda", kernel=cuda_kernel, skip_reason=_cuda_skip_reason(),
    verify_greedy_sizes=dict(b=[1, 3, 64], k=[1, 4, 15], V=[1, 17, 1500, 151936]),
    sample_vocab=[1, 2, 17, 1500, 151936],
    verify_sampling_shapes=[(1, 1, 5), (4, 5, 300), (3, 2, 1500), (2, 15, 151936)],
    target_population=4000,
    head_sizes=dict(b=[1, 3, 9, 33], k=[1, 3], V=[1, 17, 300, 4099], r=[1, 33, 64], G=[1, 40, 256],
                    H=[1, 8, 64]),
    race_cases=[(5, 20000, BF16), (5, 20000, F32)],
)

_TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRITON = KernelBackend(
    id="triton", device=_TRITON_DEVICE, kernel=triton_ops.kernel,
    skip_reason=None if triton_ops.available(_TRITON_DEVICE) else "Triton cannot run here",
    verify_greedy_sizes=dict(b=[1, 3, 33], k=[1, 4], V=[1, 17, 1500]),
    sample_vocab=[1, 2, 17, 1500],
    verify_sampling_shapes=[(1, 1, 5), (4, 5, 300), (3, 2, 1500)],
    target_population=1200,
    head_sizes=dict(b=[1, 3, 33], k=[1, 3],
                    V=[1, 17, 300],  # 300: three 128-row tiles, the last partial
                    r=[1, 3, 33],  # 33: two 32-column chunks
                    G=[1, 5, 40],  # 40: two 32-row GRU chunks
                    H=[1, 8]),
    # one dtype, N 400: ~30-60 s interpreted (both dtypes at 800 took 147 s of the 10-minute
    # suite); the float32 weight path is covered by the greedy and filtered-sampling tests.
    # The N that would resolve a temperature off by 20 % (thousands) is out of reach here;
    # see the race test for what N 400 does catch
    race_cases=[(5, 400, BF16)],
)

BACKENDS = [EMULATED_CUDA, CUDA, TRITON]


def backend_params(table=None):
    """pytest parameters over BACKENDS (skipped where a backend cannot run): ``backend``
    alone, or with ``table`` the name of a list attribute of cases, one ``(backend, *case)``
    per case, so that each backend runs its own cases."""
    params = []
    for be in BACKENDS:
        marks = [pytest.mark.skip(reason=be.skip_reason)] if be.skip_reason else []
        cases = [()] if table is None else [tuple(c) for c in getattr(be, table)]
        for case in cases:
            ident = "-".join([be.id] + [str(c).removeprefix("torch.") for c in case])
            params.append(pytest.param(be, *case, marks=marks, id=ident))
    return params
