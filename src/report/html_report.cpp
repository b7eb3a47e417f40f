#include "report/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/alloc.h"
#include "core/error.h"
#include "io/json_parse.h"

namespace shardlm::report {

namespace {

// The page's script: draws every chart of the embedded JSON as SVG. Written for any browser of the
// last decade, without libraries. Errors (a bug here, odd data) are shown on the page and marked
// on <body data-errors>, so a headless check sees them in the DOM as well as on the console.
constexpr const char* kScript = R"JS(
(function () {
  var page = JSON.parse(document.getElementById('page-data').textContent);
  var NS = 'http://www.w3.org/2000/svg';
  var W = 760, H = 330, L = 78, R = 18, T = 14, B = 46;
  var COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f',
                '#17becf', '#bcbd22'];
  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmtNum(v) {
    if (v === 0) return '0';
    var a = Math.abs(v);
    if (a >= 1e6 || a < 1e-3) return (+v.toPrecision(3)).toExponential();  // 8e-4, 1.25e+6
    return String(+v.toPrecision(4));
  }
  function fmtBytes(v) {
    var units = ['B', 'KB', 'MB', 'GB', 'TB'], i = 0;
    while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i++; }
    return String(+v.toPrecision(3)) + ' ' + units[i];
  }
  // About n round-numbered ticks covering [lo, hi].
  function ticks(lo, hi, n) {
    var step0 = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(step0))), r = step0 / mag;
    var step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag, out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }
  function drawChart(c, root) {
    var fig = document.createElement('figure');
    var h = document.createElement('h2');
    h.textContent = c.title;
    fig.appendChild(h);
    root.appendChild(fig);
    var svg = el('svg', {viewBox: '0 0 ' + W + ' ' + H, width: W, height: H, 'data-chart': c.id, role: 'img'}, fig);
    var fy = c.y_format === 'bytes' ? fmtBytes : fmtNum;
    var series = c.series.map(function (s) {
      return {name: s.name, pts: s.points.filter(function (p) {
        return p && isFinite(p[0]) && isFinite(p[1]) && (!c.log_y || p[1] > 0);
      })};
    });
    var xs = [], ys = [];
    series.forEach(function (s) { s.pts.forEach(function (p) { xs.push(p[0]); ys.push(c.log_y ? Math.log10(p[1]) : p[1]); }); });
    svg.setAttribute('data-series-count', String(series.length));
    if (!xs.length) {
      el('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', fill: '#666'}, svg).textContent = 'no data';
      return;
    }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { var d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    var pad = (y1 - y0) * 0.05;
    y0 -= pad; y1 += pad;
    if (!c.log_y && y0 < 0 && ys.every(function (v) { return v >= 0; })) y0 = 0;
    function sx(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function sy(v) { return T + (1 - ((c.log_y ? Math.log10(v) : v) - y0) / (y1 - y0)) * (H - T - B); }
    var axes = el('g', {'font-size': 11, fill: '#333'}, svg);
    // A few whole-number x values (ranks, say) are the ticks themselves; otherwise round numbers.
    var xvals = xs.filter(function (v, i) { return xs.indexOf(v) === i; }).sort(function (a, b) { return a - b; });
    var xticks = xvals.length <= 12 && xvals.every(function (v) { return v === Math.round(v); }) ? xvals : ticks(x0, x1, 8);
    xticks.forEach(function (v) {
      el('line', {x1: sx(v), x2: sx(v), y1: T, y2: H - B, stroke: '#eee'}, axes);
      el('text', {x: sx(v), y: H - B + 15, 'text-anchor': 'middle'}, axes).textContent = fmtNum(v);
    });
    ticks(y0, y1, 6).forEach(function (v) {
      var yv = c.log_y ? Math.pow(10, v) : v, y = T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
      el('line', {x1: L, x2: W - R, y1: y, y2: y, stroke: '#eee'}, axes);
      el('text', {x: L - 6, y: y + 4, 'text-anchor': 'end'}, axes).textContent = fy(yv);
    });
    el('rect', {x: L, y: T, width: W - L - R, height: H - T - B, fill: 'none', stroke: '#999'}, axes);
    el('text', {x: L + (W - L - R) / 2, y: H - 8, 'text-anchor': 'middle'}, axes).textContent = c.x_label;
    el('text', {x: 14, y: T + (H - T - B) / 2, 'text-anchor': 'middle',
                transform: 'rotate(-90 14 ' + (T + (H - T - B) / 2) + ')'}, axes).textContent = c.y_label;
    var legend = document.createElement('div');
    legend.className = 'legend';
    series.forEach(function (s, i) {
      var color = COLORS[i % COLORS.length];
      var d = s.pts.map(function (p, k) { return (k ? 'L' : 'M') + sx(p[0]).toFixed(2) + ' ' + sy(p[1]).toFixed(2); });
      el('path', {d: d.join(' '), fill: 'none', stroke: color, 'stroke-width': 1.6, 'data-series': s.name,
                  'data-points': String(s.pts.length)}, svg);
      if (s.pts.length <= page.max_markers) {
        var g = el('g', {fill: color}, svg);
        s.pts.forEach(function (p) {
          var dot = el('circle', {cx: sx(p[0]).toFixed(2), cy: sy(p[1]).toFixed(2), r: s.pts.length > 200 ? 1.5 : 2.6,
                                  'data-series': s.name, 'data-x': String(p[0]), 'data-y': String(p[1])}, g);
          el('title', {}, dot).textContent = s.name + ' at ' + c.x_label + ' ' + fmtNum(p[0]) + ': ' + fy(p[1]);
        });
      }
      var item = document.createElement('span');
      item.innerHTML = '<i style="background:' + color + '"></i>';
      item.appendChild(document.createTextNode(s.name + ' (' + s.pts.length + ')'));
      legend.appendChild(item);
    });
    fig.appendChild(legend);
  }
  var root = document.getElementById('charts');
  page.charts.forEach(function (c) { drawChart(c, root); });
  document.body.setAttribute('data-rendered', String(page.charts.length));
})();
)JS";

