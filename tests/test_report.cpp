// src/report/: CRC-32C against published vectors, TFRecord framing, the event file's records
// decoded back through libprotobuf, the tags of a metrics record, the report_to / logging_dir keys,
// and the HTML page writer's data and refusals. (The browser check of the pages, and Python's
// reading of a run's event file, are tests/scripts/report_html_browser.sh and tensorboard_cli.sh.)
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "report/crc32c.h"
#include "report/event_codec.h"
#include "report/html_report.h"
#include "report/tensorboard.h"
#include "testing.h"
#include "train/train_config.h"

using namespace shardlm;
using namespace shardlm::report;
using shardlm::testing::error_of;
using shardlm::testing::TempDir;

namespace {

uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | uint8_t(s[at + size_t(i)]);
  return v;
}
uint64_t le64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint8_t(s[at + size_t(i)]);
  return v;
}

// The TFRecords of a file, each checked for its framing and both CRCs.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  for (size_t pos = 0; pos < buf.size();) {
    EXPECT_LE(pos + 12, buf.size());
    const uint64_t n = le64(buf, pos);
    EXPECT_EQ(le32(buf, pos + 8), masked_crc32c(buf.substr(pos, 8))) << "length CRC at byte " << pos;
    const std::string data = buf.substr(pos + 12, n);
    EXPECT_EQ(le32(buf, pos + 12 + n), masked_crc32c(data)) << "data CRC at byte " << pos;
    out.push_back(data);
    pos += 16 + n;
  }
  return out;
}

}  // namespace

TEST(Crc32c, KnownVectors) {
  // The check value of the CRC-32C catalogue, and RFC 3720 (iSCSI) appendix B.4's vectors.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  std::string zeros(32, '\0'), ones(32, '\xFF'), up(32, 0), down(32, 0);
  for (int i = 0; i < 32; ++i) up[size_t(i)] = char(i), down[size_t(i)] = char(31 - i);
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
  // An iSCSI read command PDU (RFC 3720 B.4, the last vector).
  const unsigned char pdu[48] = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
                                 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
                                 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(crc32c(pdu, sizeof pdu), 0xD9963A56u);
}

TEST(Crc32c, ContinuesAcrossPieces) {
  const std::string s = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(crc32c(s), 0x22620404u);
  for (size_t cut : {size_t(0), size_t(1), size_t(17), s.size()})
    EXPECT_EQ(crc32c(s.substr(cut), crc32c(s.substr(0, cut))), crc32c(s)) << cut;
}

