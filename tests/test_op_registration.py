"""The ops are registered with the dispatcher correctly: schemas, fake kernels, compile."""

import shutil
import subprocess
import sys

import pytest
import torch

import domino_ops
from kernel_cases import head_rollout_inputs


def head_op_args(temperature=0.0):
    inputs = head_rollout_inputs(2, 3, 40, 4, 6, 5, torch.float32, torch.float32, True, 0)
    b, k, _ = inputs[0].shape
    u = torch.rand(b, k, dtype=torch.float64) if temperature > 0 else None
    return (*inputs, temperature, 0, 1.0, u, False, torch.empty(b, k, dtype=torch.int64), torch.empty(b, k),
            torch.empty(b, 6))


OPCHECK_CASES = {
    "domino_head_rollout": lambda: head_op_args(),
    "domino_head_rollout_sampled": lambda: head_op_args(0.7),
    "sample": lambda: (torch.randn(3, 20), 0.8, 5, 0.9, torch.rand(3, dtype=torch.float64),
                       torch.empty(3, dtype=torch.int64)),
    "filtered_probs": lambda: (torch.randn(3, 20), 0.8, 5, 0.9, torch.empty(3, 20)),
    "verify_greedy": lambda: (torch.randint(0, 20, (3, 4)), torch.randn(3, 5, 20), torch.empty(3, 5, dtype=torch.int64),
                              torch.empty(3, dtype=torch.int64)),
    "verify_sampling": lambda: (torch.randint(0, 20, (3, 4)), torch.softmax(torch.randn(3, 4, 20), -1),
                                torch.softmax(torch.randn(3, 5, 20), -1), torch.rand(3, 4, dtype=torch.float64),
                                torch.rand(3, dtype=torch.float64), torch.empty(3, 5, dtype=torch.int64),
                                torch.empty(3, dtype=torch.int64)),
    "small_batch_linear": lambda: (torch.randn(3, 8), torch.randn(6, 8), torch.randn(6), torch.empty(3, 6)),
    "switched_linear": lambda: (torch.randn(2, 3, 8), torch.randn(6, 8), torch.randn(6), None),
    "small_batch_attention": lambda: (torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8),
                                      torch.rand(2, 1, 3, 5) > 0.3, 0.5, torch.empty(2, 4, 3, 8)),
    "rms_norm": lambda: (torch.randn(3, 2, 16), torch.randn(16), 1e-6, torch.empty(3, 2, 16)),
    "silu_mul": lambda: (torch.randn(3, 10), torch.randn(3, 10), torch.empty(3, 10)),
    "apply_rotary_pos_emb": lambda: (torch.randn(2, 4, 3, 8), torch.randn(2, 2, 3, 8), torch.randn(2, 3, 8),
                                     torch.randn(2, 3, 8), torch.empty(2, 4, 3, 8), torch.empty(2, 2, 3, 8)),
}


@pytest.mark.parametrize("op", ["rms_norm", "silu_mul", "apply_rotary_pos_emb"])
def test_a_meta_tensor_among_cpu_ones_is_named(op):
    """The dispatcher sends a call with any meta argument to the fake kernel: it names the
    devices (these ops had no fake kernel, and PyTorch's error named no argument)."""
    args = list(OPCHECK_CASES[op]())
    args[1] = args[1].to("meta")
    with pytest.raises(RuntimeError, match=f"{op}: every tensor must be on one device, got .* on meta"):
        getattr(torch.ops.domino_ops, op).default(*args)


@pytest.mark.parametrize("case", list(OPCHECK_CASES))
def test_opcheck(case):
    op = getattr(torch.ops.domino_ops, case.replace("_sampled", "")).default
    torch.library.opcheck(op, OPCHECK_CASES[case](),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_torch_compile_traces_the_ops():
    inputs = head_rollout_inputs(2, 4, 64, 8, 8, 8, torch.float32, torch.float32, True, 1)

    def draft_and_verify(*args):
        tokens, logprobs, state = domino_ops.domino_head_rollout(*args)
        target = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
        return domino_ops.verify_greedy(tokens, target)

    eager = draft_and_verify(*inputs)
    compiled = torch.compile(draft_and_verify, fullgraph=False)(*inputs)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


KERNEL_OPS = ["domino_head_rollout", "domino_head_expand", "sample", "filtered_probs", "verify_greedy", "verify_sampling",
              "build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only",
              "verify_tree_sampling"]


def test_cpu_kernels_registered_and_cuda_reported():
    for op in KERNEL_OPS:
        assert domino_ops.has_kernel(op, "cpu")
        # a CUDA build registers its CUDA kernels even on a machine without a GPU
        assert domino_ops.has_kernel(op, "cuda") == domino_ops.cuda_compiled, op


def test_every_kernel_op_has_an_emulated_cuda_and_a_triton_kernel():
    from domino_ops import triton as triton_ops
    from kernel_backends import emulated_cuda_kernel
    for op in KERNEL_OPS:
        assert emulated_cuda_kernel(op) is not None
        assert op in triton_ops.OPS


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("readelf") is None,
                    reason="checks the ELF dynamic section with readelf (Linux)")
def test_extension_links_the_shared_libstdcxx():
    """The extension needs libstdc++.so.6 instead of carrying a static copy: a toolchain with
    only libstdc++.a (the lent GPU machine's) built one whose first error message crashed the
    process (SIGSEGV formatting TORCH_CHECK's text), so bad input could not raise."""
    from domino_ops import _C
    dynamic = subprocess.run(["readelf", "-d", _C.__file__], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert "libstdc++.so.6" in needed, needed


def test_error_from_the_extension_raises():
    """A TORCH_CHECK in the extension becomes a Python RuntimeError (in a subprocess, so a
    crash fails this test instead of killing the run)."""
    code = ("import torch, domino_ops\n"
            "try:\n"
            "    torch.ops.domino_ops.small_batch_linear(torch.randn(3, 2, 8), torch.randn(6, 8), None, torch.empty(3, 6))\n"
            "except RuntimeError as e:\n"
            "    print('raised:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "raised: x must have 2 dimensions" in done.stdout, (done.returncode, done.stderr[-2000:])
