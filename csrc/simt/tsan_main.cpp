// TEST INFRASTRUCTURE: a ThreadSanitizer build of one self-test reduction through the SIMT
// emulator. `tsan_main sync` must run clean; `tsan_main nosync` (the kernel without its
// __syncthreads) must make TSan report a data race. Built and run by
// tests/test_simt_emulator.py.
#include <cstdio>
#include <cstring>

#include "simt/selftest_kernels.cuh"

int main(int argc, char** argv) {
  const bool sync = argc > 1 && std::strcmp(argv[1], "sync") == 0;
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7);
  // Several launches: TSan keeps a few shadow cells per 8 bytes, so one racing pair can
  // be evicted before it is compared; repeats make a missed report vanishingly unlikely.
  for (int rep = 0; rep < 8; ++rep) {
    const float sum = domino::simt_selftest::block_sum(x, 2, 64, sync);
    if (rep == 0) std::printf("sum=%g\n", sum);
  }
  return 0;
}
