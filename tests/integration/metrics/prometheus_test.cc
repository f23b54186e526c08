// Runs a real Prometheus server against two test instances exposing kdedup's
// metrics on loopback: a healthy one (pod kdedup-0) and a sick one (pod
// kdedup-1: false positives above target, lag growing, dead letters,
// delivery errors, failing snapshots, rebuild loop, refused snapshots,
// aborting transactions, memory budget exceeded, not ready). Then every
// Grafana panel query and template variable must evaluate and return data,
// every alert expression must be valid, fire for the sick pod only, and load
// as a rule without evaluation errors; promtool accepts the rules file and
// the scrape.
//
// When the pipeline is wired to the metrics module, the same checks should
// also run against a real kdedup on the test broker.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <simdjson.h>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "exercise.h"
#include "http_get.h"
#include "kdedup/metrics/server.h"
#include "process.h"
#include "prometheus_query.h"

namespace kdedup::metrics {
namespace {

using kdedup::testing::collect_panel_queries;
using kdedup::testing::free_port;
using kdedup::testing::http_get;
using kdedup::testing::PanelQuery;
using kdedup::testing::source_path;
using kdedup::testing::url_encode;
using namespace std::chrono_literals;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kPromtool = "/usr/bin/promtool";

// A Prometheus server in a temp dir; stopped (SIGTERM, then SIGKILL) when the
// object dies.
class PrometheusServer {
 public:
  PrometheusServer(const kdedup::testing::TempDir& dir, const std::string& config)
      : port_(free_port()) {
    kdedup::testing::write_file(dir.file("prometheus.yml"), config);
    std::filesystem::create_directories(dir.file("tsdb"));
    log_ = dir.file("prometheus.log");
    const std::vector<std::string> argv{kPrometheus, "--config.file=" + dir.file("prometheus.yml"),
                                        "--storage.tsdb.path=" + dir.file("tsdb"),
                                        "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                        "--log.level=warn"};
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~PrometheusServer() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(50ms);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }
  std::string log() const { return kdedup::testing::read_file(log_); }

  bool wait_ready(std::chrono::seconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (http_get(port_, "/-/ready").status == 200) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

 private:
  int port_;
  pid_t pid_ = -1;
  std::string log_;
};

class PrometheusIntegration : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kPrometheus)) << kPrometheus << " is not installed";
    healthy_ = std::move(*Metrics::create(MetricsOptions{}));
    sick_ = std::move(*Metrics::create(MetricsOptions{}));
    healthy_handles_ = kdedup::testing::exercise_every_metric(*healthy_);
    sick_handles_ = kdedup::testing::exercise_every_metric(*sick_);
    sick_->health().set_not_ready("restoring 1 of 4 partitions");
    sick_partition_ = sick_->partition("orders", 9);
    auto a = MetricsServer::start("127.0.0.1:0", *healthy_);
    auto b = MetricsServer::start("127.0.0.1:0", *sick_);
    ASSERT_TRUE(a && b);
    healthy_server_ = std::move(*a);
    sick_server_ = std::move(*b);

    // Traffic keeps flowing so counters move between scrapes.
    traffic_ = std::thread([this] {
      for (int round = 2; !stop_; ++round) {
        kdedup::testing::add_traffic(*healthy_, healthy_handles_, round);
        kdedup::testing::add_traffic(*sick_, sick_handles_, round);
        make_sick(round);
        std::this_thread::sleep_for(100ms);
      }
    });

    const std::string config =
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files:\n  - " +
        source_path("helm/kdedup/alerts/kdedup-rules.yaml") +
        "\n"
        "scrape_configs:\n  - job_name: kdedup\n    static_configs:\n"
        "      - targets: ['127.0.0.1:" +
        std::to_string(healthy_server_->port()) +
        "']\n"
        "        labels: {namespace: test, pod: kdedup-0}\n"
        "      - targets: ['127.0.0.1:" +
        std::to_string(sick_server_->port()) +
        "']\n"
        "        labels: {namespace: test, pod: kdedup-1}\n";
    prometheus_ = std::make_unique<PrometheusServer>(dir_, config);
    ASSERT_TRUE(prometheus_->wait_ready(30s)) << prometheus_->log();

