// The launcher of the host SIMT emulation (see simt.h): TEST INFRASTRUCTURE ONLY.
//
// Every CUDA thread of a block is a fiber (its own stack, switched in user space) on the
// launching OS thread. A scheduler resumes the block's runnable fibers in passes, each
// running until it reaches a barrier (__syncthreads, a warp exchange) or leaves the kernel;
// passes alternate between ascending and descending thread order, and odd blocks start
// descending, so that between two barriers a grid of several blocks runs its threads in
// both orders: a thread missing a barrier reads its partners' slots before they are
// written in one of them. A switch costs a few nanoseconds on x86-64, where OS threads
// woken at every barrier cost microseconds each: the tests' emulated kernels run 20-100x
// faster than they did on one OS thread per CUDA thread (a sampled row 4.6 -> 0.2 ms on a
// Zen 3 VM). If no fiber can run while some wait (threads of a block stopped at
// different barriers, undefined behaviour on a GPU), the launch throws instead of hanging.
//
// Under ThreadSanitizer every fiber is a TSan fiber switched without synchronisation, and
// a barrier is a release on arrival and an acquire on leaving, so TSan reports a missing
// barrier as a data race between threads (tests/test_simt_emulator.py).
#include "simt/simt.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define SIMT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SIMT_TSAN 1
#endif
#endif

#ifdef SIMT_TSAN
#include <sanitizer/tsan_interface.h>
extern "C" {
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}
#endif

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace simt {
namespace {

constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicShared = 48 * 1024;  // without cudaFuncSetAttribute
// Per fiber, reserved (pages are committed when first touched) above a guard page.
constexpr size_t kStackBytes = 256 * 1024;

// ---- ThreadSanitizer annotations (no-ops in other builds) ------------------------------

#ifdef SIMT_TSAN
void tsan_release(void* addr) { __tsan_release(addr); }
void tsan_acquire(void* addr) { __tsan_acquire(addr); }
void* tsan_current_fiber() { return __tsan_get_current_fiber(); }
void* tsan_create_fiber() { return __tsan_create_fiber(0); }
void tsan_destroy_fiber(void* fiber) { __tsan_destroy_fiber(fiber); }
// To be called right before switching to `fiber`; `sync`: what ran before happens-before
// what the fiber runs next (otherwise only barriers order fibers, as threads).
void tsan_switch_to_fiber(void* fiber, bool sync) {
  __tsan_switch_to_fiber(fiber, sync ? 0 : __tsan_switch_to_fiber_no_sync);
}
// The scheduler's own bookkeeping (which fiber waits where, threadIdx written before each
// resume) is shared by all fibers without synchronisation by design: kept out of TSan.
struct Bookkeeping {
  Bookkeeping() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~Bookkeeping() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
};
#else
void tsan_release(void*) {}
void tsan_acquire(void*) {}
void* tsan_current_fiber() { return nullptr; }
void* tsan_create_fiber() { return nullptr; }
void tsan_destroy_fiber(void*) {}
void tsan_switch_to_fiber(void*, bool) {}
struct Bookkeeping {
  Bookkeeping() {}  // user-provided: `Bookkeeping b;` is then not an unused-variable warning
};
#endif

// ---- stacks and context switches ---------------------------------------------------------

// An mmap'd stack with a PROT_NONE guard page below it (an overflow faults, never writes
// into a neighbour), kept by its OS thread for later launches.
class Stack {
 public:
  Stack() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = kStackBytes + page;
    base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base_ == MAP_FAILED) throw std::runtime_error("SIMT emulator: cannot map a fiber stack");
    mprotect(base_, page, PROT_NONE);
  }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  ~Stack() { munmap(base_, bytes_); }
  char* top() const { return static_cast<char*>(base_) + bytes_; }
  void* bottom() const { return base_; }
  size_t size() const { return bytes_; }

 private:
  void* base_;
  size_t bytes_;
};

[[noreturn]] void fiber_main();

#if defined(__x86_64__)
// Saves the callee-saved registers and the stack pointer of the running context in
// *save_sp, then continues the context whose stack pointer is load_sp (SysV ABI: the
// caller saves everything else; the kernels leave MXCSR and the x87 control word alone).
extern "C" __attribute__((visibility("hidden"))) void simt_switch_stack(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .globl simt_switch_stack
  .hidden simt_switch_stack
  .type simt_switch_stack, @function
simt_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size simt_switch_stack, .-simt_switch_stack
)");

struct Context {
  void* sp = nullptr;
};

