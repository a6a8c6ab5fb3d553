"""Compiles every Triton kernel ahead of time for NVIDIA GPUs, without one:

    python -m domino_ops.triton.aot            # sm_80 and sm_90

A kernel that would fail to compile on a GPU fails here. Prints registers, spills and
shared memory per kernel. Must run without TRITON_INTERPRET (interpreted kernels cannot
be compiled); the tests run it in a subprocess.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as triton_compile

from domino_ops.triton import domino_head_expand as expand
from domino_ops.triton import domino_head_rollout as head
from domino_ops.triton import (build_tree_kernel_efficient, filtered_probs, sample, tree_speculative_sampling_target_only,
                               verify_greedy, verify_sampling, verify_tree_greedy, verify_tree_sampling)
from domino_ops.triton.row_sampler import BLOCK_V


def _specs():
    """(name, jit function, {arg: type or constexpr value}) per compiled variant."""
    specs = []
    for wt in ("fp32", "bf16"):
        for sampling_mode in ("greedy", "race", "filtered"):
            specs.append((f"_head_logits_kernel[{wt},{sampling_mode}]", head._head_logits_kernel, {
                "base_ptr": f"*{wt}", "w2_ptr": f"*{wt}", "a_ptr": "*fp32", "seeds_ptr": "*i64",
                "partial_ptr": "*fp32", "rows_ptr": "*fp32", "temperature_ptr": "*fp32", "top_k_ptr": "*i64",
                "top_p_ptr": "*fp32", "step": "i32", "k": "i32", "V": "i32", "r": "i32", "tiles": "i32",
                "MAY_SAMPLE": sampling_mode != "greedy", "MAY_FILTER": sampling_mode == "filtered",
                "WRITE_LOGITS": True, "TILE": head.TILE_V, "BLOCK_R": 32}))
            for table in (True, False):
                specs.append((f"_head_gru_kernel[{wt},{sampling_mode},table={table}]", head._head_gru_kernel, {
                    "partial_ptr": "*fp32", "tokens_ptr": "*i64", "logprobs_ptr": "*fp32", "s_in_ptr": "*fp32",
                    "s_out_ptr": "*fp32", "gru_input_ptr": f"*{wt}", "w_ih_ptr": f"*{wt}", "w_hh_ptr": f"*{wt}",
                    "temperature_ptr": "*fp32", "step": "i32", "k": "i32", "V": "i32", "G": "i32", "H": "i32",
                    "tiles": "i32", "MAY_SAMPLE": sampling_mode != "greedy", "MAY_FILTER": sampling_mode == "filtered",
                    "TABLE": table, "BLOCK_T": 1024, "BLOCK_C": head.BLOCK_C, "BLOCK_J": head.BLOCK_J}))
        specs.append((f"_head_input_kernel[{wt}]", head._head_input_kernel, {
            "hproj_ptr": "*fp32", "s_ptr": "*fp32", "w1s_ptr": f"*{wt}", "a_ptr": "*fp32", "step": "i32", "k": "i32",
            "r": "i32", "G": "i32", "BLOCK_C": head.BLOCK_C, "BLOCK_R": 32}))
        specs += _expand_specs(wt)
        specs.append((f"_head_choose_filtered_kernel[{wt}]", head._head_choose_filtered_kernel, {
            "partial_ptr": "*fp32", "rows_ptr": "*fp32", "uniforms_ptr": "*fp64", "tokens_ptr": "*i64",
            "logprobs_ptr": "*fp32", "temperature_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32",
            "step": "i32", "k": "i32", "V": "i32", "tiles": "i32", "BLOCK_T": 1024, "BLOCK_V": BLOCK_V}))
        for may_sample in (False, True):
            specs.append((f"_sample_kernel[{wt},may_sample={may_sample}]", sample._sample_kernel, {
                "logits_ptr": f"*{wt}", "uniforms_ptr": "*fp64", "tokens_ptr": "*i64", "temperature_ptr": "*fp32",
                "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "V": "i32", "MAY_SAMPLE": may_sample,
                "BLOCK": BLOCK_V}))
            specs.append((f"_filtered_probs_kernel[{wt},may_sample={may_sample}]", filtered_probs._filtered_probs_kernel, {
                "logits_ptr": f"*{wt}", "probs_ptr": "*fp32", "temperature_ptr": "*fp32", "top_k_ptr": "*i64",
                "top_p_ptr": "*fp32", "V": "i32", "MAY_SAMPLE": may_sample, "BLOCK": BLOCK_V}))
        specs.append((f"_verify_greedy_kernel[{wt}]", verify_greedy._verify_greedy_kernel, {
            "draft_ptr": "*i64", "logits_ptr": f"*{wt}", "out_ptr": "*i64", "accepted_ptr": "*i64", "k": "i32",
            "V": "i32", "BLOCK": BLOCK_V}))
    specs.append(("_verify_sampling_kernel", verify_sampling._verify_sampling_kernel, {
        "draft_ptr": "*i64", "q_ptr": "*fp32", "p_ptr": "*fp32", "ua_ptr": "*fp64", "ur_ptr": "*fp64",
        "out_ptr": "*i64", "accepted_ptr": "*i64", "k": "i32", "V": "i32", "BLOCK": BLOCK_V}))
    specs += _tree_specs()
    return specs


def _expand_specs(wt):
    """domino_head_expand's kernels for one weight dtype (greedy, sampled and per-node mixed
    children, both GRU inputs)."""
    specs = [(f"_expand_input_kernel[{wt}]", expand._expand_input_kernel, {
        "hproj_ptr": "*fp32", "state_ptr": "*fp32", "seq_ptr": "*i64", "depth_ptr": "*i64", "w1s_ptr": f"*{wt}",
        "a_ptr": "*fp32", "seqs": "i32", "k": "i32", "r": "i32", "G": "i32", "BLOCK_C": head.BLOCK_C,
        "BLOCK_R": 32})]
    for greedy in (True, False):  # tile partials when some node may be greedy
        specs.append((f"_expand_logits_kernel[{wt},greedy={greedy}]", expand._expand_logits_kernel, {
            "base_ptr": f"*{wt}", "w2_ptr": f"*{wt}", "a_ptr": "*fp32", "seq_ptr": "*i64", "depth_ptr": "*i64",
            "partial_ptr": "*fp32", "logits_ptr": "*fp32", "n": "i32", "seqs": "i32", "k": "i32", "V": "i32",
            "r": "i32", "tiles": "i32", "GREEDY": greedy, "TILE": head.TILE_V, "BLOCK_R": 32}))
    # (greedy, sampled): whether some node may be greedy / may sample; both with a per-sequence temperature
    for greedy, sampled in ((True, False), (False, True), (True, True)):
        name = f"_expand_children_kernel[{wt},greedy={greedy},sampled={sampled}]"
        specs.append((name, expand._expand_children_kernel, {
            "partial_ptr": "*fp32", "logits_ptr": "*fp32", "w_ptr": "*fp64", "uniforms_ptr": "*fp64",
            "tokens_ptr": "*i64", "logprobs_ptr": "*fp32", "seq_ptr": "*i64", "temperature_ptr": "*fp32",
            "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "cand_val_ptr": "*fp32", "cand_idx_ptr": "*i64", "m": "i32",
            "V": "i32", "seqs": "i32", "tiles": "i32", "n_cand": "i32", "n_first": "i32",
            "GREEDY": greedy, "SAMPLED": sampled, "BLOCK_T": 1024, "BLOCK_V": BLOCK_V, "BLOCK_CAND": 512}))
    specs.append((f"_expand_chunk_best_kernel[{wt}]", expand._expand_chunk_best_kernel, {
        "logits_ptr": "*fp32", "cand_val_ptr": "*fp32", "cand_idx_ptr": "*i64", "V": "i32", "chunks": "i32",
        "PER": expand.ONE_PASS_CHILDREN, "CHUNK": expand.CHOOSE_CHUNK_GPU}))
    for table in (True, False):
        specs.append((f"_expand_gru_kernel[{wt},table={table}]", expand._expand_gru_kernel, {
            "tokens_ptr": "*i64", "state_ptr": "*fp32", "child_state_ptr": "*fp32", "gru_input_ptr": f"*{wt}",
            "w_ih_ptr": f"*{wt}", "w_hh_ptr": f"*{wt}", "m": "i32", "G": "i32", "H": "i32", "TABLE": table,
            "BLOCK_C": head.BLOCK_C, "BLOCK_J": head.BLOCK_J}))
    return specs


def _tree_specs():
    """The tree ops at SGLang's sizes: N = 64 nodes (32 with bit-packed masks), 8 steps; and
    the tree builder at the most nodes it takes (256). ``mask_numel`` is the i32 a tensor
    below 2^31 elements passes (the variant that runs)."""
    specs = []
    for mode, name, packed, block_n in ((0, "full", 1, 64), (1, "qlen", 1, 64), (2, "bitpacking", 4, 32),
                                        (0, "full,256", 1, build_tree_kernel_efficient.MAX_NODES),
                                        (1, "qlen,256", 1, build_tree_kernel_efficient.MAX_NODES)):
        specs.append((f"_build_tree_kernel[{name}]", build_tree_kernel_efficient._build_tree_kernel, {
            "plist_ptr": "*i64", "sel_ptr": "*i64", "seq_ptr": "*i64", "mask_ptr": "*u8", "mask_numel": "i32",
            "pos_ptr": "*i64", "ridx_ptr": "*i64", "nt_ptr": "*i64", "ns_ptr": "*i64", "b_total": "i32",
            "topk": "i32", "parents": "i32", "n": "i32", "MODE": mode, "PACKED_BYTES": packed, "BLOCK_N": block_n,
            "BLOCK_B": 1024}))
    outputs = {"pred_ptr": "*i32", "acc_index_ptr": "*i32", "acc_num_ptr": "*i32", "cand_ptr": "*i64",
               "ridx_ptr": "*i64", "nt_ptr": "*i64", "ns_ptr": "*i64"}
    specs.append(("_verify_tree_greedy_kernel", verify_tree_greedy._verify_tree_greedy_kernel, {
        **outputs, "target_ptr": "*i64", "n": "i32", "steps": "i32", "limit": "i32", "BLOCK_N": 64, "BLOCK_S": 8}))
    for has_q in (False, True):
        specs.append((f"_tree_sampling_kernel[has_q={has_q}]", tree_speculative_sampling_target_only._tree_sampling_kernel, {
            **outputs, "coins_ptr": "*fp32", "final_ptr": "*fp32", "p_ptr": "*fp32", "q_ptr": "*fp32",
            "threshold_single": "fp32", "acc_div": "fp32", "n": "i32", "steps": "i32", "V": "i32", "limit": "i32",
            "HAS_Q": has_q, "BLOCK": BLOCK_V, "BLOCK_N": 64, "BLOCK_S": 8}))
    specs.append(("_verify_tree_sampling_kernel", verify_tree_sampling._verify_tree_sampling_kernel, {
        **outputs, "coins_ptr": "*fp64", "final_ptr": "*fp64", "p_ptr": "*fp32", "q_ptr": "*fp32", "ws_ptr": "*fp64",
        "n": "i32", "steps": "i32", "V": "i32", "limit": "i32", "BLOCK": BLOCK_V, "BLOCK_N": 64, "BLOCK_S": 8}))
    return specs


# Launch options of kernels that the wrappers launch with more than Triton's default 4 warps
# (a function of the variant's constexprs where that depends on them).
_OPTIONS = {head._head_gru_kernel: {"num_warps": head.GRU_WARPS},
            expand._expand_children_kernel: lambda c: {"num_warps": expand.children_warps(c["SAMPLED"])},
            expand._expand_gru_kernel: {"num_warps": head.GRU_WARPS},
            build_tree_kernel_efficient._build_tree_kernel: {"num_warps": build_tree_kernel_efficient.NUM_WARPS}}

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def ptxas_report(ptx: str, arch: str) -> tuple[int, int]:
    """(registers, spill bytes) that ptxas reports for one kernel's PTX (the register
    count is only known to the driver otherwise)."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([str(PTXAS), f"-arch={arch}", "-v", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", out))
    return regs, spills


def compile_all(capability: int):
    """Compiles every variant for cuda:<capability>; returns [(name, registers, spill
    bytes, shared bytes)]."""
    target = GPUTarget("cuda", capability, 32)
    report = []
    for name, fn, args in _specs():
        signature = {a: (v if isinstance(v, str) else "constexpr") for a, v in args.items()}
        constexprs = {a: v for a, v in args.items() if not isinstance(v, str)}
        options = _OPTIONS.get(fn, {})
        options = options(constexprs) if callable(options) else options
        compiled = triton_compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=target,
                                  options=options)
        regs, spills = ptxas_report(compiled.asm["ptx"], f"sm_{capability}{'a' if capability >= 90 else ''}")
        report.append((name, regs, spills, compiled.metadata.shared))
    return report


def main():
    """Command line: compiles the Triton kernels ahead of time for ``--capability`` (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capability", type=int, nargs="+", default=[80, 90])
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    for cc in args.capability:
        for name, regs, spills, shared in compile_all(cc):
            print(f"sm_{cc}  {name:52s} regs {regs:4d}  spill bytes {spills:5d}  shared {shared:6d} B")


if __name__ == "__main__":
    main()
