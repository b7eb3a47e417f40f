// The server's scheduler (infer/server.h) without HTTP: requests submitted from several threads at
// once, joining a running batch between decode steps, get token for token what Generator::run
// gives them offline; streamed pieces add up to the completion; shutdown ends every request.
// And CompletionText (infer/requests.h): what may be streamed, and stop strings; stop token ids.
// And tcp_bytes_read (infer/tcp_bytes.h), the count behind the server's per-request byte budget.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "data/tokenizer.h"
#include "infer/generator.h"
#include "infer/requests.h"
#include "infer/server.h"
#include "infer/tcp_bytes.h"
#include "model/hf_dir.h"
#include "testing.h"
#include "infer/param_store.h"

using namespace shardlm;
using namespace shardlm::testing;

namespace {

ModelConfig server_config() {
  ModelConfig c = preset("tiny");
  c.num_hidden_layers = 2;
  c.vocab_size = 259;  // the byte-level tokenizer's
  c.initializer_range = 0.2;  // far from uniform attention, so tokens differ between prompts
  c.num_key_value_heads = c.num_attention_heads / 2;
  return c;
}

std::vector<int32_t> bytes(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(int32_t(c) + data::ByteTokenizer::kFirstByte);
  return ids;
}

}  // namespace

TEST(Scheduler, ConcurrentRequestsGetTheirOfflineTokens) {
  const ModelConfig cfg = server_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(5);
  const data::ByteTokenizer tok;
  const std::vector<int32_t> stops = {data::ByteTokenizer::kEos};
  // Eight requests of different lengths, greedy and sampled, more than the 3 slots.
  std::vector<infer::Request> reqs;
  const char* texts[] = {"hello", "a", "the quick brown fox", "12+34=", "xyz", "zz top", "lorem ipsum", "q"};
  for (int i = 0; i < 8; ++i) {
    infer::Request r;
    r.prompt = tok.encode_with(texts[i], true, false);
    r.opt.max_new_tokens = 4 + 3 * i;
    r.opt.temperature = i % 3 == 0 ? 0.9f : 0.0f;
    r.opt.top_k = i % 3 == 0 ? 40 : 0;
    r.opt.seed = 100 + uint64_t(i);
    r.opt.repetition_penalty = i == 4 ? 1.3f : 1.0f;
    reqs.push_back(r);
  }
  infer::Generator offline(cfg, p.compute_weights(), 48, 1);
  const std::vector<infer::Completion> want = offline.run(reqs, stops);

  infer::Generator gen(cfg, p.compute_weights(), 48, 3);
  infer::Scheduler sched(gen, tok, stops);
  struct Got {
    std::vector<int32_t> tokens;
    std::string text, streamed;
    infer::FinishReason finish = infer::FinishReason::Length;
    bool failed = false;
  };
  std::vector<Got> got(reqs.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < reqs.size(); ++i)
    clients.emplace_back([&, i] {
      const auto ticket = sched.submit({reqs[i], {}, i % 2 == 1});
      for (;;) {
        const infer::Event e = ticket->next();
        if (e.kind == infer::Event::Kind::Text) {
          got[i].streamed += e.text;
          continue;
        }
        got[i].failed = e.kind == infer::Event::Kind::Failed;
        got[i].text = e.text;
        got[i].tokens = e.tokens;
        got[i].finish = e.finish;
        return;
      }
    });
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_FALSE(got[i].failed) << got[i].text;
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_EQ(got[i].finish, want[i].finish);
    std::vector<int32_t> all = reqs[i].prompt;  // the text: decoded with the prompt, after the prompt's
    all.insert(all.end(), want[i].tokens.begin(), want[i].tokens.end());
    EXPECT_EQ(got[i].text, tok.decode(all).substr(tok.decode(reqs[i].prompt).size()));
    if (i % 2 == 1) EXPECT_EQ(got[i].streamed, got[i].text);  // streamed pieces add up to the text
    else EXPECT_EQ(got[i].streamed, "");
  }
}