TEST(Crc32c, MaskIsTfRecords) {
  // mask(c) = rotr(c, 15) + 0xa282ead8 (mod 2^32), as TensorFlow's crc32c::Mask.
  EXPECT_EQ(mask_crc(0u), 0xa282ead8u);
  EXPECT_EQ(mask_crc(0x00008000u), 0xa282ead9u);  // bit 15 rotates to bit 0
  EXPECT_EQ(mask_crc(0x00000001u), 0xa282ead8u + 0x00020000u);
  EXPECT_EQ(mask_crc(0xE3069283u), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
}

TEST(TfRecord, Framing) {
  for (const std::string& data : {std::string(), std::string("x"), std::string(300, '\x7f')}) {
    const std::string r = tfrecord(data);
    ASSERT_EQ(r.size(), data.size() + 16);
    EXPECT_EQ(le64(r, 0), data.size());
    EXPECT_EQ(le32(r, 8), mask_crc(crc32c(r.data(), 8)));
    EXPECT_EQ(r.substr(12, data.size()), data);
    EXPECT_EQ(le32(r, 12 + data.size()), mask_crc(crc32c(data)));
  }
  // The empty record's bytes, worked out by hand from the definitions above.
  const std::string empty = tfrecord("");
  EXPECT_EQ(le32(empty, 8), mask_crc(crc32c(std::string(8, '\0'))));
  EXPECT_EQ(le32(empty, 12), mask_crc(0));
}

TEST(TensorBoard, RecordScalarsTags) {
  const nlohmann::json rec = {{"step", 3},        {"loss", 2.5},         {"lr", 1e-3},
                              {"eval_loss", 2.0}, {"mem_live_parameters", 1024}, {"rss_bytes", 4096},
                              {"gpu_reserved_peak_bytes", 8}, {"checkpoint_bytes", 77}, {"checkpoint", "dir"},
                              {"skipped", true},  {"grad_norm", nullptr}};
  const auto s = record_scalars(rec);
  std::map<std::string, double> got(s.begin(), s.end());
  const std::map<std::string, double> want = {{"train/loss", 2.5},
                                              {"train/lr", 1e-3},
                                              {"eval/loss", 2.0},
                                              {"memory/mem_live_parameters", 1024},
                                              {"memory/rss_bytes", 4096},
                                              {"memory/gpu_reserved_peak_bytes", 8},
                                              {"checkpoint/checkpoint_bytes", 77}};
  EXPECT_EQ(got, want);
}

TEST(TensorBoard, EventFileDecodes) {
  TempDir dir;
  std::string path;
  {
    EventWriter w((dir.path() / "logs" / "sub").string());  // created with its parents
    path = w.path();
    w.record({{"step", 1}, {"loss", 3.25}, {"lr", 0.5}});
    w.record({{"step", 2}, {"eval_loss", 1.0 / 3.0}});
    w.record({{"no_step", 1}, {"loss", 1}});  // ignored: no step
    w.record({{"step", 3}, {"skipped", true}});  // no numbers: no event
  }
  EXPECT_NE(path.find("/logs/sub/events.out.tfevents."), std::string::npos) << path;
  const std::vector<std::string> recs = read_records(path);
  ASSERT_EQ(recs.size(), 3u);
  std::vector<EventFields> ev(recs.size());
  for (size_t i = 0; i < recs.size(); ++i) ASSERT_TRUE(decode_event(recs[i], &ev[i])) << i;
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_GT(ev[0].wall_time, 1.6e9);
  EXPECT_EQ(ev[1].step, 1);
  using Scalars = std::vector<std::pair<std::string, float>>;
  EXPECT_EQ(ev[1].scalars, (Scalars{{"train/loss", 3.25f}, {"train/lr", 0.5f}}));
  EXPECT_EQ(ev[2].step, 2);
  EXPECT_EQ(ev[2].scalars, (Scalars{{"eval/loss", float(1.0 / 3.0)}}));
  // Field numbers as TensorBoard's event.proto / summary.proto: wall_time 1 (fixed64), step 2
  // (varint), file_version 3 / summary 5 (length-delimited); Summary.value 1; Value.tag 1,
  // simple_value 2 (fixed32). The first byte of each encoding is (field << 3) | wire type.
  EXPECT_EQ(uint8_t(recs[0][0]), (1 << 3) | 1);
  EXPECT_EQ(uint8_t(recs[0][9]), (3 << 3) | 2);
  EXPECT_EQ(uint8_t(recs[1][9]), (2 << 3) | 0);
  EXPECT_EQ(uint8_t(recs[1][11]), (5 << 3) | 2);
}

TEST(TensorBoard, UnwritableDirectoryIsNamed) {
  TempDir dir;
  std::ofstream(dir / "file") << "x";
  const std::string e = error_of([&] { EventWriter w(dir / "file"); });
  EXPECT_NE(e.find(dir / "file"), std::string::npos) << e;
}

TEST(ReportConfig, ReportToAndLoggingDir) {
  const std::string head = "model: m\noutput_dir: o\ndata: {train: x.txt}\n";
  const auto read = [&](const std::string& extra) {
    ConfigTree t = ConfigTree::parse(head + extra, "run.yaml");
    return train::read_train_config(t);
  };
  EXPECT_FALSE(read("").report_tensorboard);
  EXPECT_EQ(read("").tensorboard_dir(), "o/runs");
  EXPECT_TRUE(read("report_to: tensorboard\n").report_tensorboard);
  EXPECT_TRUE(read("report_to: all\n").report_tensorboard);
  EXPECT_TRUE(read("report_to: [tensorboard]\n").report_tensorboard);
  EXPECT_TRUE(read("log_with: tensorboard\n").report_tensorboard);  // accelerate's name
  EXPECT_FALSE(read("report_to: none\n").report_tensorboard);
  EXPECT_FALSE(read("report_to: [none]\n").report_tensorboard);
  EXPECT_EQ(read("logging_dir: tb\n").tensorboard_dir(), "tb");
  EXPECT_EQ(error_of([&] { read("report_to: wandb\n"); }),
            "run.yaml:4: key 'report_to': expected tensorboard, none or all (or a list of them), got 'wandb' "
            "(shardlm writes TensorBoard event files and metrics.jsonl only)");
  EXPECT_EQ(error_of([&] { read("report_to: [tensorboard, none]\n"); }),
            "run.yaml:4: key 'report_to': 'none' cannot be listed with other reporters");
  EXPECT_NE(error_of([&] { read("report_to: {a: 1}\n"); }).find("key 'report_to'"), std::string::npos);
  EXPECT_NE(error_of([&] { read("reprot_to: tensorboard\n"); }).find("report_to"), std::string::npos);
}

TEST(HtmlReport, PageCarriesTheDataAndNoMarkupFromIt) {
  Page p{"t <b>", {"a & b"}, {{"c1", "C", "step", "y", "number", false, {{"s</script>", {{1, 2}, {2, NAN}, {3, 4}}}}}}};
  const std::string html = render_html(p);
  EXPECT_NE(html.find("<title>t &lt;b&gt;</title>"), std::string::npos);
  EXPECT_NE(html.find("<p>a &amp; b</p>"), std::string::npos);
  EXPECT_EQ(html.find("s</script>"), std::string::npos);  // "<" inside the JSON is \u003c
  EXPECT_NE(html.find("s\\u003c/script>"), std::string::npos);
  EXPECT_NE(html.find("[[1.0,2.0],[3.0,4.0]]"), std::string::npos) << "the NaN point is left out";
  EXPECT_EQ(html.find("http"), html.find("http://www.w3.org/2000/svg"));  // no URL but the SVG namespace
}

TEST(HtmlReport, TrainingReportSeries) {
  TrainingReport r;
  r.add({{"step", 0}, {"eval_loss", 5.0}, {"mem_live_parameters", 1}});
  for (int s = 1; s <= 3; ++s)
    r.add({{"step", s}, {"loss", 4.0 - s}, {"lr", 0.1}, {"grad_norm", 1.0}, {"tokens_per_s", 100.0 * s},
           {"mem_live_parameters", 10}, {"mem_live_gradients", 0}, {"mem_peak_bytes", 20}, {"rss_bytes", 30}});
  r.add({{"step", 3}, {"eval_loss", 2.0}});
  r.add({{"step", 3}, {"checkpoint", "x"}, {"checkpoint_bytes", 9}});
  const Page p = r.page("t");
  std::map<std::string, const Chart*> charts;
  for (const Chart& c : p.charts) charts[c.id] = &c;
  ASSERT_TRUE(charts.count("loss") && charts.count("lr") && charts.count("memory") && charts.count("tokens_per_s"));
  EXPECT_EQ(charts["loss"]->series[0].points.size(), 3u);
  EXPECT_EQ(charts["loss"]->series[1].points, (std::vector<std::pair<double, double>>{{0, 5.0}, {3, 2.0}}));
  // Memory: parameters (gradients never held a byte), peak, RSS; from step records only.
  ASSERT_EQ(charts["memory"]->series.size(), 3u);
  EXPECT_EQ(charts["memory"]->series[0].name, "parameters");
  EXPECT_EQ(charts["memory"]->series[0].points.size(), 3u);
  EXPECT_EQ(charts.count("eval_accuracy"), 0u);
}

TEST(HtmlReport, ChartsJsonErrorsNameTheField) {
  EXPECT_EQ(error_of([] { page_from_json(nlohmann::json::array()); }),
            "charts JSON: expected an object with \"charts\"");
  EXPECT_EQ(error_of([] { page_from_json({{"charts", {{{"series", {{{"points", {{1, "a"}}}}}}}}}}); }),
            "charts JSON: charts[0].series[0].points: expected [x, y] number pairs, got [1,\"a\"]");
  EXPECT_EQ(error_of([] { page_from_json({{"charts", {{{"y_format", "pct"}, {"series", nlohmann::json::array()}}}}}); }),
            "charts JSON: charts[0].y_format: expected number or bytes, got 'pct'");
  const Page p = page_from_json({{"title", "T"}, {"charts", {{{"id", "a"}, {"series", {{{"name", "s"}, {"points", {{1, 2}, {2, nullptr}}}}}}}}}});
  ASSERT_EQ(p.charts.size(), 1u);
  EXPECT_EQ(p.charts[0].series[0].points.size(), 2u);
}
