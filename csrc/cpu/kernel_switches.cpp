// The kernels' run-time switches (kernel_switches.h): read from the environment once, set
// since by set_kernel_switch. A value is an interned string that is never freed (one per
// distinct value a process sets: a handful), so a reader's pointer stays valid while
// another thread sets a new one.
#include "cpu/kernel_switches.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <iterator>
#include <mutex>

namespace domino::cpu {

namespace {

constexpr int kSwitches = 3;
constexpr const char* kNames[kSwitches] = {"DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH",
                                           "DOMINO_SMALL_BATCH_ATTENTION_SCORES", "DOMINO_SMALL_BATCH_LINEAR_ISA"};

const char* intern(const char* value) {
  static std::mutex mutex;
  static std::deque<std::string> values;  // a deque never moves what it holds
  std::lock_guard<std::mutex> lock(mutex);
  for (const std::string& v : values) {  // a switch set and restored per block reuses its strings
    if (v == value) return v.c_str();
  }
  return values.emplace_back(value).c_str();
}

struct Switches {
  std::atomic<const char*> values[kSwitches];
  Switches() {  // the environment at the first use: the import (read_kernel_switches)
    for (int i = 0; i < kSwitches; ++i) {
      const char* env = std::getenv(kNames[i]);
      values[i].store(env == nullptr ? nullptr : intern(env), std::memory_order_release);
    }
  }
};

Switches& switches() {
  static Switches s;  // initialised once, thread-safely
  return s;
}

}  // namespace

const char* kernel_switch(KernelSwitch s) {
  return switches().values[static_cast<int>(s)].load(std::memory_order_acquire);
}

KernelSwitch kernel_switch_named(const std::string& env_name) {
  for (int i = 0; i < kSwitches; ++i) {
    if (env_name == kNames[i]) return static_cast<KernelSwitch>(i);
  }
  static_assert(kSwitches == 3, "name every switch in this message");
  TORCH_CHECK_VALUE(false, "a kernel switch must be one of ", kNames[0], ", ", kNames[1], " or ", kNames[2],
                    ", got '", env_name, "'");
}

std::vector<std::string> kernel_switch_names() { return {std::begin(kNames), std::end(kNames)}; }

void set_kernel_switch(KernelSwitch s, const char* value) {
  switches().values[static_cast<int>(s)].store(value == nullptr ? nullptr : intern(value),
                                               std::memory_order_release);
}

void read_kernel_switches() { (void)switches(); }

}  // namespace domino::cpu
