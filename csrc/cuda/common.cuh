// Device helpers shared by the kernels in csrc/cuda/: element loads (16-byte vectors on
// the weight streams), warp/block reductions, the ordered integer key of a float, and the
// Philox4x32-10 counter-based generator. Everything here also runs under the SIMT
// emulator (csrc/simt/), so it uses only shuffles, shared memory and barriers.
#pragma once

#include "cuda/portable.cuh"

namespace domino::cuda {

constexpr int kWarp = 32;

// Threads per block of every kernel here. Kernels read blockDim.x and work for any whole
// number of warps up to this; under the emulator, blocks of two warps let the tests' small
// shapes span several tiles while still exercising cross-warp reductions.
#if defined(DOMINO_SIMT) && !defined(DOMINO_SIMT_GPU_SHAPES)
constexpr int kBlockThreads = 64;
#else
constexpr int kBlockThreads = 256;
#endif

// ---- loads ----------------------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void store_from_float(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_from_float(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

// Elements per 16-byte vector.
template <typename T>
struct Vec16 {
  static constexpr int n = 16 / sizeof(T);
};

// Loads 16 bytes (8 bf16 or 4 floats) at p, which must be 16-byte aligned, as floats.
__device__ __forceinline__ void load16(const __nv_bfloat16* p, float* out) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);          // low half: the even element
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void load16(const float* p, float* out) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Dot product of row[0:n] (global) with x[0:n] (shared, float) by one warp; every lane
// returns the full sum. Uses 16-byte loads when every row of the matrix is 16-byte aligned
// (`vec`), scalar loads otherwise (awkward widths such as r = 1 or G = 33).
template <typename W>
__device__ __forceinline__ float warp_dot(const W* row, const float* x, int n, bool vec) {
  const int lane = threadIdx.x % kWarp;
  float acc = 0.0f;
  if (vec) {
    constexpr int kv = Vec16<W>::n;
    for (int c = lane * kv; c < n; c += kWarp * kv) {
      float w[kv];
      load16(row + c, w);
#pragma unroll
      for (int e = 0; e < kv; ++e) acc += w[e] * x[c + e];
    }
  } else {
    for (int c = lane; c < n; c += kWarp) acc += to_float(row[c]) * x[c];
  }
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

// ---- reductions -----------------------------------------------------------------------
// (value, index) maximum; ties go to the lower index, as torch.argmax.
struct ArgMax {
  float val;
  int64_t idx;
};
// torch.argmax's order: a NaN beats every number, then the larger value, then the lower
// index. a comes strictly before b in it (for distinct indices, a strict order).
__device__ __forceinline__ bool greedy_before(ArgMax a, ArgMax b) {
  const bool a_nan = a.val != a.val, b_nan = b.val != b.val;
  if (a_nan || b_nan) return a_nan && b_nan ? a.idx < b.idx : a_nan;
  return a.val > b.val || (a.val == b.val && a.idx < b.idx);
}
__device__ __forceinline__ ArgMax argmax_merge(ArgMax a, ArgMax b) { return greedy_before(b, a) ? b : a; }
__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    ArgMax o{__shfl_xor_sync(0xffffffffu, a.val, off), __shfl_xor_sync(0xffffffffu, a.idx, off)};
    a = argmax_merge(a, o);
  }
  return a;
}

// Block-wide reductions for blocks of whole warps (blockDim.x % 32 == 0, at most 1024
// threads). Every thread returns the result. `scratch` is shared memory of 32 elements;
// the trailing barrier makes it reusable by the next call.
__device__ __forceinline__ ArgMax block_argmax(ArgMax a, ArgMax* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  a = warp_argmax(a);
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  ArgMax r = scratch[0];
  for (int w = 1; w < warps; ++w) r = argmax_merge(r, scratch[w]);
  __syncthreads();
  return r;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// Warp shuffles, then one pass over the warps' results in a fixed order (deterministic).
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* scratch, Op op) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < warps; ++w) r = op(r, scratch[w]);
  __syncthreads();
  return r;
}

template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  return block_reduce(v, scratch, SumOp{});
}

template <typename T>
__device__ __forceinline__ T block_max(T v, T* scratch) {
  return block_reduce(v, scratch, MaxOp{});
}

// Exclusive prefix sum over the block's threads (in thread order) of one value each.
// `scratch` holds blockDim.x elements.
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T v, T* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    T run = 0;
    for (unsigned t = 0; t < blockDim.x; ++t) {
      const T x = scratch[t];
      scratch[t] = run;
      run += x;
    }
  }
  __syncthreads();
  const T r = scratch[threadIdx.x];
  __syncthreads();
  return r;
}

// ---- ordering and randomness ----------------------------------------------------------
// A uint32 whose unsigned order is the float order (-inf < ... < +0 < ... < +inf), -0 and
// +0 one key: they compare equal, so they tie (in index order) as in the reference. (With
// distinct keys a row [-0, +0] ranked +0 first: top-p kept token 1 where the reference keeps
// token 0; z = (x - max) / T is -0 for x = -0 whenever max is +0.)
__device__ __forceinline__ unsigned float_key(float f) {
  const unsigned u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Philox4x32-10 (Salmon et al., SC'11): four 32-bit outputs for (counter, key).
struct Philox4 {
  unsigned v[4];
};
__device__ __forceinline__ Philox4 philox4x32_10(unsigned c0, unsigned c1, unsigned c2, unsigned c3,
                                                 unsigned k0, unsigned k1) {
  constexpr unsigned kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const unsigned hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const unsigned hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

// An Exp(1) variate for element `index` of the stream keyed by `seed`. The uniform has 24
// bits and is centred in its cell, so it is never 0 or 1.
__device__ __forceinline__ float exponential_variate(uint64_t seed, uint64_t index) {
  const Philox4 r = philox4x32_10(static_cast<unsigned>(index), static_cast<unsigned>(index >> 32), 0u,
                                  0u, static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32));
  const float u = (static_cast<float>(r.v[0] >> 8) + 0.5f) * (1.0f / 16777216.0f);
  return -logf(u);
}

}  // namespace domino::cuda
