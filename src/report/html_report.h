// Self-contained HTML pages of line charts: report.html at the end of a training run, and any page
// of charts described in JSON (`shardlm report --charts`, which bench/scaling.sh uses).
//
// A page is one file: the data as JSON inside it and a small inline script that draws each chart
// as SVG when the page opens (no network, no CDN, nothing else to ship). Every chart's <svg>
// carries data-chart="<id>", and every series a <path data-series="<name>" data-points="<n>">
// and, up to kMaxMarkers points, one <circle data-series data-x data-y> per point, so a test (or a
// person with the inspector) can check what was drawn against the data.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::report {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); only finite values are drawn
};

struct Chart {
  std::string id;  // a short name: data-chart="<id>"
  std::string title, x_label, y_label;
  std::string y_format = "number";  // "number", or "bytes" (axis and tooltips in KB/MB/GB)
  bool log_y = false;               // a logarithmic y axis (values <= 0 are left out)
  std::vector<Series> series;
};

struct Page {
  std::string title;
  std::vector<std::string> notes;  // lines of text under the title
  std::vector<Chart> charts;
};

// Series with more points than this are drawn as lines alone, without a marker per point.
inline constexpr size_t kMaxMarkers = 2000;

std::string render_html(const Page& page);
// Writes the page to `path` (a temporary file renamed into place). Errors name the file.
void write_html(const std::string& path, const Page& page);

// A page from JSON: {"title": ..., "notes": [...], "charts": [{"id", "title", "x_label", "y_label",
// "y_format", "log_y", "series": [{"name", "points": [[x, y], ...]}]}]}. Errors name the field.
Page page_from_json(const nlohmann::json& j);

// What report.html shows of a training run, gathered from the same records metrics.jsonl gets
// (TrainingReport::add for each): loss and held-out loss, learning rate, gradient norm, tokens/s,
// and tracked memory by category with RSS, over steps. It keeps only those series (a few numbers
// per step), not the records.
class TrainingReport {
 public:
  void add(const nlohmann::json& record);
  bool empty() const { return values_.empty(); }
  Page page(const std::string& title, std::vector<std::string> notes = {}) const;

 private:
  // metrics key -> (step, value), in record order
  std::map<std::string, std::vector<std::pair<double, double>>> values_;
};

// The report of a metrics.jsonl file, as the run that wrote it would have drawn it.
Page training_page_from_metrics(const std::string& metrics_path, const std::string& title);

}  // namespace shardlm::report
