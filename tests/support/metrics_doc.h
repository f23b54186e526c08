#pragma once
// The metric reference tables of docs/metrics.md, read the way operators
// read them: every row "| `kdedup_name` | type | labels | ... |" names one
// exported metric and its Prometheus type. Tests compare this list with what
// a Metrics registry or a running kdedup exports. Also what tests read
// from a /metrics scrape: declared types and summed samples.

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kdedup::testing {

struct MetricsDoc {
  std::map<std::string, std::string> types;  ///< metric name -> "counter", "gauge", ...
  std::vector<std::string> problems;         ///< short rows, names listed twice, unreadable file
};

/// Parses the markdown file at `path` (normally KDEDUP_SOURCE_DIR/docs/metrics.md).
MetricsDoc read_metrics_doc(const std::string& path);

/// Metric names and types declared by "# TYPE name type" lines of a
/// Prometheus text exposition (a /metrics scrape).
std::map<std::string, std::string> exposition_types(const std::string& text);

/// Sum of the samples of metric `name` in a Prometheus text exposition, over
/// every label set or only the lines that contain each of `labels` (e.g.
/// `reason="missing_key"`); nullopt when no sample matched.
std::optional<double> exposition_sum(const std::string& text, const std::string& name,
                                     const std::vector<std::string>& labels = {});

/// Number of labelled series of metric `name` in a Prometheus text exposition.
std::size_t exposition_series(const std::string& text, const std::string& name);

}  // namespace kdedup::testing
