// Batched generation (infer/generator.h): a decode step of several sequences of different
// lengths computes what each computes alone, and what the training forward computes; sequences
// stop on their own; sampling depends only on the request.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "infer/generator.h"
#include "model/llama.h"
#include "testing.h"
#include "infer/param_store.h"

using namespace shardlm;
using namespace shardlm::testing;

namespace {

// Grouped-query attention and Qwen2's q/k/v biases, so every part of the block is exercised.
ModelConfig gen_config() {
  ModelConfig c = preset("tiny");
  c.num_hidden_layers = 2;
  c.initializer_range = 0.2;  // far from uniform attention, so tokens differ between prompts
  c.num_key_value_heads = c.num_attention_heads / 2;
  c.qkv_bias = true;
  c.architecture = Architecture::Qwen2;
  c.model_type = "qwen2";
  return c;
}

std::vector<std::vector<int32_t>> prompts() {
  return {{1, 40, 77, 300, 12}, {1, 9}, {1, 5, 91, 250, 3, 17, 60, 61, 62}, {1}, {1, 200, 201, 202}};
}

// A request for each of prompts(): prompt i with the options `make(i)` gives it (and with
// Request's other fields, when `make` returns a whole Request, as they are).
std::vector<infer::Request> requests_for_prompts(const std::function<infer::Request(size_t i)>& make) {
  std::vector<infer::Request> reqs;
  for (size_t i = 0; i < prompts().size(); ++i) {
    reqs.push_back(make(i));
    reqs.back().prompt = prompts()[i];
  }
  return reqs;
}

// Logits of every position of `tokens` by the training forward, [T, V].
std::vector<float> training_logits(const ModelConfig& cfg, const model::LlamaWeights& w,
                                   const std::vector<int32_t>& tokens) {
  model::LlamaCompute m(cfg, DType::F32);
  m.set_weights(w);
  const int64_t T = int64_t(tokens.size());
  std::vector<float> out(size_t(T * cfg.vocab_size));
  model::Batch b;
  b.B = 1;
  b.T = T;
  b.ids = tokens.data();
  m.logits(b, Tensor::view(out.data(), DType::F32, {T, cfg.vocab_size}));
  return out;
}

}  // namespace

TEST(Generator, DecodeStepOfSequencesOfDifferentLengthsEqualsTheTrainingForward) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(3);
  const int64_t V = cfg.vocab_size;
  infer::Generator gen(cfg, p.compute_weights(), 16, 3);
  // Three sequences prefilled one by one (lengths 5, 2, 9), then two decode steps of all three.
  std::vector<std::vector<int32_t>> seqs = {prompts()[0], prompts()[1], prompts()[2]};
  std::vector<int> slots;
  for (const auto& s : seqs) {
    const int slot = gen.acquire();
    ASSERT_GE(slot, 0);
    slots.push_back(slot);
    const std::vector<float> last = gen.forward(std::vector<int>{slot}, s);
    const std::vector<float> ref = training_logits(cfg, p.compute_weights(), s);
    EXPECT_TRUE(all_close(last.data(), ref.data() + (int64_t(s.size()) - 1) * V, V, 1e-5, 1e-4, "prefill"));
  }
  EXPECT_EQ(gen.acquire(), -1);  // all three slots are taken
  for (int step = 0; step < 2; ++step) {
    std::vector<int32_t> next = {int32_t(100 + step), int32_t(7 + step), int32_t(33 * step + 2)};
    const std::vector<float> logits = gen.forward(slots, next);  // [3, V]
    for (size_t b = 0; b < seqs.size(); ++b) {
      seqs[b].push_back(next[b]);
      EXPECT_EQ(gen.length(slots[b]), int64_t(seqs[b].size()));
      const std::vector<float> ref = training_logits(cfg, p.compute_weights(), seqs[b]);
      EXPECT_TRUE(all_close(logits.data() + int64_t(b) * V, ref.data() + (int64_t(seqs[b].size()) - 1) * V, V, 1e-5,
                            1e-4, "decode step " + std::to_string(step) + " sequence " + std::to_string(b)));
    }
  }
  // A sequence leaves and another joins between decode steps.
  gen.release(slots[1]);
  const int again = gen.acquire();
  EXPECT_EQ(again, slots[1]);
  EXPECT_EQ(gen.length(again), 0);
}