constexpr const char* kStyle = R"CSS(
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 820px; }
h1 { font-size: 20px; } h2 { font-size: 15px; margin: 0 0 4px; }
figure { margin: 0 0 26px; } svg { display: block; max-width: 100%; height: auto; }
.notes { color: #555; } .notes p { margin: 2px 0; }
.legend span { margin-right: 14px; white-space: nowrap; }
.legend i { display: inline-block; width: 12px; height: 3px; margin: 0 5px 3px 0; }
#errors { color: #b00; white-space: pre-wrap; }
)CSS";

std::string escape_html(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

nlohmann::json to_json(const Page& page) {
  nlohmann::json charts = nlohmann::json::array();
  for (const Chart& c : page.charts) {
    nlohmann::json series = nlohmann::json::array();
    for (const Series& s : c.series) {
      nlohmann::json pts = nlohmann::json::array();
      for (const auto& [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y)) pts.push_back({x, y});  // JSON has no NaN
      series.push_back({{"name", s.name}, {"points", std::move(pts)}});
    }
    charts.push_back({{"id", c.id}, {"title", c.title}, {"x_label", c.x_label}, {"y_label", c.y_label},
                      {"y_format", c.y_format}, {"log_y", c.log_y}, {"series", std::move(series)}});
  }
  return {{"title", page.title}, {"max_markers", kMaxMarkers}, {"charts", std::move(charts)}};
}

}  // namespace

std::string render_html(const Page& page) {
  // Inside <script>, "</script>" would end the element: JSON's "<" can only be in strings, where
  // \u003c means the same.
  std::string data;
  for (char ch : to_json(page).dump()) data += ch == '<' ? std::string("\\u003c") : std::string(1, ch);
  std::string notes;
  for (const std::string& n : page.notes) notes += "<p>" + escape_html(n) + "</p>\n";
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{0}</title>\n<style>{1}</style>\n"
      "</head>\n<body>\n<h1>{0}</h1>\n<div class=\"notes\">\n{2}</div>\n<div id=\"errors\"></div>\n"
      "<div id=\"charts\"></div>\n"
      "<script>\nwindow.addEventListener('error', function (e) {{\n"
      "  document.getElementById('errors').textContent += 'error: ' + (e.message || e) + '\\n';\n"
      "  document.body.setAttribute('data-errors', 'yes');\n}});\n</script>\n"
      "<script type=\"application/json\" id=\"page-data\">{3}</script>\n<script>{4}</script>\n</body>\n</html>\n",
      escape_html(page.title), kStyle, notes, data, kScript);
}

void write_html(const std::string& path, const Page& page) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const std::string html = render_html(page);
    out.write(html.data(), std::streamsize(html.size()));
    out.flush();
    if (!out) throw Error(fmt::format("cannot write the report: {}", std::strerror(errno)), {.file = tmp});
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(fmt::format("cannot write the report: {}", ec.message()), {.file = path});
}

