// CPU kernel of build_tree_kernel_efficient (sgl-kernel-compatible): EAGLE's draft
// selection -> the verify tree's attention mask, positions and first-child /
// next-sibling links.
//
// Node 0 of request b is the root (the last verified token); node i >= 1 is the candidate
// selected_index[b, i-1], a flat index into the per-step candidate list. Its parent is the
// root when selected_index / topk == 0, else the node whose selected index equals
// parent_list[b, selected_index / topk] (first match). positions = seq_len + depth;
// children are linked in ascending node order; mask row t holds the root, t and t's
// ancestors (FULL_MASK: columns seq_len.., the caller's prefix columns left untouched;
// QLEN_ONLY: N bools; QLEN_ONLY_BITPACKING: bit j of a little-endian 1/2/4-byte word).
// Unlike sgl-kernel, every element of positions, retrive_* and the written mask rows is
// written (sgl-kernel needs retrive_next_* pre-filled with -1 and packed rows with 0); for
// such buffers the results are identical. A node whose parent was not selected (NaN draft
// scores upstream) is left unlinked with a warning, as sgl-kernel does; its mask row and
// position cover the part of its ancestry that was found (sgl-kernel's are undefined).
//
// Bytes moved per request: reads N-1 selected indices, the parent entries they name and a
// sequence length (8 B each); writes N positions and 3N links (8 B each) and N mask rows
// of N bools (FULL_MASK, QLEN_ONLY) or 1/2/4 bytes (bit-packed). That is a few KiB at
// SGLang's sizes (N <= 64), so what limits it is the index chasing: one linear search of
// the N-1 selected indices per node to find its parent (O(N^2) compares per request) and
// a walk to the root per mask row (O(N * depth)), all in L1: a few microseconds per request
// at N = 64, so requests run in parallel only for large batches.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "tree_ops.h"