TEST(Generator, BatchedGreedyOutputEqualsOneAtATime) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(5);
  // Per-request lengths: sequences leave at different steps.
  const std::vector<infer::Request> reqs = requests_for_prompts(
      [](size_t i) { return infer::Request{{}, {.max_new_tokens = 4 + int64_t(i) * 3, .temperature = 0}}; });
  const std::vector<int32_t> stops = {2};
  // One at a time (a batch of one), as `generate --prompt` runs.
  std::vector<std::vector<int32_t>> alone;
  for (const infer::Request& r : reqs) {
    infer::Generator g(cfg, p.compute_weights(), 40, 1);
    alone.push_back(g.generate(r.prompt, r.opt, stops));
  }
  // Batches of 2 and of all: requests join as others finish (continuous batching).
  for (int64_t batch : {2, 5}) {
    infer::Generator g(cfg, p.compute_weights(), 40, batch);
    const std::vector<infer::Completion> out = g.run(reqs, stops);
    ASSERT_EQ(out.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(out[i].tokens, alone[i]) << "request " << i << " in a batch of " << batch;
      EXPECT_GE(out[i].prefill_seconds, 0.0);
    }
  }
  // And the reference: greedy decoding by the training forward over the whole sequence each step.
  for (size_t i : {size_t(0), size_t(2)}) {
    std::vector<int32_t> seq = reqs[i].prompt;
    std::vector<int32_t> ref;
    for (int64_t s = 0; s < reqs[i].opt.max_new_tokens; ++s) {
      const std::vector<float> l = training_logits(cfg, p.compute_weights(), seq);
      const auto last = l.begin() + (int64_t(seq.size()) - 1) * cfg.vocab_size;
      const int32_t t = int32_t(std::max_element(last, last + cfg.vocab_size) - last);
      if (t == 2) break;
      ref.push_back(t);
      seq.push_back(t);
    }
    EXPECT_EQ(alone[i], ref) << "request " << i;
  }
}

TEST(Generator, SampledOutputDependsOnlyOnTheRequest) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(6);
  std::vector<infer::Request> reqs = requests_for_prompts([](size_t i) {
    return infer::Request{{},
                          {.max_new_tokens = 8,
                           .temperature = 0.9f,
                           .top_k = int64_t(i % 2) * 20,
                           .top_p = i == 3 ? 0.8f : 1.0f,
                           .repetition_penalty = i == 1 ? 1.3f : 1.0f,
                           .seed = 1000 + i}};
  });
  infer::Generator g1(cfg, p.compute_weights(), 40, 1), g3(cfg, p.compute_weights(), 40, 3);
  const std::vector<infer::Completion> one = g1.run(reqs, {}), three = g3.run(reqs, {});
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(three[i].tokens, one[i].tokens) << "request " << i;
    EXPECT_EQ(one[i].tokens.size(), 8u);
    EXPECT_EQ(one[i].finish, infer::FinishReason::Length);
  }
  // Another seed changes the output (of 8 tokens from a 512-token vocabulary).
  reqs[0].opt.seed = 7;
  EXPECT_NE(g1.run({reqs[0]}, {})[0].tokens, one[0].tokens);
}

TEST(Generator, EachSequenceStopsOnItsOwn) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(5);
  infer::SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 6;
  std::vector<infer::Request> reqs = {{prompts()[0], greedy}, {prompts()[2], greedy}, {prompts()[4], greedy}};
  infer::Generator g(cfg, p.compute_weights(), 40, 3);
  const std::vector<infer::Completion> free_run = g.run(reqs, {});
  // Stop ids: request 1's third token ends each request where it first appears (not part of the
  // output); a request without it runs to its max_new_tokens.
  const int32_t stop = free_run[1].tokens[2];
  const std::vector<infer::Completion> stopped = g.run(reqs, {stop});
  EXPECT_EQ(stopped[1].finish, infer::FinishReason::Stop);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& t = free_run[i].tokens;
    const auto at = std::find(t.begin(), t.end(), stop);
    EXPECT_EQ(stopped[i].tokens, std::vector<int32_t>(t.begin(), at)) << "request " << i;
    EXPECT_EQ(stopped[i].finish, at == t.end() ? infer::FinishReason::Length : infer::FinishReason::Stop);
  }
  // The hook (stop strings): request 0 ends at its first token, which it keeps.
  const std::vector<infer::Completion> hooked =
      g.run(reqs, {}, [](size_t r, int32_t, const infer::TokenLogprobs*) { return r == 0; });
  EXPECT_EQ(hooked[0].tokens.size(), 1u);
  EXPECT_EQ(hooked[0].finish, infer::FinishReason::Stop);
  EXPECT_EQ(hooked[2].tokens, free_run[2].tokens);
  // max_len: a 9-token prompt in 12 positions gets 3 new tokens.
  infer::Generator small(cfg, p.compute_weights(), 12, 2);
  const std::vector<infer::Completion> capped = small.run(reqs, {});
  EXPECT_EQ(capped[1].tokens, std::vector<int32_t>(free_run[1].tokens.begin(), free_run[1].tokens.begin() + 3));
  EXPECT_EQ(capped[1].finish, infer::FinishReason::Length);
  EXPECT_EQ(capped[0].tokens, free_run[0].tokens);
}

