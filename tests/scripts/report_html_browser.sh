#!/usr/bin/env bash
# report.html and `shardlm report --charts` pages in a real headless browser (Debian's chromium):
#  1. the run's report.html (written by tensorboard_cli) loads with no JavaScript error, on the
#     console or on the page, and the DOM it renders draws each run's points: per chart, each
#     series' <path data-points> and its <circle data-x data-y> markers equal, in number and value,
#     the metrics.jsonl records (train loss, eval loss, lr, grad norm, tokens/s, memory by category);
#  2. a page from `shardlm report --charts JSON` (what bench/scaling.sh writes) renders its series;
#  3. the check itself catches a broken page: the report with its script broken fails step 1's check.
# Exits 77 (reported skipped) only when chromium is missing or cannot start, saying why.
# Usage: report_html_browser.sh SHARDLM PYTHON RUNDIR WORKDIR
set -euo pipefail
shardlm=$1
py=$2
run=$3
work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

browser=$(command -v chromium || command -v chromium-browser || true)
[[ -n "$browser" ]] || { echo "SKIP: chromium is not installed (scripts/install-deps.sh --test installs it)"; exit 77; }
# --virtual-time-budget lets the page's script run to the end before the DOM is dumped;
# --enable-logging=stderr --v=0 puts the page's console (uncaught errors included) on stderr.
render() {  # render FILE.html OUT.dom OUT.console
  HOME=$work timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
    --user-data-dir="$work/profile" --enable-logging=stderr --v=0 --virtual-time-budget=10000 \
    --dump-dom "file://$1" > "$2" 2> "$3"
}
if ! render /dev/null "$work/blank.dom" "$work/blank.err" || ! grep -q "<html" "$work/blank.dom"; then
  echo "SKIP: chromium cannot start here: $(grep -v '^\s*$' "$work/blank.err" | tail -3 | tr '\n' ' ')"
  exit 77
fi

cat > "$work/check_dom.py" <<'PY'
# check_dom.py DOM CONSOLE EXPECTED.json: the rendered DOM draws exactly the expected series.
import json, re, sys
from html.parser import HTMLParser

dom, console, expected = open(sys.argv[1]).read(), open(sys.argv[2], errors="replace").read(), json.load(open(sys.argv[3]))
errors = [l for l in console.splitlines() if "CONSOLE" in l and re.search(r"Uncaught|Error", l)]
assert not errors, "JavaScript errors on the console:\n" + "\n".join(errors)

class Walk(HTMLParser):
    def __init__(self):
        super().__init__()
        self.chart, self.body, self.paths, self.marks, self.errors_text, self.in_errors = None, {}, {}, {}, "", False
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body": self.body = a
        if tag == "svg" and "data-chart" in a: self.chart = a["data-chart"]
        if tag == "path" and "data-series" in a:
            self.paths[(self.chart, a["data-series"])] = int(a["data-points"])
        if tag == "circle" and "data-series" in a:
            self.marks.setdefault((self.chart, a["data-series"]), []).append((float(a["data-x"]), float(a["data-y"])))
        if tag == "div" and a.get("id") == "errors": self.in_errors = True
    def handle_endtag(self, tag):
        if tag == "svg": self.chart = None
        if tag == "div": self.in_errors = False
    def handle_data(self, data):
        if self.in_errors: self.errors_text += data

w = Walk()
w.feed(dom)
assert "data-errors" not in w.body and not w.errors_text.strip(), "errors on the page: " + w.errors_text
assert w.body.get("data-rendered") == str(len(expected["charts"])), \
    f"rendered {w.body.get('data-rendered')!r} charts, expected {len(expected['charts'])} (the script did not finish)"
n = 0
for chart, series in expected["charts"].items():
    for name, pts in series.items():
        key = (chart, name)
        assert key in w.paths, f"chart {chart}: no series {name!r} drawn (drawn: {sorted(w.paths)})"
        assert w.paths[key] == len(pts), f"chart {chart} {name!r}: {w.paths[key]} points drawn, {len(pts)} expected"
        got = w.marks.get(key, [])
        assert got == [tuple(p) for p in pts], f"chart {chart} {name!r}: markers {got[:5]}... != {pts[:5]}..."
        n += len(pts)
