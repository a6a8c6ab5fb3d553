// Which instruction-set build of the CPU kernels runs (see isa.h): detection, the
// DOMINO_CPU_ISA override (read once) and the test/benchmark switch.
#include "cpu/isa_select.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace domino::cpu {

#define DOMINO_DECLARE_ISA(isa) \
  namespace isa {               \
  extern const Kernels kKernels; \
  }
#ifdef DOMINO_CPU_ISA_AVX512
DOMINO_DECLARE_ISA(avx512)
#endif
#ifdef DOMINO_CPU_ISA_AVX2
DOMINO_DECLARE_ISA(avx2)
#endif
#ifdef DOMINO_CPU_ISA_SSE2
DOMINO_DECLARE_ISA(sse2)
#endif
#ifdef DOMINO_CPU_ISA_GENERIC
DOMINO_DECLARE_ISA(generic)
#endif

namespace {

struct Build {
  const Kernels* kernels;
  const char* requires_;  // what the CPU must support, for error messages
  bool (*supported)();
};

#if defined(__x86_64__) && defined(__GNUC__)
// The -march level each build is compiled for (GCC >= 12 and clang >= 16 know the level
// names; libgcc also checks that the OS saves the AVX / AVX-512 register state).
bool has_v4() { return __builtin_cpu_supports("x86-64-v4"); }
bool has_v3() { return __builtin_cpu_supports("x86-64-v3"); }
#endif
bool always() { return true; }

// Widest first: "auto" takes the first supported one.
const std::vector<Build>& builds() {
  static const std::vector<Build> all = {
#ifdef DOMINO_CPU_ISA_AVX512
      {&avx512::kKernels, "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL)", &has_v4},
#endif
#ifdef DOMINO_CPU_ISA_AVX2
      {&avx2::kKernels, "x86-64-v3 (AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE)", &has_v3},
#endif
#ifdef DOMINO_CPU_ISA_SSE2
      {&sse2::kKernels, "x86-64 (SSE2)", &always},
#endif
#ifdef DOMINO_CPU_ISA_GENERIC
      {&generic::kKernels, "any CPU", &always},
#endif
  };
  return all;
}

std::string join_names(bool only_supported) {
  std::string out;
  for (const Build& b : builds()) {
    if (only_supported && !b.supported()) continue;
    if (!out.empty()) out += ", ";
    out += b.kernels->name;
  }
  return out;
}

// The table for `name` ("auto" or a build name), or an error message.
const Kernels* resolve(const std::string& name, const char* source, std::string* error) {
  if (name.empty() || name == "auto") {
    for (const Build& b : builds())
      if (b.supported()) return b.kernels;
    *error = "no CPU kernel build runs on this CPU";  // unreachable: the baseline always runs
    return nullptr;
  }
  for (const Build& b : builds()) {
    if (name != b.kernels->name) continue;
    if (b.supported()) return b.kernels;
    *error = std::string(source) + "='" + name + "': this CPU does not support the " + name +
             " build (it needs " + b.requires_ + "); builds this machine runs: " +
             join_names(true);
    return nullptr;
  }
  *error = std::string(source) + "='" + name + "' is not a CPU kernel build; expected auto or one of: " +
           join_names(false) + " (this machine runs: " + join_names(true) + ")";
  return nullptr;
}

struct Choice {
  const Kernels* kernels = nullptr;
  std::string error;  // set when DOMINO_CPU_ISA is invalid
};

// DOMINO_CPU_ISA, read and validated once.
const Choice& env_choice() {
  static const Choice choice = [] {
    Choice c;
    const char* env = std::getenv("DOMINO_CPU_ISA");
    c.kernels = resolve(env != nullptr ? env : "", "DOMINO_CPU_ISA", &c.error);
    return c;
  }();
  return choice;
}

std::atomic<const Kernels*> forced{nullptr};

}  // namespace

const Kernels& kernels() {
  if (const Kernels* k = forced.load(std::memory_order_acquire)) return *k;
  const Choice& c = env_choice();
  TORCH_CHECK_VALUE(c.kernels != nullptr, c.error);
  return *c.kernels;
}

std::string active_isa() { return kernels().name; }

std::vector<std::string> compiled_isas() {
  std::vector<std::string> out;
  for (const Build& b : builds()) out.push_back(b.kernels->name);
  return out;
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> out;
  for (const Build& b : builds())
    if (b.supported()) out.push_back(b.kernels->name);
  return out;
}

void force_isa(const std::string& name) {
  if (name.empty()) {  // back to DOMINO_CPU_ISA / auto
    forced.store(nullptr, std::memory_order_release);
    return;
  }
  std::string error;
  const Kernels* k = resolve(name, "isa", &error);
  TORCH_CHECK_VALUE(k != nullptr, error);
  forced.store(k, std::memory_order_release);
}

std::string cpu_model() {
  std::string model;
#if defined(__x86_64__) || defined(_M_X64)
  unsigned int regs[12] = {};
  unsigned int max_ext = __get_cpuid_max(0x80000000u, nullptr);
  if (max_ext >= 0x80000004u) {
    for (unsigned int i = 0; i < 3; ++i)
      __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    model.assign(reinterpret_cast<const char*>(regs), sizeof(regs));
    model = model.c_str();  // up to the first NUL
  }
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    unsigned int family = (eax >> 8) & 0xf, modelno = (eax >> 4) & 0xf;
    if (family == 0xf) family += (eax >> 20) & 0xff;
    if (family >= 6) modelno += ((eax >> 16) & 0xf) << 4;
    model += " (family " + std::to_string(family) + ", model " + std::to_string(modelno) + ")";
  }
#else
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    const auto colon = line.find(':');
    if (colon != std::string::npos && (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0)) {
      model = line.substr(colon + 2);
      break;
    }
  }
#endif
  const auto first = model.find_first_not_of(' ');
  return first == std::string::npos ? std::string("unknown CPU") : model.substr(first);
}

}  // namespace domino::cpu