TEST(Generator, RepetitionPenaltyAsTransformers) {
  // RepetitionPenaltyLogitsProcessor: score < 0 ? score * penalty : score / penalty, once per
  // distinct token of the sequence so far.
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f};
  infer::apply_repetition_penalty(l, {0, 1, 1, 0}, 2.0f);
  EXPECT_EQ(l, (std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f}));
  infer::SamplingOptions o;
  o.temperature = 0;
  EXPECT_EQ(infer::sample_token(l, o, 0), 3);
  infer::apply_repetition_penalty(l, {3}, 4.0f);  // 3 -> 0.75: token 0 (1.0) is now the largest
  EXPECT_EQ(infer::sample_token(l, o, 0), 0);
}

// The Recompute form (what training's evaluation runs over the sharded engine): whole sequences
// through a forward without a cache, scheduled and sampled as the cached form is, give the same
// greedy tokens and the same reasons to stop.
TEST(Generator, RecomputeOfWholeSequencesGeneratesWhatTheCacheDoes) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(3);
  const int64_t V = cfg.vocab_size;
  int forwards = 0;
  infer::Generator cached(cfg, p.compute_weights(), 16, 2);
  infer::Generator recompute(
      cfg,
      [&](const std::vector<std::vector<int32_t>>& seqs) {
        ++forwards;
        std::vector<float> last;
        for (const auto& s : seqs) {
          const std::vector<float> all = training_logits(cfg, p.compute_weights(), s);
          last.insert(last.end(), all.end() - V, all.end());
        }
        return last;
      },
      16, 2);
  std::vector<infer::Request> requests;
  for (const auto& prompt : prompts()) requests.push_back({prompt, {.max_new_tokens = 6, .temperature = 0}});
  const int32_t stop = cached.run({requests[0]}, {})[0].tokens.at(2);  // a token some request meets
  const std::vector<infer::Completion> a = cached.run(requests, {stop}), b = recompute.run(requests, {stop});
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_EQ(a[i].finish, b[i].finish) << i;
  }
  EXPECT_EQ(a[0].finish, infer::FinishReason::Stop);
  EXPECT_GT(forwards, int(requests.size()));  // a prefill each, then the decode steps
  expect_error([&] { recompute.forward_all({1, 2}); }, "need a generator with weights");
}