    // Enough scrapes of both targets for rate(), deriv() and increase().
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = kdedup::testing::query_prometheus(
          prometheus_->port(), "count(count_over_time(kdedup_build_info[1m]) >= 4)");
      if (r.ok && !r.series.empty()) {
        auto c = kdedup::testing::query_prometheus(
            prometheus_->port(), "count(count_over_time(kdedup_build_info[1m]) >= 4) == 2");
        if (c.ok && !c.series.empty()) break;
      }
      std::this_thread::sleep_for(250ms);
    }
  }

  void TearDown() override {
    stop_ = true;
    if (traffic_.joinable()) traffic_.join();
    prometheus_.reset();  // stops the server before its directory goes
  }

  // Everything the alerts watch for, on the sick instance only.
  void make_sick(int round) {
    auto& orders0 = *sick_partition_;  // only touched here, so its values never flip
    orders0.add_batch(BatchCounts{.in = 100, .dlq = 100});
    orders0.add_audit(
        AuditCounts{.sampled = 60, .truly_new = 50, .false_positives = 5, .false_negatives = 1});
    filter::FilterStats s{
        .bytes = 1u << 20, .cells = 1000, .live_cells = 990, .subfilters = 9, .fpp_estimate = 0.05};
    orders0.set_filter(s, 30.0);
    orders0.snapshot_failed();
    orders0.rebuilt(1000);
    orders0.snapshot_refused("corrupt");
    sick_->set_memory(16u << 20, 16u << 20, 0.04);  // over budget: fpp raised 4x
    sick_->add_delivery_errors("orders-dedup", 3);
    sick_->add_transactions(1, 1, 100, 10);
    auto stats = parse_statistics(
        R"({"type": "consumer", "topics": {"orders": {"partitions": {"0": {"partition": 0,
            "consumer_lag": )" +
        std::to_string(5000 + 1000 * round) + "}}}}}");
    if (stats) sick_->apply_statistics(*stats);
  }

  kdedup::testing::TempDir dir_;
  std::unique_ptr<Metrics> healthy_, sick_;
  kdedup::testing::PartitionHandles healthy_handles_, sick_handles_;
  std::unique_ptr<PartitionMetrics> sick_partition_;
  std::unique_ptr<MetricsServer> healthy_server_, sick_server_;
  std::unique_ptr<PrometheusServer> prometheus_;
  std::atomic<bool> stop_{false};
  std::thread traffic_;
};