namespace domino::cpu {
namespace {

constexpr int64_t kOrphan = -1;  // parent not among the selected nodes

}  // namespace

void build_tree_kernel_efficient_cpu(const at::Tensor& parent_list, const at::Tensor& selected_index,
                                     const at::Tensor& verified_seq_len, at::Tensor tree_mask,
                                     at::Tensor positions, at::Tensor retrive_index,
                                     at::Tensor retrive_next_token, at::Tensor retrive_next_sibling,
                                     int64_t topk, int64_t depth, int64_t draft_token_num,
                                     int64_t tree_mask_mode) {
  check_build_tree_args(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
                        retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode);
  const int64_t bs = selected_index.size(0), n = draft_token_num;
  const int64_t parents = topk * (depth - 1) + 1;  // parent_list's row stride
  if (bs == 0) return;
  const int64_t* sel = selected_index.const_data_ptr<int64_t>();
  const int64_t* seq = verified_seq_len.const_data_ptr<int64_t>();
  // Only read when a parent index > 0 exists, which the checks below allow only when
  // parent_list has its full [bs, parents] shape.
  const int64_t* plist = parent_list.numel() > 0 ? parent_list.const_data_ptr<int64_t>() : nullptr;

  constexpr int64_t kMaxSeqLen = int64_t{1} << 31;
  // Values used as addresses, all checked before anything is written.
  for (int64_t i = 0; i < bs * (n - 1); ++i) {
    TORCH_CHECK(sel[i] >= 0 && sel[i] / topk < parents, "selected_index must be in [0, topk * (topk * (depth - 1) + 1)) = [0, ",
                topk * parents, "), got ", sel[i], " at flat index ", i);
  }
  TORCH_CHECK(plist != nullptr || bs * (n - 1) == 0 || parents == 1, "parent_list is empty");
  const int64_t mask_numel = tree_mask.numel();
  std::vector<int64_t> mask_offset(bs);  // FULL_MASK: first element of request b's block
  int64_t total = 0;
  for (int64_t b = 0; b < bs; ++b) {
    // bounded so that positions (seq + depth) and the FULL_MASK sizes cannot overflow
    TORCH_CHECK(seq[b] >= 0 && seq[b] < kMaxSeqLen, "verified_seq_len must be a length in [0, 2^31), got ", seq[b],
                " at index ", b);
    if (tree_mask_mode == kFullMask) {
      TORCH_CHECK(seq[b] <= mask_numel / n, "tree_mask is too small for verified_seq_len[", b, "] = ", seq[b]);
      mask_offset[b] = total;
      total += (seq[b] + n) * n;
      TORCH_CHECK(total <= mask_numel, "tree_mask must hold sum(verified_seq_len) * draft_token_num + "
                  "bs * draft_token_num^2 elements in FULL_MASK mode, got ", mask_numel);
    }
  }

  // Pass 1: each node's parent node and depth (no writes to the outputs).
  std::vector<int64_t> parent(bs * n), node_depth(bs * n);
  // A request costs ~N^2 compares (a few us at N = 64): parallel only for large batches.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (n * n));
  at::parallel_for(0, bs, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t* s = sel + b * (n - 1);
      int64_t* par = parent.data() + b * n;
      int64_t* dep = node_depth.data() + b * n;
      par[0] = kOrphan;
      dep[0] = 0;
      for (int64_t i = 1; i < n; ++i) {
        const int64_t slot = s[i - 1] / topk;
        if (slot == 0) {
          par[i] = 0;
          continue;
        }
        const int64_t want = plist[b * parents + slot];
        const int64_t* hit = std::find(s, s + (n - 1), want);
        par[i] = hit == s + (n - 1) ? kOrphan : (hit - s) + 1;
      }
      for (int64_t i = 1; i < n; ++i) {
        int64_t d = 0;
        for (int64_t cur = i; cur > 0; cur = par[cur]) {
          TORCH_CHECK(++d < n, "parent_list and selected_index do not form a tree: node ", i,
                      " of request ", b, " is its own ancestor");
        }
        dep[i] = d;
      }
    }
  });

  const int64_t orphans = std::count(parent.begin(), parent.end(), kOrphan) - bs;  // minus the roots
  if (orphans > 0)
    TORCH_WARN("build_tree_kernel_efficient: invalid eagle tree, ", orphans, " draft token(s) whose parent was "
               "not selected were left unlinked (NaN or tied -inf draft scores?)");

  // Pass 2: write.
  int64_t* pos = positions.data_ptr<int64_t>();
  int64_t* rindex = retrive_index.data_ptr<int64_t>();
  int64_t* next_token = retrive_next_token.data_ptr<int64_t>();
  int64_t* next_sibling = retrive_next_sibling.data_ptr<int64_t>();
  auto* mask = static_cast<uint8_t*>(tree_mask.data_ptr());  // bool or packed bytes
  const int64_t packed = tree_mask_packed_bytes(n);
  at::parallel_for(0, bs, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t* par = parent.data() + b * n;
      const int64_t* dep = node_depth.data() + b * n;
      int64_t* nt = next_token + b * n;
      int64_t* ns = next_sibling + b * n;
      for (int64_t i = 0; i < n; ++i) {
        rindex[b * n + i] = b * n + i;
        pos[b * n + i] = seq[b] + dep[i];
        nt[i] = -1;
        ns[i] = -1;
      }
      // Prepending in descending order leaves each child list ascending.
      for (int64_t i = n - 1; i > 0; --i) {
        if (par[i] == kOrphan) continue;
        ns[i] = nt[par[i]];
        nt[par[i]] = i;
      }
      for (int64_t t = 0; t < n; ++t) {
        if (tree_mask_mode == kQlenOnlyBitpacking) {
          uint8_t* row = mask + (b * n + t) * packed;
          std::memset(row, 0, packed);
          row[0] = 1;
          for (int64_t cur = t; cur > 0; cur = par[cur]) row[cur / 8] |= uint8_t(1u << (cur % 8));
        } else {
          uint8_t* row = tree_mask_mode == kFullMask ? mask + mask_offset[b] + t * (seq[b] + n) + seq[b]
                                                     : mask + (b * n + t) * n;
          row[0] = 1;
          std::memset(row + 1, 0, n - 1);
          for (int64_t cur = t; cur > 0; cur = par[cur]) row[cur] = 1;
        }
      }
    }
  });
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("build_tree_kernel_efficient", &domino::cpu::build_tree_kernel_efficient_cpu); }