// One forward of several sequences with different numbers of new rows (a decode row of one, prefill
// chunks of others, one of them asking for every row's logits) computes what the training forward
// computes for each, and a prompt prefilled over several such forwards continues where it stopped.
TEST(Generator, RaggedForwardOfDecodeRowsAndPrefillChunksEqualsTheTrainingForward) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(4);
  const int64_t V = cfg.vocab_size;
  infer::Generator gen(cfg, p.compute_weights(), 24, 3);
  const int a = gen.acquire(), b = gen.acquire(), c = gen.acquire();
  std::vector<int32_t> sa = prompts()[0], sb = prompts()[2], sc = prompts()[4];
  gen.forward(std::vector<int>{a}, sa);  // a: 5 tokens in its cache
  // a decodes one token; b prefills 4 of its 9 (every row's logits); c prefills all of its 4.
  sa.push_back(77);
  std::vector<float> out = gen.forward_parts({{a, {77}, false},
                                        {b, std::vector<int32_t>(sb.begin(), sb.begin() + 4), true},
                                        {c, sc, false}});
  ASSERT_EQ(out.size(), size_t((1 + 4 + 1) * V));
  const std::vector<float> ra = training_logits(cfg, p.compute_weights(), sa),
                           rb = training_logits(cfg, p.compute_weights(), sb),
                           rc = training_logits(cfg, p.compute_weights(), sc);
  EXPECT_TRUE(all_close(out.data(), ra.data() + (int64_t(sa.size()) - 1) * V, V, 1e-5, 1e-4, "a's decode row"));
  EXPECT_TRUE(all_close(out.data() + V, rb.data(), 4 * V, 1e-5, 1e-4, "b's first chunk, every row"));
  EXPECT_TRUE(all_close(out.data() + 5 * V, rc.data() + 3 * V, V, 1e-5, 1e-4, "c's whole prompt, last row"));
  EXPECT_EQ(gen.length(a), 6);
  EXPECT_EQ(gen.length(b), 4);
  EXPECT_EQ(gen.length(c), 4);
  // b's remaining 5 tokens beside c's decode row: b's rows 4..8 as if prefilled whole.
  out = gen.forward_parts({{b, std::vector<int32_t>(sb.begin() + 4, sb.end()), true}, {c, {9}, false}});
  ASSERT_EQ(out.size(), size_t((5 + 1) * V));
  EXPECT_TRUE(all_close(out.data(), rb.data() + 4 * V, 5 * V, 1e-5, 1e-4, "b's second chunk"));
  sc.push_back(9);
  const std::vector<float> rc2 = training_logits(cfg, p.compute_weights(), sc);
  EXPECT_TRUE(all_close(out.data() + 5 * V, rc2.data() + 4 * V, V, 1e-5, 1e-4, "c's decode row"));
  expect_error([&] { gen.forward_parts({{a, {1}, false}, {a, {2}, false}}); }, "appears twice");
  expect_error([&] { gen.forward_parts({{a, {}, false}}); }, "a forward of no tokens");
}

// Prompts prefilled in chunks of any size, beside the others' decoding, generate the tokens (and
// the prompt and token logprobs) of whole prompts prefilled at once.
TEST(Generator, ChunkedPrefillGeneratesWhatWholePrefillDoes) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(5);
  const std::vector<infer::Request> reqs = requests_for_prompts([](size_t i) {
    return infer::Request{
        {}, {.max_new_tokens = 3 + int64_t(i) * 2, .temperature = i == 1 ? 0.9f : 0.0f, .seed = 11}, int(i % 2) * 3,
        i == 2};
  });
  infer::Generator whole_gen(cfg, p.compute_weights(), 40, 5);
  const std::vector<infer::Completion> whole = whole_gen.run(reqs, {}, {}, 0);
  for (int64_t batch : {1, 2, 5})
    for (int64_t chunk : {1, 2, 3, 7}) {
      const std::string what = "batch " + std::to_string(batch) + ", chunk " + std::to_string(chunk);
      infer::Generator g(cfg, p.compute_weights(), 40, batch);
      const std::vector<infer::Completion> out = g.run(reqs, {}, {}, chunk);
      for (size_t i = 0; i < reqs.size(); ++i) {
        EXPECT_EQ(out[i].tokens, whole[i].tokens) << "request " << i << ", " << what;
        ASSERT_EQ(out[i].logprobs.size(), whole[i].logprobs.size()) << what;
        for (size_t t = 0; t < out[i].logprobs.size(); ++t)
          EXPECT_NEAR(out[i].logprobs[t].logprob, whole[i].logprobs[t].logprob, 1e-5) << what;
        ASSERT_EQ(out[i].prompt_logprobs.size(), whole[i].prompt_logprobs.size()) << what;
        for (size_t t = 0; t < out[i].prompt_logprobs.size(); ++t) {
          EXPECT_EQ(out[i].prompt_logprobs[t].token, reqs[i].prompt[t + 1]);
          EXPECT_NEAR(out[i].prompt_logprobs[t].logprob, whole[i].prompt_logprobs[t].logprob, 1e-5) << what;
        }
      }
    }
  EXPECT_EQ(whole[2].prompt_logprobs.size(), prompts()[2].size() - 1);
  expect_error([&] { whole_gen.run(reqs, {}, {}, -1); }, "prefill chunk");
}

