// Intel AMX basics shared by the CPU kernels that multiply bf16 on tiles (attention's block
// products, the skinny matmul of decode): the one tile configuration they use, loaded and released
// by AmxScope. x86-64 only; call only where cpu_bf16_amx() says the CPU has the tiles and Linux granted
// them (ops/cpu/onednn.cpp asks for them once per process).
//
// AMX: eight tile registers of up to 16 rows x 64 bytes, and TDPBF16PS, which adds a 16 x 32 bf16
// tile times a 32 x 16 one (in pairs: 16 rows of 16 words) to a 16 x 16 f32 tile.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#define SHARDLM_AMX __attribute__((target("amx-tile,amx-bf16,avx512f")))

namespace shardlm::ops::cpu {

// The tile configuration (the layout LDTILECFG reads): every tile 16 rows of 64 bytes, which is an A
// tile of 32 bf16 per row, a B tile of 16 pair words per row and a C tile of 16 floats per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The tiles configured on this thread for a scope (a kernel's work on one thread). The
// configuration is per thread, and oneDNN's AMX kernels set their own and release the tiles after:
// a kernel configures them on each thread that runs it, and releases them when done.
struct AmxScope {
  SHARDLM_AMX AmxScope() {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    // Not _tile_loadconfig: GCC 12's intrinsic tells the compiler it reads one byte of cfg, and the
    // stores of the sizes above were dropped as dead (every tile then had no rows: SIGILL at the
    // first load). An operand of the whole struct keeps them.
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
  }
  SHARDLM_AMX ~AmxScope() { _tile_release(); }
  AmxScope(const AmxScope&) = delete;
  AmxScope& operator=(const AmxScope&) = delete;
};

}  // namespace shardlm::ops::cpu
#endif
