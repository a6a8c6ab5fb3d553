// CUDA kernel of build_tree_kernel_efficient (sgl-kernel-compatible): EAGLE's draft
// selection -> the verify tree's attention mask, positions and first-child /
// next-sibling links. Same results as the CPU kernel (csrc/cpu/build_tree_kernel_efficient.cpp,
// whose header states the semantics) on valid input.
//
// Bytes per request: reads N-1 selected indices, the parent entries they name and the
// sequence lengths of the requests before it (FULL_MASK offsets; 8 B each); writes N
// positions and 3N links (8 B each) and N mask rows of N bools or 1/2/4 bytes: a few KiB
// at SGLang's sizes (N <= 64), far below any bandwidth limit. What limits it is the index
// chasing, as on the CPU: one block (a warp) per request, one thread per node; each
// thread's parent search is a linear scan of the N-1 selected indices (O(N) dependent-free
// loads, L1-resident) and its mask row a walk to the root through the parents kept in
// shared memory (O(depth)). So a launch costs about the launch latency for any batch
// that fits the GPU's SMs.
//
// Bad index values (which the CPU kernel rejects with an error) never become addresses:
// a selected index outside [0, topk * parents) makes its node an orphan (parent not found),
// a negative verified_seq_len counts as 0, a FULL_MASK request whose rows would not fit
// tree_mask gets no mask rows written, and a node that is its own ancestor (a parent cycle)
// is made an orphan. Orphans are not reported (the CPU kernel warns; a kernel cannot
// without a host sync).
#include "cuda/build_tree_kernel_efficient.cuh"
#include "cuda/tree_common.cuh"

namespace domino::cuda {
namespace {

constexpr int32_t kNoParent = -1;  // the root's parent, and an orphan's

__global__ void __launch_bounds__(kTreeThreads) build_tree_kernel(BuildTreeArgs a) {
  DOMINO_DYNAMIC_SHARED(int32_t, smem);  // parent[n], then depth[n]
  __shared__ long long scratch[kWarp];
  const int64_t b = blockIdx.x, n = a.n;
  int32_t* parent = smem;
  int32_t* depth = smem + n;
  const int64_t* sel = a.selected_index + b * (n - 1);
  const int64_t seq = max(a.verified_seq_len[b], int64_t{0});

  // FULL_MASK: this request's block starts after the blocks of requests 0..b-1; partial
  // sums saturate at mask_numel + 1 (a request past the end gets no rows).
  bool mask_ok = true;
  int64_t mask_offset = 0;
  if (a.mode == kTreeFullMask) {
    const long long cap = a.mask_numel + 1;
    long long part = 0;
    for (int64_t i = threadIdx.x; i < b; i += blockDim.x) {
      const int64_t s = max(a.verified_seq_len[i], int64_t{0});
      const long long size = s > a.mask_numel / n ? cap : (s + n) * n;
      part = min(cap, part + size);
    }
    mask_offset = block_sum(part, scratch);
    mask_ok = seq <= a.mask_numel / n && mask_offset <= a.mask_numel - (seq + n) * n;
  }

  // Pass 1: each node's parent, the first match of parent_list[b, slot] among the
  // selected indices (slot = selected / topk; slot 0 is the root).
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    int32_t par = kNoParent;
    if (i > 0) {
      const int64_t v = sel[i - 1];
      const int64_t slot = v >= 0 ? v / a.topk : a.parents;  // out of range: an orphan
      if (slot == 0) {
        par = 0;
      } else if (slot < a.parents) {
        const int64_t want = a.parent_list[b * a.parents + slot];
        for (int64_t j = 0; j < n - 1; ++j) {
          if (sel[j] == want) {
            par = static_cast<int32_t>(j + 1);
            break;
          }
        }
      }
    }
    parent[i] = par;
  }
  __syncthreads();
  // Pass 2: depths. A walk to the root or an orphan visits distinct nodes, so it takes at
  // most n - 1 steps; a longer one is a parent cycle (-1 here).
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    int32_t d = 0;
    for (int64_t cur = i; cur > 0; cur = parent[cur]) {
      if (++d >= n) {
        d = -1;
        break;
      }
    }
    depth[i] = d;
  }
  __syncthreads();
  // A node on or under a cycle is made an orphan (depth 1). No other walk passed through
  // it (those end), so their depths stand.
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (depth[i] < 0) {
      parent[i] = kNoParent;
      depth[i] = 1;
    }
  }
  __syncthreads();

  // Pass 3: write. Children are linked in ascending node order: u's first child is the
  // smallest node whose parent is u, a node's next sibling the next larger one with its
  // parent.
  const int64_t base = b * n;
  const int64_t packed = n > 16 ? 4 : (n > 8 ? 2 : 1);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    a.retrive_index[base + i] = base + i;
    a.positions[base + i] = seq + depth[i];
    int64_t first = -1, next = -1;
    for (int64_t j = 1; j < n; ++j) {
      if (parent[j] == i) {
        first = j;
        break;
      }
    }
    const int32_t par = parent[i];
    if (par != kNoParent) {
      for (int64_t j = i + 1; j < n; ++j) {
        if (parent[j] == par) {
          next = j;
          break;
        }
      }
    }
    a.retrive_next_token[base + i] = first;
    a.retrive_next_sibling[base + i] = next;

    // Mask row i: the root, i and i's ancestors.
    if (a.mode == kTreeQlenOnlyBitpacking) {
      uint32_t word = 1u;
      for (int64_t cur = i; cur > 0; cur = parent[cur]) word |= 1u << cur;
      uint8_t* row = a.tree_mask + (base + i) * packed;
      for (int64_t k = 0; k < packed; ++k) row[k] = static_cast<uint8_t>(word >> (8 * k));
    } else if (mask_ok) {
      uint8_t* row = a.mode == kTreeFullMask ? a.tree_mask + mask_offset + i * (seq + n) + seq
                                             : a.tree_mask + (base + i) * n;
      row[0] = 1;
      for (int64_t j = 1; j < n; ++j) row[j] = 0;
      for (int64_t cur = i; cur > 0; cur = parent[cur]) row[cur] = 1;
    }
  }
}

}  // namespace

cudaError_t launch_build_tree_kernel_efficient(const BuildTreeArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.bs)), block(kTreeThreads);
  const size_t smem = static_cast<size_t>(2 * args.n) * sizeof(int32_t);
  return DOMINO_LAUNCH(build_tree_kernel, grid, block, smem, stream, args);
}

}  // namespace domino::cuda