// A context that enters fiber_main on `stack` when first switched to: six zeroed
// callee-saved registers, then fiber_main as the return address of simt_switch_stack, above
// it a null return address for fiber_main itself (which never returns), so that fiber_main
// starts with the stack aligned as after a call.
void start_context(Context& c, const Stack& stack) {
  auto** sp = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(stack.top()) & ~uintptr_t{15});
  *--sp = nullptr;
  *--sp = reinterpret_cast<void*>(&fiber_main);
  for (int i = 0; i < 6; ++i) *--sp = nullptr;
  c.sp = sp;
}
void switch_context(Context& from, Context& to) { simt_switch_stack(&from.sp, to.sp); }
#else
// Elsewhere the portable ucontext switch (a signal-mask system call per switch, slower).
struct Context {
  ucontext_t uc;
};
void start_context(Context& c, const Stack& stack) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack.bottom();
  c.uc.uc_stack.ss_size = stack.size();
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fiber_main, 0);
}
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- fibers, barriers, the scheduler ------------------------------------------------------

class Barrier;

struct Fiber {
  Context context;
  uint3 thread_index;
  int thread = 0;               // linear index in the block
  unsigned exchanges = 0;       // warp exchanges so far (their parity picks the slot buffer)
  const Barrier* waiting_on = nullptr;
  uint32_t waiting_phase = 0;   // runnable again once waiting_on has left this phase
  bool done = false;
  void* tsan_fiber = nullptr;
};

// The launch running on this OS thread: its fibers, the running one, and the context the
// scheduler itself runs in.
struct Launch {
  Context scheduler;
  void* tsan_scheduler = nullptr;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;
};
thread_local Launch* tl_launch = nullptr;
thread_local std::vector<std::unique_ptr<Stack>> tl_stacks;  // this OS thread's fiber stacks, reused

// Switches from the running fiber back to the scheduler; returns when it is resumed.
// `last`: the fiber has left the kernel and its TSan fiber may be destroyed; its history
// then happens-before the scheduler's (which starts the next block on the same stacks).
void yield_to_scheduler(bool last = false) {
  Launch& l = *tl_launch;
  tsan_switch_to_fiber(l.tsan_scheduler, /*sync=*/last);
  switch_context(l.current->context, l.scheduler);
}

// A block-wide or warp-wide barrier of fibers. A thread that leaves the kernel
// (arrive_and_drop) lowers the count for later phases, as an exited CUDA thread.
class Barrier {
 public:
  explicit Barrier(int n) : expected_(n), count_(n) {}
  void arrive_and_wait() {
    uint32_t phase;
    {
      Bookkeeping b;
      phase = phase_;
      Fiber& f = *tl_launch->current;
      if (--count_ == 0) {
        next_phase();
      } else {
        f.waiting_on = this;
        f.waiting_phase = phase;
      }
    }
    tsan_release(&sync_[phase & 1]);
    yield_to_scheduler();
    tsan_acquire(&sync_[phase & 1]);  // every arrival of this phase, none of the next
  }
  void arrive_and_drop() {
    tsan_release(&sync_[phase_ & 1]);  // as an arrival: the thread's writes are in this phase
    Bookkeeping b;
    --expected_;
    if (--count_ == 0) next_phase();
  }
  bool passed(uint32_t phase) const { return phase_ != phase; }

 private:
  void next_phase() {
    count_ = expected_;
    ++phase_;
  }
  int expected_, count_;
  uint32_t phase_ = 0;
  // TSan synchronisation addresses, by the phase's parity: a fiber acquires its phase's
  // only after that phase is over, when no thread can have arrived at the phase after next.
  char sync_[2] = {};
};

// Shuffle slots are double-buffered by the parity of the warp's exchange count, so one
// barrier per exchange suffices: a lane can only write the same buffer again after the
// next exchange's barrier, which every lane reaches after reading this one.
struct Warp {
  std::unique_ptr<Barrier> barrier;
  int live_lanes = 0;
  uint64_t slot[2][32] = {};
};

struct BlockState {
  std::unique_ptr<Barrier> barrier;
  std::vector<Warp> warps;
  std::vector<unsigned char> dynamic_shared;
};

thread_local BlockState* tl_block = nullptr;
thread_local cudaError_t tl_last_error = cudaSuccess;

Fiber& current_fiber() { return *tl_launch->current; }
Warp& my_warp() { return tl_block->warps[current_fiber().thread / 32]; }

// Where every fiber starts: first back to the scheduler (which starts all of a block's
// fibers before running any, so that under TSan none inherits another's history), then
// the kernel body; an exception ends this thread and is rethrown by the launch.
[[noreturn]] void fiber_main() {
  yield_to_scheduler();
  try {
    (*tl_launch->body)();
  } catch (...) {
    Bookkeeping b;
    if (!tl_launch->error) tl_launch->error = std::current_exception();
  }
  // Leaving the kernel: later barriers of this block no longer wait for this thread.
  tl_block->barrier->arrive_and_drop();
  my_warp().barrier->arrive_and_drop();
  {
    Bookkeeping b;
    current_fiber().done = true;
  }
  yield_to_scheduler(/*last=*/true);
  __builtin_trap();  // a finished fiber is never resumed
}