TEST_F(PrometheusIntegration, DashboardAlertsAndPromtool) {
  const int port = prometheus_->port();
  auto up = kdedup::testing::query_prometheus(port, "up{job=\"kdedup\"} == 1");
  ASSERT_TRUE(up.ok) << up.error;
  ASSERT_EQ(up.series.size(), 2u) << "both test instances must be scraped\n" << prometheus_->log();

  // --- every dashboard panel query is valid and returns data --------------
  simdjson::dom::parser parser;
  simdjson::dom::element dash;
  const std::string dashboard_json =
      kdedup::testing::read_file(source_path("helm/kdedup/dashboards/kdedup.json"));
  ASSERT_EQ(parser.parse(dashboard_json).get(dash), simdjson::SUCCESS);
  std::string_view uid;
  ASSERT_FALSE(dash["uid"].get_string().get(uid));
  EXPECT_EQ(uid, "kdedup-overview");
  int64_t schema = 0;
  ASSERT_FALSE(dash["schemaVersion"].get_int64().get(schema));
  EXPECT_GE(schema, 36);
  simdjson::dom::array panels;
  ASSERT_FALSE(dash["panels"].get_array().get(panels));
  std::vector<PanelQuery> queries;
  collect_panel_queries(panels, queries);
  ASSERT_GT(queries.size(), 30u);
  for (const auto& q : queries) {
    const std::string promql = kdedup::testing::substitute_grafana_variables(q.expr);
    auto r = kdedup::testing::query_prometheus(port, promql);
    EXPECT_TRUE(r.ok) << "panel '" << q.panel << "': " << promql << "\n  " << r.error;
    EXPECT_FALSE(r.series.empty()) << "panel '" << q.panel << "' returned no data: " << promql;
  }

  // --- template variables: label_values(selector, label) ------------------
  simdjson::dom::array vars;
  ASSERT_FALSE(dash["templating"]["list"].get_array().get(vars));
  std::set<std::string> var_names;
  for (simdjson::dom::element v : vars) {
    std::string_view name, type, def;
    ASSERT_FALSE(v["name"].get_string().get(name));
    ASSERT_FALSE(v["type"].get_string().get(type));
    var_names.insert(std::string(name));
    if (type == "datasource") {
      std::string_view plugin;
      ASSERT_FALSE(v["query"].get_string().get(plugin));
      EXPECT_EQ(plugin, "prometheus");
      continue;
    }
    ASSERT_FALSE(v["definition"].get_string().get(def)) << name;
    const std::string d(def);
    ASSERT_EQ(d.rfind("label_values(", 0), 0u) << d;
    const std::size_t comma = d.rfind(',');
    const std::string selector =
        kdedup::testing::substitute_grafana_variables(d.substr(13, comma - 13));
    std::string label = d.substr(comma + 1, d.size() - comma - 2);
    label.erase(0, label.find_first_not_of(' '));
    auto r = kdedup::testing::query_prometheus(port, selector);
    ASSERT_TRUE(r.ok) << "variable " << name << ": " << selector << "\n  " << r.error;
    ASSERT_FALSE(r.series.empty()) << "variable " << name << ": no series for " << selector;
    EXPECT_TRUE(r.series.front().count(label)) << "variable " << name << ": no label " << label;
  }
  EXPECT_EQ(var_names,
            (std::set<std::string>{"datasource", "namespace", "pod", "topic", "partition"}));

  // --- alert expressions: valid, fire for the sick pod only ---------------
  const YAML::Node rules = YAML::LoadFile(source_path("helm/kdedup/alerts/kdedup-rules.yaml"));
  std::set<std::string> alerts;
  for (const auto& group : rules["groups"]) {
    for (const auto& rule : group["rules"]) {
      const std::string name = rule["alert"].as<std::string>();
      const std::string expr = rule["expr"].as<std::string>();
      alerts.insert(name);
      EXPECT_TRUE(rule["for"]) << name;
      EXPECT_TRUE(rule["labels"]["severity"]) << name;
      EXPECT_TRUE(rule["annotations"]["summary"] && rule["annotations"]["description"]) << name;
      const std::string runbook = rule["annotations"]["runbook"].as<std::string>("");
      EXPECT_EQ(runbook.rfind("docs/metrics.md#", 0), 0u) << name;
      auto r = kdedup::testing::query_prometheus(port, expr);
      ASSERT_TRUE(r.ok) << name << ": " << expr << "\n  " << r.error;
      std::set<std::string> pods;
      for (const auto& s : r.series) pods.insert(s.count("pod") ? s.at("pod") : "(none)");
      if (name == "KdedupSnapshotStale") {
        // Snapshots were just written; the age cannot be faked in seconds.
        EXPECT_TRUE(pods.empty()) << name << " fires on fresh snapshots";
      } else {
        EXPECT_EQ(pods, std::set<std::string>{"kdedup-1"}) << name << ": " << expr;
      }
    }
  }
  EXPECT_EQ(alerts.size(), 13u);
  // Each runbook anchor is the GitHub slug of a heading in docs/metrics.md.
  std::set<std::string> anchors;
  std::istringstream docs(kdedup::testing::read_file(source_path("docs/metrics.md")));
  for (std::string line; std::getline(docs, line);) {
    if (line.rfind("#", 0) != 0) continue;
    std::string slug;
    for (const char c : line.substr(line.find(' ') + 1)) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') {
        slug += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      } else if (c == ' ') {
        slug += '-';
      }
    }
    anchors.insert(slug);
  }
  for (const auto& group : rules["groups"]) {
    for (const auto& rule : group["rules"]) {
      const std::string runbook = rule["annotations"]["runbook"].as<std::string>("");
      const std::size_t hash = runbook.find('#');
      ASSERT_NE(hash, std::string::npos) << runbook;
      EXPECT_TRUE(anchors.count(runbook.substr(hash + 1)))
          << rule["alert"].as<std::string>() << ": no heading for " << runbook;
    }
  }

  // --- the rules as Prometheus loaded them evaluate without errors --------
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  std::string rules_body;
  bool all_ok = false;
  while (!all_ok && std::chrono::steady_clock::now() < deadline) {
    rules_body = http_get(port, "/api/v1/rules").body;
    simdjson::dom::element doc;
    simdjson::dom::parser p2;
    int ok = 0, total = 0;
    if (!p2.parse(rules_body).get(doc)) {
      simdjson::dom::array groups;
      if (!doc["data"]["groups"].get_array().get(groups)) {
        for (simdjson::dom::element g : groups) {
          simdjson::dom::array rs;
          if (g["rules"].get_array().get(rs)) continue;
          for (simdjson::dom::element r : rs) {
            std::string_view health;
            ++total;
            if (!r["health"].get_string().get(health) && health == "ok") ++ok;
          }
        }
      }
    }
    all_ok = total == 13 && ok == total;
    if (!all_ok) std::this_thread::sleep_for(250ms);
  }
  EXPECT_TRUE(all_ok) << rules_body;

  // --- promtool ----------------------------------------------------------
  auto check_rules = kdedup::testing::run_process(
      {kPromtool, "check", "rules", source_path("helm/kdedup/alerts/kdedup-rules.yaml")});
  EXPECT_EQ(check_rules.exit_code, 0) << check_rules.out << check_rules.err;
  const auto scrape = http_get(healthy_server_->port(), "/metrics");
  ASSERT_EQ(scrape.status, 200);
  auto check_metrics = kdedup::testing::run_process({kPromtool, "check", "metrics"}, scrape.body);
  EXPECT_EQ(check_metrics.exit_code, 0) << check_metrics.out << check_metrics.err;
}

}  // namespace
}  // namespace kdedup::metrics