Page page_from_json(const nlohmann::json& j) {
  const auto fail = [](const std::string& what) { return Error("charts JSON: " + what); };
  if (!j.is_object()) throw fail("expected an object with \"charts\"");
  Page p;
  p.title = j.value("title", std::string("shardlm"));
  if (j.contains("notes"))
    for (const auto& n : j.at("notes")) p.notes.push_back(n.is_string() ? n.get<std::string>() : n.dump());
  if (!j.contains("charts") || !j.at("charts").is_array()) throw fail("\"charts\" must be a list");
  for (size_t ci = 0; ci < j.at("charts").size(); ++ci) {
    const nlohmann::json& cj = j.at("charts")[ci];
    const std::string where = fmt::format("charts[{}]", ci);
    if (!cj.is_object() || !cj.contains("series") || !cj.at("series").is_array())
      throw fail(where + " must be an object with a \"series\" list");
    Chart c;
    c.id = cj.value("id", fmt::format("chart{}", ci));
    c.title = cj.value("title", c.id);
    c.x_label = cj.value("x_label", std::string("x"));
    c.y_label = cj.value("y_label", std::string("y"));
    c.y_format = cj.value("y_format", std::string("number"));
    if (c.y_format != "number" && c.y_format != "bytes")
      throw fail(fmt::format("{}.y_format: expected number or bytes, got '{}'", where, c.y_format));
    c.log_y = cj.value("log_y", false);
    for (size_t si = 0; si < cj.at("series").size(); ++si) {
      const nlohmann::json& sj = cj.at("series")[si];
      Series s;
      s.name = sj.value("name", fmt::format("series{}", si));
      for (const auto& pt : sj.value("points", nlohmann::json::array())) {
        if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !(pt[1].is_number() || pt[1].is_null()))
          throw fail(fmt::format("{}.series[{}].points: expected [x, y] number pairs, got {}", where, si, pt.dump()));
        s.points.emplace_back(pt[0].get<double>(), pt[1].is_null() ? NAN : pt[1].get<double>());
      }
      c.series.push_back(std::move(s));
    }
    p.charts.push_back(std::move(c));
  }
  return p;
}

void TrainingReport::add(const nlohmann::json& r) {
  const auto step = r.find("step");
  if (step == r.end() || !step->is_number()) return;
  const double x = step->get<double>();
  const auto keep = [&](const std::string& key) {
    const auto v = r.find(key);
    if (v != r.end() && v->is_number()) values_[key].emplace_back(x, v->get<double>());
  };
  if (r.contains("lr")) {  // a training step's record
    for (const char* k : {"loss", "lr", "grad_norm", "tokens_per_s", "mem_peak_bytes", "rss_bytes",
                          "gpu_allocated_peak_bytes"})
      keep(k);
    for (int i = 0; i < kNumMemCategories; ++i) keep(std::string("mem_live_") + mem_category_name(MemCategory(i)));
  }
  if (r.contains("eval_loss")) {
    keep("eval_loss");
    keep("eval_accuracy");
  }
}

Page TrainingReport::page(const std::string& title, std::vector<std::string> notes) const {
  const auto series = [&](const std::string& key, const std::string& name) {
    const auto it = values_.find(key);
    return Series{name, it == values_.end() ? std::vector<std::pair<double, double>>{} : it->second};
  };
  const auto has = [&](const std::string& key) { return values_.count(key) > 0; };
  Page p{title, std::move(notes), {}};
  p.charts.push_back({"loss", "Loss", "step", "loss", "number", false,
                      {series("loss", "train loss"), series("eval_loss", "eval loss")}});
  if (has("eval_accuracy"))
    p.charts.push_back({"eval_accuracy", "Held-out accuracy", "step", "accuracy", "number", false,
                        {series("eval_accuracy", "eval accuracy")}});
  p.charts.push_back({"lr", "Learning rate", "step", "learning rate", "number", false, {series("lr", "lr")}});
  p.charts.push_back({"grad_norm", "Gradient norm (before clipping)", "step", "L2 norm", "number", false,
                      {series("grad_norm", "grad norm")}});
  p.charts.push_back({"tokens_per_s", "Throughput (tokens/s since the start, all ranks)", "step", "tokens/s",
                      "number", false, {series("tokens_per_s", "tokens/s")}});
  Chart mem{"memory", "Memory of rank 0: tracked live bytes by category after each step; peak tracked; RSS",
            "step", "bytes", "bytes", false, {}};
  for (int i = 0; i < kNumMemCategories; ++i) {
    const std::string key = std::string("mem_live_") + mem_category_name(MemCategory(i));
    const auto it = values_.find(key);
    // Categories that never held a byte would be a flat line at zero each: left out.
    if (it == values_.end() || std::all_of(it->second.begin(), it->second.end(), [](auto& v) { return v.second == 0; }))
      continue;
    mem.series.push_back(series(key, mem_category_name(MemCategory(i))));
  }
  mem.series.push_back(series("mem_peak_bytes", "peak tracked (all categories)"));
  mem.series.push_back(series("rss_bytes", "RSS"));
  if (has("gpu_allocated_peak_bytes")) mem.series.push_back(series("gpu_allocated_peak_bytes", "GPU allocator peak"));
  p.charts.push_back(std::move(mem));
  return p;
}

Page training_page_from_metrics(const std::string& metrics_path, const std::string& title) {
  std::ifstream in(metrics_path);
  if (!in) throw Error(fmt::format("cannot read metrics: {}", std::strerror(errno)), {.file = metrics_path});
  TrainingReport r;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json rec = io::parse_json_or_discarded(line);
    if (rec.is_discarded()) throw Error("not a JSON object", {.file = metrics_path, .line = line_no});
    r.add(rec);
  }
  return r.page(title, {"from " + metrics_path});
}

}  // namespace shardlm::report
