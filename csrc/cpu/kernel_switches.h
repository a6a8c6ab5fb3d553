// The CPU kernels' run-time switches, each named by the environment variable that sets it
// at start-up:
//
//   DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH  the packed product's path (small_batch_linear_packed.cpp)
//   DOMINO_SMALL_BATCH_ATTENTION_SCORES    the attention's score path (small_batch_attention.cpp)
//   DOMINO_SMALL_BATCH_LINEAR_ISA          small_batch_linear's path (small_batch_linear.cpp)
//
// Each is read from the environment once, when domino_ops._C is imported (with the GIL
// held, so no Python thread writes os.environ meanwhile), and may be set since by
// set_kernel_switch (domino_ops.cpu.kernel_switch: tests and benchmarks switching paths in
// one process). Read at every call, as they were, they cost a scan of the environment per
// kernel call and raced another thread's os.environ writes (glibc's getenv is not safe
// against a concurrent setenv: a segfault). The values are checked where they are used,
// with the messages those kernels give.
#pragma once

#include <string>
#include <vector>

namespace domino::cpu {

enum class KernelSwitch { kPackedPath, kAttentionScores, kLinearIsa };

// The switch's value now, or nullptr when unset (an empty string is passed on as it is).
// A few nanoseconds: one atomic load.
const char* kernel_switch(KernelSwitch s);

// The switch named by its environment variable's name; a ValueError for another name.
KernelSwitch kernel_switch_named(const std::string& env_name);

// The switches' environment variables' names, in KernelSwitch's order (domino_ops.cpu.KERNEL_SWITCHES).
std::vector<std::string> kernel_switch_names();

// Sets the switch (nullptr: unset) for every call after this one, in every thread.
void set_kernel_switch(KernelSwitch s, const char* value);

// Reads the switches from the environment now, if nothing has yet (the module's import).
void read_kernel_switches();

}  // namespace domino::cpu
