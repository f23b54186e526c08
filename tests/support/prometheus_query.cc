#include "prometheus_query.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string_view>
#include <utility>

#include "http_get.h"

namespace kdedup::testing {

std::string source_path(const std::string& rel) {
  return std::string(KDEDUP_SOURCE_DIR) + "/" + rel;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

QueryResult query_prometheus(int port, const std::string& promql) {
  QueryResult r;
  const auto resp = http_get(port, "/api/v1/query?query=" + url_encode(promql));
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(resp.body).get(doc) != simdjson::SUCCESS) {
    r.error = "HTTP " + std::to_string(resp.status) + ", unparseable body: " + resp.body;
    return r;
  }
  std::string_view status, error;
  if (doc["status"].get_string().get(status) || status != "success") {
    if (!doc["error"].get_string().get(error)) r.error = std::string(error);
    return r;
  }
  r.ok = true;
  std::string_view type;
  if (doc["data"]["resultType"].get_string().get(type) || type != "vector") {
    r.error = "result type is not a vector";
    r.ok = false;
    return r;
  }
  simdjson::dom::array result;
  if (doc["data"]["result"].get_array().get(result)) return r;
  for (simdjson::dom::element s : result) {
    std::map<std::string, std::string> labels;
    simdjson::dom::object metric;
    if (!s["metric"].get_object().get(metric)) {
      for (auto [k, v] : metric) {
        std::string_view value;
        if (!v.get_string().get(value)) labels[std::string(k)] = std::string(value);
      }
    }
    r.series.push_back(std::move(labels));
  }
  return r;
}

std::string substitute_grafana_variables(std::string expr) {
  const std::vector<std::pair<std::string, std::string>> vars{
      {"$__rate_interval", "1m"}, {"$__interval", "15s"}, {"$__range", "5m"},
      {"$namespace", ".*"},       {"$pod", ".*"},         {"$topic", ".*"},
      {"$partition", ".*"}};
  for (const auto& [var, value] : vars) {
    for (std::size_t pos; (pos = expr.find(var)) != std::string::npos;) {
      expr.replace(pos, var.size(), value);
    }
  }
  return expr;
}

void collect_panel_queries(simdjson::dom::array panels, std::vector<PanelQuery>& out) {
  for (simdjson::dom::element p : panels) {
    std::string_view title;
    if (p["title"].get_string().get(title)) title = "(untitled)";
    simdjson::dom::array nested;
    if (!p["panels"].get_array().get(nested)) collect_panel_queries(nested, out);
    simdjson::dom::array targets;
    if (p["targets"].get_array().get(targets)) continue;
    for (simdjson::dom::element t : targets) {
      std::string_view expr;
      if (!t["expr"].get_string().get(expr)) out.push_back({std::string(title), std::string(expr)});
    }
  }
}

}  // namespace kdedup::testing
