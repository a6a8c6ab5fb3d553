// The 64-byte LDTILECFG operand (palette 1) of Intel AMX, shared by the kernels that load
// tiles (small_batch_linear_packed_amx.cpp, the attention scores in vec.cpp). A plain
// struct: safe to include in the per-ISA translation units.
#pragma once

#include <cstdint>

namespace domino::cpu {

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile t
  uint8_t rows[16] = {};    // rows of tile t
};

}  // namespace domino::cpu