for key in w.paths:
    assert key[0] not in expected["charts"] or key[1] in expected["charts"][key[0]] or key[0] == "memory", \
        f"unexpected series {key}"
print(f"{len(expected['charts'])} charts, {n} points drawn as expected, no JavaScript errors")
PY

# ---- 1. the run's report.html against its metrics.jsonl ----
"$py" - "$run/metrics.jsonl" "$work/expected.json" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "lr" in r]
evals = [r for r in recs if "eval_loss" in r]
def pts(rows, key): return [[r["step"], r[key]] for r in rows if isinstance(r.get(key), (int, float))]
charts = {
    "loss": {"train loss": pts(steps, "loss"), "eval loss": pts(evals, "eval_loss")},
    "eval_accuracy": {"eval accuracy": pts(evals, "eval_accuracy")},
    "lr": {"lr": pts(steps, "lr")},
    "grad_norm": {"grad norm": pts(steps, "grad_norm")},
    "tokens_per_s": {"tokens/s": pts(steps, "tokens_per_s")},
    "memory": {"parameters": pts(steps, "mem_live_parameters"), "optimizer": pts(steps, "mem_live_optimizer"),
               "peak tracked (all categories)": pts(steps, "mem_peak_bytes"), "RSS": pts(steps, "rss_bytes")},
}
assert len(steps) >= 5 and len(evals) >= 2, (len(steps), len(evals))
json.dump({"charts": charts}, open(sys.argv[2], "w"))
PY
render "$run/report.html" "$work/report.dom" "$work/report.console" || fail "chromium failed on report.html"
echo "1. report.html: $("$py" "$work/check_dom.py" "$work/report.dom" "$work/report.console" "$work/expected.json")" \
  || fail "report.html check"

# ---- 2. a --charts page ----
cat > "$work/charts.json" <<'JSON'
{"title": "scaling <test>", "notes": ["two charts"],
 "charts": [{"id": "mem", "title": "peak", "x_label": "ranks", "y_label": "bytes", "y_format": "bytes",
             "series": [{"name": "FULL_SHARD", "points": [[1, 3e6], [2, 2e6], [4, 1.5e6]]},
                        {"name": "NO_SHARD", "points": [[1, 3e6], [2, 3e6], [4, 3e6]]}]},
            {"id": "time", "title": "step time", "x_label": "ranks", "y_label": "s", "log_y": true,
             "series": [{"name": "FULL_SHARD", "points": [[1, 0.5], [2, 0.3], [4, null]]}]}]}
JSON
"$shardlm" report --charts "$work/charts.json" --out "$work/charts.html" > /dev/null
cat > "$work/charts_expected.json" <<'JSON'
{"charts": {"mem": {"FULL_SHARD": [[1, 3e6], [2, 2e6], [4, 1.5e6]], "NO_SHARD": [[1, 3e6], [2, 3e6], [4, 3e6]]},
            "time": {"FULL_SHARD": [[1, 0.5], [2, 0.3]]}}}
JSON
render "$work/charts.html" "$work/charts.dom" "$work/charts.console" || fail "chromium failed on the charts page"
echo "2. --charts page: $("$py" "$work/check_dom.py" "$work/charts.dom" "$work/charts.console" "$work/charts_expected.json")" \
  || fail "charts page check"

# ---- 3. the check catches a broken script ----
sed 's/page\.charts\.forEach(function (c) { drawChart/page.charts.forEach(function (c) { drawCharts/' \
  "$run/report.html" > "$work/broken.html"
cmp -s "$run/report.html" "$work/broken.html" && fail "could not break the page's script for the negative check"
render "$work/broken.html" "$work/broken.dom" "$work/broken.console" || true
if "$py" "$work/check_dom.py" "$work/broken.dom" "$work/broken.console" "$work/expected.json" > "$work/broken.out" 2>&1; then
  fail "a page whose script throws passed the check"
fi
echo "3. a broken page fails the check: $(grep -A1 -E 'AssertionError' "$work/broken.out" | tr '\n' ' ' | head -c 200)"
echo "PASS"