TEST(Scheduler, StopStringsEndARequestAsOffline) {
  const ModelConfig cfg = server_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(5);
  const data::ByteTokenizer tok;
  infer::Request r;
  r.prompt = tok.encode_with("the quick brown fox", true, false);
  r.opt.max_new_tokens = 30;
  r.opt.temperature = 0;
  infer::Generator gen(cfg, p.compute_weights(), 64, 2);
  std::string free_text;
  {
    infer::Scheduler sched(gen, tok, {});
    free_text = sched.submit({r, {}, false})->next().text;
  }
  ASSERT_GE(free_text.size(), 4u);
  const std::string stop = free_text.substr(2, 2);  // two bytes from the middle of the greedy run
  infer::Scheduler sched(gen, tok, {});
  const auto ticket = sched.submit({r, {stop, "never-there"}, true});
  std::string streamed;
  infer::Event e;
  while ((e = ticket->next()).kind == infer::Event::Kind::Text) streamed += e.text;
  ASSERT_EQ(e.kind, infer::Event::Kind::Done);
  EXPECT_EQ(e.finish, infer::FinishReason::Stop);
  EXPECT_EQ(e.text, free_text.substr(0, free_text.find(stop)));
  EXPECT_EQ(streamed, e.text);
}

// Logprobs (issue 32): an echoed prompt's logprobs are log_softmax of the logits of every prefix
// (forward_all, computed here in double), the new tokens' those of the logits they were sampled
// from; greedy tokens are the most likely; max_new_tokens 0 scores the prompt alone; a streamed
// request's events carry the same values.
TEST(Scheduler, LogprobsOfPromptAndCompletion) {
  const ModelConfig cfg = server_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(5);
  const data::ByteTokenizer tok;
  const int64_t V = cfg.vocab_size;
  infer::Request r;
  r.prompt = tok.encode_with("the quick brown fox", true, false);
  r.opt.max_new_tokens = 6;
  r.opt.temperature = 0;
  r.opt.repetition_penalty = 1.5f;  // changes the sampling logits, not the logprobs
  r.logprobs = 3;
  r.prompt_logprobs = true;
  const int64_t P = int64_t(r.prompt.size());

  infer::Generator ref(cfg, p.compute_weights(), 64, 1);
  infer::Generator gen(cfg, p.compute_weights(), 64, 2);
  infer::Scheduler sched(gen, tok, {});
  const infer::Event done = sched.submit({r, {}, false})->next();
  ASSERT_EQ(done.kind, infer::Event::Kind::Done) << done.text;
  ASSERT_EQ(done.prompt_logprobs.size(), size_t(P - 1));
  ASSERT_EQ(done.logprobs.size(), done.tokens.size());
  std::vector<int32_t> all = r.prompt;
  all.insert(all.end(), done.tokens.begin(), done.tokens.end());
  const std::vector<float> rows = ref.forward_all(all);  // [T, V]
  auto check = [&](const infer::TokenLogprobs& lp, int64_t row, int32_t token) {
    const float* l = rows.data() + row * V;
    double m = l[0], sum = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double(l[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(l[v]) - m);
    const double lse = m + std::log(sum);
    EXPECT_EQ(lp.token, token);
    EXPECT_NEAR(lp.logprob, double(l[token]) - lse, 1e-4) << "row " << row;
    ASSERT_EQ(lp.top.size(), 3u);
    for (size_t k = 0; k < lp.top.size(); ++k) {
      EXPECT_NEAR(lp.top[k].second, double(l[lp.top[k].first]) - lse, 1e-4);
      if (k > 0) {
        EXPECT_GE(lp.top[k - 1].second, lp.top[k].second);
      }
    }
    int64_t greater = 0;  // nothing outside the top 3 is likelier than its last
    for (int64_t v = 0; v < V; ++v) greater += l[v] > l[lp.top.back().first];
    EXPECT_EQ(greater, 2);
  };
  for (int64_t t = 0; t + 1 < P; ++t) check(done.prompt_logprobs[size_t(t)], t, r.prompt[size_t(t + 1)]);
  // (Greedy under a penalty: the chosen token need not be the raw logits' most likely.)
  for (size_t i = 0; i < done.tokens.size(); ++i) check(done.logprobs[i], P - 1 + int64_t(i), done.tokens[i]);

  // Greedy without a penalty: every token is its position's most likely.
  r.opt.repetition_penalty = 1.0f;
  const infer::Event greedy = sched.submit({r, {}, false})->next();
  ASSERT_EQ(greedy.logprobs.size(), greedy.tokens.size());
  for (const infer::TokenLogprobs& lp : greedy.logprobs) {
    EXPECT_EQ(lp.top[0].first, lp.token);
    EXPECT_EQ(lp.top[0].second, lp.logprob);
  }

  // Score only: nothing generated, the same prompt logprobs.
  infer::Request score = r;
  score.opt.max_new_tokens = 0;
  const infer::Event scored = sched.submit({score, {}, false})->next();
  ASSERT_EQ(scored.kind, infer::Event::Kind::Done);
  EXPECT_TRUE(scored.tokens.empty());
  ASSERT_EQ(scored.prompt_logprobs.size(), size_t(P - 1));
  for (int64_t t = 0; t + 1 < P; ++t)
    EXPECT_EQ(scored.prompt_logprobs[size_t(t)].logprob, done.prompt_logprobs[size_t(t)].logprob);

  // Streamed: the prompt's event first, then one event per token with its logprobs.
  const auto ticket = sched.submit({r, {}, true});
  infer::Event e = ticket->next();
  ASSERT_TRUE(e.prompt);
  ASSERT_EQ(e.prompt_logprobs.size(), size_t(P - 1));
  EXPECT_EQ(e.prompt_logprobs.back().logprob, done.prompt_logprobs.back().logprob);
  std::vector<infer::TokenLogprobs> streamed;
  while ((e = ticket->next()).kind == infer::Event::Kind::Text)
    streamed.insert(streamed.end(), e.logprobs.begin(), e.logprobs.end());
  ASSERT_EQ(e.kind, infer::Event::Kind::Done);
  ASSERT_EQ(streamed.size(), greedy.logprobs.size());
  for (size_t i = 0; i < streamed.size(); ++i) {
    EXPECT_EQ(streamed[i].token, greedy.logprobs[i].token);
    EXPECT_EQ(streamed[i].logprob, greedy.logprobs[i].logprob);
  }
}

TEST(Scheduler, ShutdownEndsEveryRequest) {
  const ModelConfig cfg = server_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(5);
  const data::ByteTokenizer tok;
  infer::Generator gen(cfg, p.compute_weights(), 200, 1);
  infer::Scheduler sched(gen, tok, {});
  infer::Request r;
  r.prompt = bytes("x");
  r.opt.max_new_tokens = 190;
  r.opt.temperature = 0;
  std::vector<std::shared_ptr<infer::Ticket>> tickets;
  for (int i = 0; i < 4; ++i) tickets.push_back(sched.submit({r, {}, true}));
  sched.shutdown();
  for (auto& t : tickets) {  // each ends (no waiter is left hanging), most of them as 503
    infer::Event e;
    while ((e = t->next()).kind == infer::Event::Kind::Text) {
    }
    if (e.kind == infer::Event::Kind::Failed) {
      EXPECT_EQ(e.status, 503);
    }
  }
  const infer::Event late = sched.submit({r, {}, false})->next();
  EXPECT_EQ(late.kind, infer::Event::Kind::Failed);
  EXPECT_EQ(late.status, 503);
}

TEST(CompletionText, StreamsOnlyTextThatCannotChange) {
  const data::ByteTokenizer tok;
  infer::CompletionText t(tok, bytes("P"), {"cx"});
  auto push = [&](const std::string& s) {
    for (int32_t id : bytes(s)) t.push(id);
  };
  push("ab");
  EXPECT_EQ(t.take_delta(false), "ab");
  push("\xC3");  // the first byte of "é": held back until the character is whole
  EXPECT_EQ(t.take_delta(false), "");
  push("\xA9");
  EXPECT_EQ(t.take_delta(false), "\xC3\xA9");
  push("c");  // may be the start of the stop string "cx"
  EXPECT_EQ(t.take_delta(false), "");
  push("d");
  EXPECT_EQ(t.take_delta(false), "cd");
  EXPECT_FALSE(t.stopped());
  push("c");
  EXPECT_EQ(t.take_delta(false), "");
  EXPECT_TRUE(t.push(bytes("x")[0]));  // the stop string: the text ends before it
  EXPECT_EQ(t.text(), "ab\xC3\xA9" "cd");
  EXPECT_EQ(t.take_delta(true), "");
  // At the end, whatever was held back goes out.
  infer::CompletionText u(tok, bytes("P"), {"cx"});
  for (int32_t id : bytes("zc")) u.push(id);
  EXPECT_EQ(u.take_delta(false), "z");
  EXPECT_EQ(u.take_delta(true), "c");
}

// The stop tokens of generate and serve (issue 36): generation_config.json's eos_token_id joins the
// default set; --stop-token-ids replaces it ("none": no stop token).
TEST(StopTokenIds, GenerationConfigEosIdsIntListNullOrAbsent) {
  TempDir dir;
  const std::string path = dir / "generation_config.json";
  EXPECT_TRUE(read_generation_eos_ids(dir.path().string(), 512).empty());  // no file
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write(R"({"eos_token_id": 2})");
  EXPECT_EQ(read_generation_eos_ids(dir.path().string(), 512), (std::vector<int64_t>{2}));
  write(R"({"bos_token_id": 1, "eos_token_id": [2, 7, 9]})");
  EXPECT_EQ(read_generation_eos_ids(dir.path().string(), 512), (std::vector<int64_t>{2, 7, 9}));
  write(R"({"eos_token_id": null})");
  EXPECT_TRUE(read_generation_eos_ids(dir.path().string(), 512).empty());
  write(R"({"do_sample": true})");
  EXPECT_TRUE(read_generation_eos_ids(dir.path().string(), 512).empty());
  for (const char* bad : {R"({"eos_token_id": "2"})", R"({"eos_token_id": [2, 600]})", R"({"eos_token_id": [2.5]})",
                          R"({"eos_token_id": -1})", R"({"eos_token_id": )", "[2]"}) {
    write(bad);
    try {
      read_generation_eos_ids(dir.path().string(), 512);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("generation_config.json"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(StopTokenIds, FlagValues) {
  EXPECT_TRUE(infer::parse_stop_token_ids("none", 512).empty());
  EXPECT_TRUE(infer::parse_stop_token_ids("", 512).empty());
  EXPECT_EQ(infer::parse_stop_token_ids("1,2", 512), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(infer::parse_stop_token_ids("511", 512), (std::vector<int32_t>{511}));
  for (const char* bad : {"512", "-1", "1,,2", "1,", "x", "1 ,2", "99999999999999999999"}) {
    try {
      infer::parse_stop_token_ids(bad, 512);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--stop-token-ids"), std::string::npos) << e.what();
    }
  }
}

// The byte budget counts what the server has read, not what waits for it in the kernel: a loaded
// handler thread that has read 1 MiB of a refused body may have megabytes more queued, and a cut
// on those lost its 413 (serve_load failed so once).
TEST(TcpBytesRead, CountsWhatWasReadNotWhatWaitsInTheKernel) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int server = accept(listener, nullptr, nullptr);
  ASSERT_GE(server, 0);
  // Every kernel shardlm supports (Debian 12's and later) has the count; without it the budget
  // would be off, so its absence is a failure here, not a skip.
  ASSERT_TRUE(infer::tcp_bytes_read(server).has_value()) << "TCP_INFO has no tcpi_bytes_received";

  // 24 KiB sent (far less than any loopback receive buffer), 8 KiB of it read.
  constexpr size_t kSent = 24 << 10, kRead = 8 << 10;
  const std::vector<char> out(kSent, 'x');
  ASSERT_EQ(send(client, out.data(), out.size(), 0), ssize_t(kSent));
  std::vector<char> in(kSent);
  size_t got = 0;
  while (got < kRead) {
    const ssize_t n = recv(server, in.data() + got, kRead - got, 0);
    ASSERT_GT(n, 0);
    got += size_t(n);
  }
  // Every byte sent has reached the server's queue: the rest waits there, unread.
  int queued = 0;
  for (int i = 0; i < 500 && queued != int(kSent - kRead); ++i) {
    ASSERT_EQ(ioctl(server, SIOCINQ, &queued), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(queued, int(kSent - kRead));
  EXPECT_EQ(infer::tcp_bytes_read(server).value_or(0), kRead);

  while (got < kSent) {
    const ssize_t n = recv(server, in.data() + got, kSent - got, 0);
    ASSERT_GT(n, 0);
    got += size_t(n);
  }
  EXPECT_EQ(infer::tcp_bytes_read(server).value_or(0), kSent);
  close(client);
  close(server);
  close(listener);
}