// A long prompt that joins while another request decodes is prefilled a chunk per step, and the
// running request gets its next token at every one of those steps; with no limit it is prefilled
// in one step.
TEST(Batch, ALongPromptJoiningMidStreamDelaysTheOthersByOneChunkPerStep) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(7);
  std::vector<int32_t> longp(100);
  for (size_t i = 0; i < longp.size(); ++i) longp[i] = int32_t(1 + (i * 37) % 500);
  const infer::SamplingOptions o{.max_new_tokens = 40, .temperature = 0};
  for (int64_t chunk : {8, 0}) {
    infer::Generator gen(cfg, p.compute_weights(), 160, 2);
    infer::Batch batch(gen, {}, chunk);
    auto positions = [&] { return gen.length(0) + gen.length(1); };  // cached over both slots
    ASSERT_EQ(batch.admit(0, {prompts()[0], o}), infer::Batch::Admit::Joined);
    for (int i = 0; i < 4; ++i) batch.step({}, [](size_t, infer::Completion&&) {});
    const size_t before = batch.progress(0)->tokens.size();
    ASSERT_EQ(before, 3u);  // a step to prefill, then a token a step
    ASSERT_EQ(batch.admit(1, {longp, o}), infer::Batch::Admit::Joined);
    int steps = 0;
    while (batch.progress(1)->tokens.empty()) {
      const int64_t cached = positions();
      batch.step({}, [](size_t, infer::Completion&&) {});
      ++steps;
      EXPECT_EQ(batch.progress(0)->tokens.size(), before + size_t(steps)) << "chunk " << chunk;
      if (chunk > 0) {
        EXPECT_LE(positions() - cached, chunk + 1) << "a step of chunk " << chunk;
      }
    }
    // The prefill's steps, and the one that samples the first token.
    EXPECT_EQ(steps, chunk > 0 ? int((longp.size() + chunk - 1) / chunk) + 1 : 2) << "chunk " << chunk;
  }
}

// ParamStore::move_to (generate --device cuda): to where the weights are already is nothing, and
// q8_0 weights, which only a CPU kernel reads, are refused by name before anything moves. The
// move itself and the Generator on a GPU are gpu_generate's (skipped without a GPU).
TEST(ParamStore, MoveToWhereTheWeightsAreChangesNothingAndQ8_0StaysOnTheCpu) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(3);
  const Tensor before = p.compute_weights().embed;
  p.move_to(Device::CPU);
  EXPECT_EQ(p.compute_weights().embed.data, before.data);
  EXPECT_EQ(p.device(), Device::CPU);
  EXPECT_NO_THROW(p.master("model.embed_tokens.weight"));  // nothing was moved or freed

  infer::ParamStore q(cfg, DType::F32);
  q.init_random(3);
  ASSERT_GT(q.keep_only_q8_0(), 0);
  expect_error([&] { q.move_to(Device::CUDA); }, "q8_0 weights stay on the CPU");
  EXPECT_EQ(q.device(), Device::CPU);
}

// The GPU path of the Generator (weights, activations and KV blocks on a device; ids and positions
// uploaded, logits copied back) run on the meta device, where tensors have sizes and no memory:
// nothing on the host may read device memory (a null pointer there), every view of the store and of
// the cache must be on the store's device (the ops check it), and what comes back is zeros. Prefill
// of two sequences, decode steps through several KV blocks, in f32 and bf16.
TEST(Generator, TheDevicePathRunsOnTheMetaDevice) {
  const ModelConfig cfg = gen_config();
  for (DType dtype : {DType::F32, DType::BF16}) {
    infer::ParamStore p(cfg, DType::F32);
    p.init_random(5);
    if (dtype == DType::BF16) p.keep_only_bf16();
    p.move_to(Device::Meta);
    const model::LlamaWeights& w = p.compute_weights();
    for (const Tensor* t : {&w.embed, &w.lm_head, &w.final_norm, &w.layers[1].wq, &w.layers[1].w_down})
      EXPECT_EQ(t->device, Device::Meta);
    infer::Generator gen(cfg, w, 24, 2, {}, {}, {.dtype = dtype, .block_size = 4});
    std::vector<float> logits = gen.forward_parts({{0, {1, 5, 9, 13, 17, 21}, true}, {1, {1, 2, 3}, false}});
    ASSERT_EQ(int64_t(logits.size()), (6 + 1) * cfg.vocab_size);
    for (int step = 0; step < 6; ++step) logits = gen.forward_parts({{0, {7}, false}, {1, {8}, false}});
    ASSERT_EQ(int64_t(logits.size()), 2 * cfg.vocab_size);
    EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float x) { return x == 0.0f; }));
    EXPECT_EQ(gen.length(0), 12);
    EXPECT_EQ(gen.kv_cache_stats().in_use, 3 + 3);  // 12 and 9 positions in blocks of 4
  }
}