// Runs `fiber` until it next yields.
void resume(Launch& l, Fiber& fiber, bool first) {
  {
    Bookkeeping b;
    l.current = &fiber;
    threadIdx = fiber.thread_index;
  }
  tsan_switch_to_fiber(fiber.tsan_fiber, /*sync=*/first);  // the launch's setup happens-before
  switch_context(l.scheduler, fiber.context);
}

// Runs one block: its fibers in passes, alternating the order (the first ascending or
// not), until all have left.
void run_block(Launch& l, int threads, bool first_ascending) {
  for (Fiber& f : l.fibers) {
    f.exchanges = 0;
    f.waiting_on = nullptr;
    f.done = false;
  }
  for (int t = 0; t < threads; ++t) {
    Fiber& f = l.fibers[t];
    f.tsan_fiber = tsan_create_fiber();
    start_context(f.context, *tl_stacks[t]);
    resume(l, f, /*first=*/true);  // to fiber_main's first yield
  }
  int live = threads;
  for (bool ascending = first_ascending; live > 0; ascending = !ascending) {
    bool ran = false;
    for (int i = 0; i < threads; ++i) {
      Fiber& f = l.fibers[ascending ? i : threads - 1 - i];
      if (f.done || (f.waiting_on != nullptr && !f.waiting_on->passed(f.waiting_phase))) continue;
      f.waiting_on = nullptr;
      resume(l, f, /*first=*/false);
      ran = true;
      if (f.done) {
        --live;
        tsan_destroy_fiber(f.tsan_fiber);
      }
    }
    if (!ran)
      throw std::runtime_error("SIMT emulator: deadlock in block (" + std::to_string(blockIdx.x) + ", " +
                               std::to_string(blockIdx.y) + ", " + std::to_string(blockIdx.z) + "): " +
                               std::to_string(live) +
                               " threads wait at barriers that cannot complete (a __syncthreads or warp "
                               "operation under divergent control flow)");
  }
}

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
  if (tl_launch != nullptr) throw std::logic_error("SIMT emulator: a kernel launched another kernel");
  const int threads = static_cast<int>(n);
  while (tl_stacks.size() < static_cast<size_t>(threads)) tl_stacks.push_back(std::make_unique<Stack>());
  BlockState state;
  state.dynamic_shared.resize(std::max<size_t>(dynamic_shared_bytes, 16));
  state.warps = std::vector<Warp>((threads + 31) / 32);
  Launch l;
  l.body = &block_body;
  l.fibers.resize(threads);
  for (int t = 0; t < threads; ++t) {
    const unsigned u = static_cast<unsigned>(t);
    l.fibers[t].thread = t;
    l.fibers[t].thread_index = {u % block.x, (u / block.x) % block.y, u / (block.x * block.y)};
  }
  l.tsan_scheduler = tsan_current_fiber();
  struct Restore {  // however the launch ends, the OS thread is the host again
    ~Restore() { tl_launch = nullptr, tl_block = nullptr; }
  } restore;
  tl_launch = &l;
  tl_block = &state;
  blockDim = block;
  gridDim = grid;
  for (uint64_t b = 0; b < blocks; ++b) {
    state.barrier = std::make_unique<Barrier>(threads);
    for (size_t w = 0; w < state.warps.size(); ++w) {
      state.warps[w].live_lanes = std::min(32, threads - static_cast<int>(w) * 32);
      state.warps[w].barrier = std::make_unique<Barrier>(state.warps[w].live_lanes);
    }
    std::memset(state.dynamic_shared.data(), 0xFF, state.dynamic_shared.size());
    blockIdx = {static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y))};
    run_block(l, threads, /*first_ascending=*/b % 2 == 0);
  }
  if (l.error) std::rethrow_exception(l.error);
  tl_last_error = cudaSuccess;
  return cudaSuccess;
}

void* dynamic_shared_memory() { return tl_block->dynamic_shared.data(); }

void sync_block() { tl_block->barrier->arrive_and_wait(); }

void sync_warp() { my_warp().barrier->arrive_and_wait(); }

int lane_id() { return current_fiber().thread % 32; }

uint64_t warp_exchange(uint64_t bits, int src_lane) {
  Warp& w = my_warp();
  uint64_t* slot = w.slot[current_fiber().exchanges++ & 1];
  slot[lane_id()] = bits;
  w.barrier->arrive_and_wait();
  return (src_lane >= 0 && src_lane < w.live_lanes) ? slot[src_lane] : bits;
}

}  // namespace simt

unsigned __ballot_sync(unsigned mask, int predicate) {
  simt::Warp& w = simt::my_warp();
  uint64_t* slot = w.slot[simt::current_fiber().exchanges++ & 1];
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
