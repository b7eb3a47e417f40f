// CUDA kernels of the ops in ops/ops.h, declared in plain C++ (no CUDA types) so the front ends
// in ops/*.cpp can call them; defined in ops/cuda/*.cu, compiled only with SHARDLM_HAVE_CUDA.
//
// Like ops/cpu/cpu_ops.h these are called only after validation, with contiguous tensors all on
// the current CUDA device. Every kernel is enqueued on cuda::compute_stream() and returns without
// waiting for it, except where noted: sum_squares and linear_cross_entropy return host values
// and so wait for the stream, and the front ends of embedding and linear_cross_entropy copy the
// ids to the host to validate them (ops/check.h: host_i32), which also waits.
#pragma once

#include "ops/nf4.h"
#include "ops/ops.h"

namespace shardlm::ops::gpu {

void matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b, float alpha, float beta);
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
// Waits for the compute stream (the loss is returned to the host).
CrossEntropyResult linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& dx,
                                        const Tensor& dw, float grad_scale, int64_t chunk_rows);
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWConfig& cfg,
                int64_t step, float grad_scale, StatePosition pos);
// Waits for the compute stream (the sum is returned to the host).
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

// NF4 (ops/nf4.h).
void nf4_quantize(const Tensor& packed, const Tensor& absmax, const Tensor& x);
void nf4_quantize_absmax(const Tensor& qabsmax, const Tensor& nested_absmax, const Tensor& absmax, const Tensor& offset);
void nf4_dequantize_absmax(const Tensor& absmax, const Tensor& qabsmax, const Tensor& nested_absmax,
                           const Tensor& offset);
void nf4_dequantize(const Tensor& out, const Tensor& packed, const Tensor& absmax);
void nf4_dequantize_nested(const Tensor& out, const Tensor& packed, const Tensor& qabsmax, const Tensor& nested_absmax,
                           const Tensor& offset);

}  // namespace shardlm::ops::gpu
