// `shardlm report`: the HTML page of charts a training run writes at its end (report.html), drawn
// again from a metrics.jsonl, or a page of any charts described in JSON (bench/scaling.sh draws its
// scaling page this way, so both come from one writer, src/report/html_report.h).
#include <fmt/format.h>

#include <fstream>

#include "cli/commands.h"
#include "io/json_parse.h"
#include "report/html_report.h"

namespace shardlm::cli {

void register_report(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "report", "Write a self-contained HTML page of charts: a run's metrics.jsonl, or charts described in JSON");
  static std::string metrics, charts, out, title;
  cmd->add_option("--metrics", metrics, "a metrics.jsonl written by `shardlm train` (what report.html shows)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--charts", charts,
                  "a JSON file of charts: {\"title\", \"notes\": [...], \"charts\": [{\"id\", \"title\", \"x_label\", "
                  "\"y_label\", \"y_format\": number|bytes, \"log_y\", \"series\": [{\"name\", \"points\": [[x, y], "
                  "...]}]}]}")
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", out, "the HTML file to write")->required();
  cmd->add_option("--title", title, "the page's title");
  cmd->footer(
      "Examples:\n"
      "  shardlm report --metrics runs/demo/metrics.jsonl --out runs/demo/report.html\n"
      "  shardlm report --charts scaling.json --out scaling.html      (what bench/scaling.sh runs)\n"
      "The page needs no network: its data and drawing script are inside it (docs/reports.md).");
  cmd->callback([] {
    if (metrics.empty() == charts.empty()) throw Error("report: give one of --metrics FILE or --charts FILE");
    report::Page page;
    if (!metrics.empty()) {
      page = report::training_page_from_metrics(metrics, title.empty() ? "shardlm training report" : title);
    } else {
      std::ifstream in(charts);
      nlohmann::json j = io::parse_json_or_discarded(in);
      if (j.is_discarded()) throw Error("not valid JSON", {.file = charts});
      try {
        page = report::page_from_json(j);
      } catch (const Error& e) {
        throw Error(e.message(), {.file = charts});
      }
      if (!title.empty()) page.title = title;
    }
    report::write_html(out, page);
    size_t points = 0;
    for (const report::Chart& c : page.charts)
      for (const report::Series& s : c.series) points += s.points.size();
    fmt::print("wrote {} ({} chart{}, {} points)\n", out, page.charts.size(), page.charts.size() == 1 ? "" : "s",
               points);
  });
}

}  // namespace shardlm::cli
