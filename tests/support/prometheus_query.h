#pragma once
// Evaluating the shipped Grafana dashboard and alert rules against a real
// Prometheus in integration tests: its HTTP query API, the dashboard's
// template variables, and the panel queries of the dashboard JSON.

#include <map>
#include <string>
#include <vector>

#include <simdjson.h>

namespace kdedup::testing {

/// `rel` (e.g. "docs/metrics.md") under the source tree.
std::string source_path(const std::string& rel);

/// A loopback port nobody listens on right now (the kernel's pick for port 0).
int free_port();

/// Answer of Prometheus' /api/v1/query for an instant vector.
struct QueryResult {
  bool ok = false;    ///< HTTP 200, status "success" and a vector result
  std::string error;  ///< Prometheus' error or a transport problem
  std::vector<std::map<std::string, std::string>> series;  ///< label sets of the result
};

/// Runs `promql` against the Prometheus on 127.0.0.1:`port`.
QueryResult query_prometheus(int port, const std::string& promql);

/// Replaces the dashboard's Grafana variables ($topic, $__rate_interval, ...)
/// with values that select everything, so a panel query runs as PromQL.
std::string substitute_grafana_variables(std::string expr);

struct PanelQuery {
  std::string panel;  ///< panel title
  std::string expr;   ///< PromQL as written in the dashboard
};

/// Appends every target expression of `panels`, rows' nested panels included.
void collect_panel_queries(simdjson::dom::array panels, std::vector<PanelQuery>& out);

}  // namespace kdedup::testing
