// CPU kernels: the reference implementation of every op in ops/ops.h.
// They are called only by the op front ends in ops/*.cpp, after validation, so they may assume
// contiguous CPU tensors with the shapes and dtypes ops.h documents.
#pragma once

#include "ops/nf4.h"
#include "ops/ops.h"

namespace shardlm::ops::cpu {

// Scratch of the kernels that allocate some, made on `device`: the CPU when they run, the meta
// device when a dry run counts it (ops/check.h). Every buffer lives for the whole call.
// matmul: on the skinny path (ops/cpu/matmul.cpp: a decode step's shape) none, or on AMX tiles x
// packed in two bf16 parts (32 bytes per element of K rounded up to 32); on the bf16 path
// (ops/cpu_bf16.h), bf16 copies of the f32 operands among A and B; otherwise f32 copies of the
// bf16 operands (A, B, and C, which is computed in f32 and narrowed).
struct MatmulScratch {
  Buffer a, b, c;
};
MatmulScratch matmul_scratch(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b,
                             Device device);
// linear_cross_entropy: one chunk of f32 logits [chunk, V]; on the f32 path an f32 copy of a bf16
// w [V, D] and of a bf16 x chunk [chunk, D]; on the bf16 path (ops/cpu_bf16.h) bf16 copies of an
// f32 w and x chunk, and for the backward the chunk's dlogits rounded to bf16 [chunk, V].
struct CrossEntropyScratch {
  Buffer logits, w, x, dlogits;
};
CrossEntropyScratch cross_entropy_scratch(const Tensor& x, const Tensor& w, int64_t chunk_rows, bool backward,
                                          Device device);

void matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b, float alpha, float beta);
// matmul_q8_0: none for a decode step's rows; for more, a block of up to 256 of the weight's rows
// dequantized (bf16 on the bf16 path, else f32; [rows, K]) and that block's columns of C ([M, rows]
// f32), besides what the matmul it then calls takes.
struct MatmulQ8Scratch {
  Buffer w, c;
};
MatmulQ8Scratch matmul_q8_0_scratch(const Tensor& C, const Tensor& A, const Tensor& W, Device device);
void matmul_q8_0(const Tensor& C, const Tensor& A, const Tensor& W, float alpha, float beta);
void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& ids);
void embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& ids);
void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps);
void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd);
void rope_apply(const Tensor& out, const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float sign);
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& segment_ids, float scale);
void attention_forward_paged(const Tensor& out, const Tensor& lse, const Tensor& q, const std::vector<Tensor>& k_blocks,
                             const std::vector<Tensor>& v_blocks, int64_t Tk, float scale);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& segment_ids, float scale);
void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up);
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate, const Tensor& up);
CrossEntropyResult linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& dx,
                                        const Tensor& dw, float grad_scale, int64_t chunk_rows);
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWConfig& cfg,
                int64_t step, float grad_scale, StatePosition pos);
double sum_squares(const Tensor& x);
void quantize_blockwise8(const Tensor& codes, const Tensor& absmax, const Tensor& x, bool is_signed);
void dequantize_blockwise8(const Tensor& x, const Tensor& codes, const Tensor& absmax, bool is_signed);
void add_bias(const Tensor& y, const Tensor& b);
void bias_backward(const Tensor& db, const Tensor& dy);
void row_norms(const Tensor& norms, const Tensor& x);
void dora_forward(const Tensor& y, const Tensor& z, const Tensor& l, const Tensor& m, const Tensor& norm);
void dora_backward(const Tensor& dz, const Tensor& dl, const Tensor& dm, const Tensor& dy, const Tensor& z,
                   const Tensor& l, const Tensor& m, const Tensor& norm);
void cast(const Tensor& dst, const Tensor& src);
void add_inplace(const Tensor& dst, const Tensor& src);
void scale_inplace(const Tensor& x, float s);
void zero(const Tensor& x);
void dropout(const Tensor& out, const Tensor& x, float p, uint64_t key, uint64_t stream);

// NF4 (ops/nf4.h). nf4_absmax_sum: index order, in double (the CUDA front end copies to the host).
double nf4_absmax_sum(const Tensor& absmax);
void nf4_quantize(const Tensor& packed, const Tensor& absmax, const Tensor& x);
void nf4_quantize_absmax(const Tensor& qabsmax, const Tensor& nested_absmax, const Tensor& absmax, const Tensor& offset);
void nf4_dequantize_absmax(const Tensor& absmax, const Tensor& qabsmax, const Tensor& nested_absmax,
                           const Tensor& offset);
void nf4_dequantize(const Tensor& out, const Tensor& packed, const Tensor& absmax);
void nf4_dequantize_nested(const Tensor& out, const Tensor& packed, const Tensor& qabsmax, const Tensor& nested_absmax,
                           const Tensor& offset);

}  // namespace shardlm::ops::cpu
