// The launcher of the host SIMT emulation (see simt.h): TEST INFRASTRUCTURE ONLY.
#include "simt/simt.h"

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace simt {
namespace {

constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicShared = 48 * 1024;  // without cudaFuncSetAttribute

// A blocking barrier on a futex (C++20 atomic wait). std::barrier spins and yields and a
// mutex + condition variable makes every woken thread queue on the mutex; with hundreds
// of OS threads on a few cores both are far slower. A thread that leaves
// (arrive_and_drop) lowers the count for later phases, as an exited CUDA thread.
// Ordering: each arrival is an acq_rel RMW on count_ and the phase flip is a release that
// waiters acquire, so writes before the barrier happen-before reads after it (for TSan).
class Barrier {
 public:
  explicit Barrier(int n) : expected_(n), count_(n) {}
  void arrive_and_wait() {
    const uint32_t phase = phase_.load(std::memory_order_acquire);
    if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      next_phase();
      return;
    }
    while (phase_.load(std::memory_order_acquire) == phase) phase_.wait(phase, std::memory_order_acquire);
  }
  void arrive_and_drop() {
    expected_.fetch_sub(1, std::memory_order_acq_rel);
    if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) next_phase();
  }

 private:
  void next_phase() {
    count_.store(expected_.load(std::memory_order_acquire), std::memory_order_relaxed);
    phase_.fetch_add(1, std::memory_order_release);
    phase_.notify_all();
  }
  std::atomic<int> expected_, count_;
  std::atomic<uint32_t> phase_{0};
};

// Shuffle slots are double-buffered by the parity of the warp's exchange count, so one
// barrier per exchange suffices: a lane can only write the same buffer again after the
// next exchange's barrier, which every lane reaches after reading this one.
struct Warp {
  std::unique_ptr<Barrier> barrier;
  int live_lanes = 0;
  uint64_t slot[2][32] = {};
};

thread_local unsigned tl_exchanges = 0;  // this lane's exchange count (parity picks the buffer)

struct BlockState {
  std::unique_ptr<Barrier> barrier;
  std::vector<Warp> warps;
  std::vector<unsigned char> dynamic_shared;
};

thread_local BlockState* tl_block = nullptr;
thread_local int tl_thread = 0;
thread_local cudaError_t tl_last_error = cudaSuccess;

Warp& my_warp() { return tl_block->warps[tl_thread / 32]; }

}  // namespace

cudaError_t launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   const std::function<void()>& block_body) {
  const uint64_t n = uint64_t{block.x} * block.y * block.z;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  if (n == 0 || n > kMaxThreadsPerBlock || block.z > 64 || blocks == 0 || grid.y > 65535 ||
      grid.z > 65535 || dynamic_shared_bytes > kMaxDynamicShared) {
    tl_last_error = cudaErrorInvalidConfiguration;
    return tl_last_error;
  }
  const int threads = static_cast<int>(n);
  BlockState state;
  state.dynamic_shared.resize(std::max<size_t>(dynamic_shared_bytes, 16));
  state.warps = std::vector<Warp>((threads + 31) / 32);
  auto reset_block = [&] {
    state.barrier = std::make_unique<Barrier>(threads);
    for (size_t w = 0; w < state.warps.size(); ++w) {
      state.warps[w].live_lanes = std::min(32, threads - static_cast<int>(w) * 32);
      state.warps[w].barrier = std::make_unique<Barrier>(state.warps[w].live_lanes);
    }
    std::memset(state.dynamic_shared.data(), 0xFF, state.dynamic_shared.size());
  };
  // Two phases per block on one gate: "start" (the launcher has reset the block state)
  // and "end" (every thread has left the kernel body).
  Barrier gate(threads + 1);
  std::mutex error_mutex;
  std::exception_ptr error;
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      tl_block = &state;
      tl_thread = t;
      threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      blockDim = block;
      gridDim = grid;
      for (uint64_t b = 0; b < blocks; ++b) {
        gate.arrive_and_wait();
        tl_exchanges = 0;
        blockIdx = {static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                    static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y))};
        try {
          block_body();
        } catch (...) {
          const std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
        // Leaving the kernel: later barriers of this block no longer wait for this thread.
        state.barrier->arrive_and_drop();
        my_warp().barrier->arrive_and_drop();
        gate.arrive_and_wait();
      }
    });
  }
  for (uint64_t b = 0; b < blocks; ++b) {
    reset_block();
    gate.arrive_and_wait();  // start
    gate.arrive_and_wait();  // end
  }
  for (auto& w : workers) w.join();
  if (error) std::rethrow_exception(error);
  tl_last_error = cudaSuccess;
  return cudaSuccess;
}

void* dynamic_shared_memory() { return tl_block->dynamic_shared.data(); }

void sync_block() { tl_block->barrier->arrive_and_wait(); }

void sync_warp() { my_warp().barrier->arrive_and_wait(); }

int lane_id() { return tl_thread % 32; }

uint64_t warp_exchange(uint64_t bits, int src_lane) {
  Warp& w = my_warp();
  uint64_t* slot = w.slot[tl_exchanges++ & 1];
  slot[lane_id()] = bits;
  w.barrier->arrive_and_wait();
  return (src_lane >= 0 && src_lane < w.live_lanes) ? slot[src_lane] : bits;
}

}  // namespace simt

unsigned __ballot_sync(unsigned mask, int predicate) {
  simt::Warp& w = simt::my_warp();
  uint64_t* slot = w.slot[simt::tl_exchanges++ & 1];
  slot[simt::lane_id()] = predicate != 0;
  w.barrier->arrive_and_wait();
  unsigned ballot = 0;
  for (int l = 0; l < w.live_lanes; ++l) ballot |= static_cast<unsigned>(slot[l] != 0) << l;
  return ballot & mask;
}

int __all_sync(unsigned mask, int predicate) {
  const unsigned live = simt::my_warp().live_lanes == 32
                            ? 0xffffffffu
                            : (1u << simt::my_warp().live_lanes) - 1u;
  return __ballot_sync(mask, predicate) == (mask & live);
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = simt::tl_last_error;
  simt::tl_last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    default: return "invalid argument";
  }
}
