// Scratch vectors that start on a cache line, for the CPU kernels' packed activations.
//
// The dot-product kernels load each activation vector as a full-width operand; a 64-byte
// (avx512) load that straddles two cache lines costs two. std::vector<float> only
// guarantees 16 bytes, so such a buffer straddled on every load whenever malloc's offset
// was not a multiple of 64, at random from run to run. Measured on the Zen 5 VM: head
// rollout w2 products at batch 8 (V = 151936, r = 256, bf16) 11 ms misaligned vs 6 ms
// aligned. small_batch_linear's packed x uses it too (interleaved runs of the build
// before and after measured no difference there: its tiles hold each x vector in a
// register across the tile's weight rows, so a split load is paid once per NR FMAs).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace domino::cpu {

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};

template <typename T>
using CacheLineVector = std::vector<T, CacheLineAllocator<T>>;
using AlignedFloats = CacheLineVector<float>;

}  // namespace domino::cpu
