// Which path the CPU's bf16 matmuls take (docs/performance.md, "bf16 on the CPU").
//
// A matmul with a bf16 operand runs on the CPU's bf16 hardware through oneDNN (bf16 inputs, f32
// accumulation: the policy of the CUDA matmul, ops/ops.h) when this CPU has AVX512-BF16 or
// AMX-BF16 and oneDNN dispatches a bf16 kernel for it; otherwise, or with SHARDLM_CPU_BF16=0 in
// the environment, the bf16 operands are widened and OpenBLAS multiplies in exact f32. Decided
// once per process at the first matmul (cpuid), so one binary runs on every x86-64 CPU.
// SHARDLM_CPU_BF16 other than 0, 1 or empty is an Error naming it (at the first matmul or status).
// Attention with bf16 inputs follows the same switch (ops/cpu/attention.cpp): on the bf16 path its
// block products run on AMX tiles where the CPU and the OS provide them, else by AVX512-BF16 dot
// products (the bf16 path implies AVX512-BF16: oneDNN's bf16 ISA requires it). oneDNN's ISA cap
// (ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA) below AVX512_CORE_AMX turns the tiles off too.
#pragma once

#include <string>

namespace shardlm::ops {

struct CpuBf16Status {
  bool hardware = false;  // the CPU has AVX512-BF16 or AMX-BF16 and oneDNN dispatches a bf16 kernel
  bool enabled = false;   // the bf16 path is on: hardware, and not switched off
  // Attention's bf16 block products and decode's bf16 matmuls run on AMX tiles (amx_bf16 and
  // amx_tile, and Linux granted the tile state) rather than AVX512-BF16 dot products and the f32
  // skinny kernel.
  bool amx = false;
  std::string line;       // one line for `shardlm env`: the path and why
};
CpuBf16Status cpu_bf16_status();
bool cpu_bf16_enabled();

// For tests that compare the two paths in one process: false forces the f32 fallback, true restores
// the bf16 path (an Error when the hardware lacks it). Not thread-safe against running matmuls.
void set_cpu_bf16_enabled(bool on);

// Whether the bf16 path uses AMX tiles (status.amx, unless a test switched them off), and for tests
// that compare the kernels: false takes AVX512-BF16's dot products in attention and the f32 skinny
// kernel in decode, true restores the tiles (an Error where there are none).
bool cpu_bf16_amx();
void set_cpu_bf16_amx(bool on);

}  // namespace shardlm::ops
