// Loading a model for inference: what `shardlm generate` and `shardlm serve` both do with a model
// directory, an optional LoRA adapter and 4-bit loading.
#pragma once

#include <functional>
#include <string>

#include "infer/param_store.h"
#include "model/config.h"

namespace shardlm::infer {

struct InferenceWeights {
  std::string model;    // a Hugging Face directory (dense, or bitsandbytes NF4)
  std::string adapter;  // a PEFT LoRA adapter directory, or empty
  bool load_in_4bit = false;
  std::string load_in_4bit_role = "load_in_4bit";  // what the caller calls 4-bit loading, in notes
  DType dtype = DType::F32;  // the weights generation holds: f32, or bf16 (rounded once, at the end)
  // With dtype bf16: the decoder's Linear weights in q8_0 instead (ParamStore::keep_only_q8_0).
  bool q8_0 = false;
  // Where generation runs: the weights are loaded (and rounded) on the CPU, then moved there
  // (ParamStore::move_to). Not with q8_0.
  Device device = Device::CPU;
};

// Loads the model's weights into `params` (f32) with what `load_in_4bit` and `adapter` ask for,
// telling `note` what it did, one line each (4-bit loading named as load_in_4bit_role):
//  - A bitsandbytes NF4 directory (config.json's quantization_config) is dequantized once at load,
//    exactly as bitsandbytes dequantizes it (ParamStore::load, model/nf4_loader.h).
//  - load_in_4bit quantizes a dense base's decoder Linear weights to NF4 (blocksize 64, double
//    quantization: what QLoRA training keeps, lora.quantize_base) and dequantizes them back, so the
//    model generates from exactly the base weights a QLoRA run trained its adapter against.
//  - an adapter merges a PEFT LoRA adapter in memory (W + scale * B A).
// A partial `params` (a rank's share of a split model, ParamStore::PartFilter) reads, quantizes and
// merges only the parts it holds.
// A store split over ranks (tensor parallelism) reads only its slices, except with an adapter or
// load_in_4bit on a dense base: those load the whole model on each rank, merge or round it, and
// keep the slices (a transient whole f32 copy per rank: the same weights as one process).
// With dtype bf16, all of that is done in f32 first, then every weight is rounded to bf16 once and
// the f32 weights freed (ParamStore::keep_only_bf16): `params` holds bf16 weights alone, and its
// compute_weights() must be taken after this call. With q8_0 the decoder's Linear weights are
// quantized to q8_0 from f32 instead (ParamStore::keep_only_q8_0), the rest rounded to bf16.
// Neither 4-bit path saves memory here (the NF4 base is dequantized): both are about its values.
void load_inference_weights(const InferenceWeights& w, const ModelConfig& cfg, ParamStore& params,
                            const std::function<void(const std::string&)>& note);

}  // namespace shardlm::infer
