// The running service, observed: `kdedup run` on the test broker with
// metrics.address set. Its /metrics must count exactly what an exact oracle
// counts for the stream it read, /healthz and /readyz must answer 200, the
// scrape must pass `promtool check metrics` and export exactly the names in
// docs/metrics.md, and a real Prometheus scraping it must evaluate every
// dashboard panel query and every alert expression without error. The two
// latency histograms get one observation per batch and one per record
// emitted to the output, in the bucket of its own value.

#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "broker.h"
#include "http_get.h"
#include "kdedup/testbroker/child_process.h"
#include "metrics_doc.h"
#include "prometheus_query.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;
using testbroker::ChildOptions;
using testbroker::ChildProcess;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kPromtool = "/usr/bin/promtool";

/// Sum of the samples of `name` in a text exposition whose label set
/// contains every `labels` entry (written `key="value"`).
double sum_samples(const std::string& text, const std::string& name,
                   const std::vector<std::string>& labels = {}) {
  return exposition_sum(text, name, labels).value_or(0.0);
}

TEST(Observability, RunningServiceExportsWhatItDid) {
  ASSERT_TRUE(std::filesystem::exists(kPrometheus)) << kPrometheus << " is not installed";
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:3", "out:3", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;

  // The stream and its exact oracle: 600 keyed records over 250 identities
  // (all inside the window) and 20 records without a key (invalid:
  // missing_key, routed to the DLQ). Records are stamped 100 s in the past,
  // except every 50th, stamped 10 minutes in the future (age at emit 0).
  std::vector<TestRecord> records;
  std::set<std::string> seen;
  std::uint64_t distinct = 0, duplicate = 0, invalid = 0, emitted_future = 0, future = 0;
  const std::int64_t t0 = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  for (int i = 0; i < 620; ++i) {
    TestRecord r;
    r.value = "v" + std::to_string(i);
    const bool in_future = i % 50 == 49;
    future += in_future;
    r.timestamp_ms = in_future ? t0 + 600'000 : t0 - 100'000;
    if (i % 31 == 30) {
      ++invalid;
      r.partition = i % 3;
    } else {
      r.key = "id-" + std::to_string((i * 7919) % 250);
      // Same key, same partition: the first in produce order is emitted.
      if (seen.insert(*r.key).second) {
        ++distinct;
        emitted_future += in_future;
      } else {
        ++duplicate;
      }
    }
    records.push_back(std::move(r));
  }
  ASSERT_GT(emitted_future, 0u);
  ASSERT_EQ(invalid, 20u);
  ASSERT_TRUE(b.produce("in", records));

  TempDir dir;
  const int metrics_port = free_port();
  write_file(dir.file("kdedup.yaml"),
             "group_id: observability\n"
             "input:\n  topics: [in]\n"
             "output:\n  topic: out\n"
             "identity:\n  extractor: key\n  salt: observability-salt\n"
             "window: 1h\n"
             "filter:\n  type: timer\n  fpp: 0.001\n  capacity: 10000\n"
             "threads: 2\n"
             "on_invalid: dlq\n"
             "dlq_topic: dlq\n"
             "commit_interval: 200ms\n"
             "batch_size: 16\n"
             "kafka:\n  bootstrap.servers: \"" +
                 b.bootstrap() +
                 "\"\n  statistics.interval.ms: \"1000\"\n"
                 "consumer:\n  session.timeout.ms: \"6000\"\n  heartbeat.interval.ms: \"500\"\n"
                 "metrics:\n  address: \"127.0.0.1:" +
                 std::to_string(metrics_port) + "\"\n  audit_sample: 1\n" + "state:\n  dir: \"" +
                 dir.file("state") + "\"\n");
  ChildOptions o;
  o.stderr_file = dir.file("kdedup.log");
  auto kdedup = ChildProcess::spawn({KDEDUP_BINARY, "run", "--config", dir.file("kdedup.yaml")}, o);
  ASSERT_TRUE(kdedup) << kdedup.error().message;

  // Wait until the bridge has published every record (period 1 s).
  const auto spawned = std::chrono::steady_clock::now();
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + 40s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = http_get(metrics_port, "/metrics");
    if (r.status == 200) {
      text = r.body;
      if (sum_samples(text, "kdedup_records_in_total") >= 620) break;
    }
    ASSERT_FALSE((*kdedup)->poll_exit()) << read_file(dir.file("kdedup.log"));
    std::this_thread::sleep_for(250ms);
  }
  ASSERT_EQ(sum_samples(text, "kdedup_records_in_total"), 620) << read_file(dir.file("kdedup.log"));
  // An upper bound of the processing time: from start (group join included)
  // to the bridge round that published the last record.
  const double processing_seconds =
      std::ceil(std::chrono::duration<double>(std::chrono::steady_clock::now() - spawned).count());

  // librdkafka statistics (every 1 s here) feed the consumer lag: one series
  // per assigned partition, down to 0 once every record was committed.
  const auto lag_deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < lag_deadline) {
    auto r = http_get(metrics_port, "/metrics");
    if (r.status == 200) {
      text = r.body;
      if (exposition_series(text, "kdedup_consumer_lag") == 3 &&
          sum_samples(text, "kdedup_consumer_lag") == 0) {
        break;
      }
    }
    std::this_thread::sleep_for(250ms);
  }
  EXPECT_EQ(exposition_series(text, "kdedup_consumer_lag"), 3u)
      << read_file(dir.file("kdedup.log"));
  EXPECT_EQ(sum_samples(text, "kdedup_consumer_lag"), 0);
  // Every record was processed: nothing waits in the worker queues.
  EXPECT_EQ(exposition_series(text, "kdedup_queue_depth"), 3u);
  EXPECT_EQ(sum_samples(text, "kdedup_queue_depth"), 0);
  EXPECT_EQ(sum_samples(text, "kdedup_records_distinct_total"), static_cast<double>(distinct));
  EXPECT_EQ(sum_samples(text, "kdedup_records_duplicate_total"), static_cast<double>(duplicate));
  EXPECT_EQ(sum_samples(text, "kdedup_records_invalid_total", {"reason=\"missing_key\""}), 20);
  EXPECT_EQ(sum_samples(text, "kdedup_records_invalid_total"), 20);
  EXPECT_EQ(sum_samples(text, "kdedup_records_dlq_total"), 20);
  // audit_sample 1: every valid decision is audited and none was wrong.
  EXPECT_EQ(sum_samples(text, "kdedup_audit_sampled_total"), 600);
  EXPECT_EQ(sum_samples(text, "kdedup_audit_truly_new_total"), static_cast<double>(distinct));
  EXPECT_EQ(sum_samples(text, "kdedup_audit_false_positives_total"), 0);
  EXPECT_EQ(sum_samples(text, "kdedup_consumer_assigned_partitions"), 3);
  EXPECT_GE(sum_samples(text, "kdedup_consumer_rebalances_total"), 1);
  EXPECT_EQ(sum_samples(text, "kdedup_workers"), 2);
  EXPECT_GT(sum_samples(text, "kdedup_filter_bytes"), 0);
  // The records stamped 10 minutes ahead were capped at wall clock + 1 m
  // (max_future_skew): counted, and the partitions' clocks now run ahead.
  EXPECT_EQ(sum_samples(text, "kdedup_clock_capped_records_total"), static_cast<double>(future));
  EXPECT_EQ(sum_samples(text, "kdedup_clock_missing_timestamp_records_total"), 0);
  EXPECT_EQ(exposition_series(text, "kdedup_filter_clock_ahead_seconds"), 3u);
  EXPECT_GT(sum_samples(text, "kdedup_filter_clock_ahead_seconds"), 20);

  // Latency histograms. Age at emit: one observation per record in the
  // output topic, in the bucket of its age (about 100 s; 0 for the records
  // stamped in the future).
  auto out = b.read_topic("out");
  ASSERT_TRUE(out) << out.error().message;
  ASSERT_EQ(out->size(), distinct);
  const auto histograms_by = std::chrono::steady_clock::now() + 5s;
  while (sum_samples(text, "kdedup_record_age_at_emit_seconds_count") != distinct &&
         std::chrono::steady_clock::now() < histograms_by) {
    std::this_thread::sleep_for(250ms);
    text = http_get(metrics_port, "/metrics").body;
  }
  const auto age_bucket = [&text](const char* le) {
    return sum_samples(text, "kdedup_record_age_at_emit_seconds_bucket",
                       {"topic=\"in\"", std::string("le=\"") + le + "\""});
  };
  EXPECT_EQ(sum_samples(text, "kdedup_record_age_at_emit_seconds_count", {"topic=\"in\""}),
            static_cast<double>(out->size()));
  EXPECT_EQ(age_bucket("0.005"), static_cast<double>(emitted_future));
  EXPECT_EQ(age_bucket("60"), static_cast<double>(emitted_future));
  EXPECT_EQ(age_bucket("300"), static_cast<double>(distinct));
  EXPECT_EQ(age_bucket("+Inf"), static_cast<double>(distinct));
  const double age_sum = sum_samples(text, "kdedup_record_age_at_emit_seconds_sum");
  EXPECT_GE(age_sum, 100.0 * static_cast<double>(distinct - emitted_future));
  EXPECT_LE(age_sum, (100.0 + processing_seconds + 5) * static_cast<double>(distinct));
  // Batch processing time: one observation per batch. No batch holds more
  // than batch_size (16) records, so 620 records took at least 39 batches,
  // many more than the bridge's one-second periods while they were processed.
  const double batches = sum_samples(text, "kdedup_batch_processing_seconds_count");
  EXPECT_GE(batches, 39);
  EXPECT_GT(batches, processing_seconds) << "one observation per bridge period?";
  EXPECT_GT(sum_samples(text, "kdedup_batch_processing_seconds_sum"), 0);
  EXPECT_EQ(sum_samples(text, "kdedup_batch_processing_seconds_bucket", {"le=\"+Inf\""}), batches);
  std::printf(
      "latency histograms: %.0f batches observed within at most %.0f s of processing "
      "(%.0f at le=0.001 s); %zu output records, %.0f ages observed (%llu future-stamped at "
      "le=0.005 s, mean age %.1f s)\n",
      batches, processing_seconds,
      sum_samples(text, "kdedup_batch_processing_seconds_bucket", {"le=\"0.001\""}), out->size(),
      sum_samples(text, "kdedup_record_age_at_emit_seconds_count"),
      static_cast<unsigned long long>(emitted_future), age_sum / static_cast<double>(distinct));

  EXPECT_EQ(http_get(metrics_port, "/healthz").status, 200);
  EXPECT_EQ(http_get(metrics_port, "/readyz").status, 200);

  // promtool accepts the real scrape; the names are exactly the documented ones.
  auto check = run_process({kPromtool, "check", "metrics"}, text);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  const MetricsDoc doc = read_metrics_doc(source_path("docs/metrics.md"));
  EXPECT_TRUE(doc.problems.empty()) << doc.problems.front();
  const auto exported = exposition_types(text);
  for (const auto& [name, type] : exported) {
    if (name.rfind("kdedup_", 0) != 0) continue;
    auto it = doc.types.find(name);
    if (it == doc.types.end()) {
      ADD_FAILURE() << name << " is exported by kdedup run but not in docs/metrics.md";
    } else {
      EXPECT_EQ(it->second, type) << name;
    }
  }
  for (const auto& [name, type] : doc.types) {
    EXPECT_TRUE(exported.count(name)) << name << " is documented but kdedup run does not export it";
  }

  // A real Prometheus scrapes the running service; every dashboard query and
  // alert expression evaluates.
  const int prom_port = free_port();
  write_file(dir.file("prometheus.yml"),
             "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
             "rule_files:\n  - " +
                 source_path("helm/kdedup/alerts/kdedup-rules.yaml") +
                 "\nscrape_configs:\n  - job_name: kdedup\n    static_configs:\n"
                 "      - targets: ['127.0.0.1:" +
                 std::to_string(metrics_port) +
                 "']\n        labels: {namespace: test, pod: kdedup-0}\n");
  std::filesystem::create_directories(dir.file("tsdb"));
  ChildOptions po;
  po.stderr_file = dir.file("prometheus.log");
  auto prom = ChildProcess::spawn(
      {kPrometheus, "--config.file=" + dir.file("prometheus.yml"),
       "--storage.tsdb.path=" + dir.file("tsdb"),
       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port), "--log.level=warn"},
      po);
  ASSERT_TRUE(prom) << prom.error().message;
  const auto scraped_by = std::chrono::steady_clock::now() + 30s;
  bool scraped = false;
  while (!scraped && std::chrono::steady_clock::now() < scraped_by) {
    auto r = query_prometheus(prom_port, "count_over_time(kdedup_build_info[1m]) >= 3");
    scraped = r.ok && !r.series.empty();
    if (!scraped) std::this_thread::sleep_for(250ms);
  }
  ASSERT_TRUE(scraped) << read_file(dir.file("prometheus.log"));
  EXPECT_EQ(query_prometheus(prom_port, "up{job=\"kdedup\"} == 1").series.size(), 1u);

  simdjson::dom::parser parser;
  simdjson::dom::element dash;
  const std::string json = read_file(source_path("helm/kdedup/dashboards/kdedup.json"));
  ASSERT_EQ(parser.parse(json).get(dash), simdjson::SUCCESS);
  simdjson::dom::array panels;
  ASSERT_FALSE(dash["panels"].get_array().get(panels));
  std::vector<PanelQuery> exprs;
  collect_panel_queries(panels, exprs);
  ASSERT_FALSE(exprs.empty());
  std::size_t with_data = 0;
  for (const auto& q : exprs) {
    auto r = query_prometheus(prom_port, substitute_grafana_variables(q.expr));
    EXPECT_TRUE(r.ok) << "dashboard query failed (panel '" << q.panel << "'): " << q.expr << "\n"
                      << r.error;
    with_data += !r.series.empty();
  }
  // Every panel has data from this run (consumer lag included, from the
  // statistics) but, allowing for scrape timing, one.
  EXPECT_GE(with_data + 1, exprs.size()) << with_data << " of " << exprs.size();

  const YAML::Node rules = YAML::LoadFile(source_path("helm/kdedup/alerts/kdedup-rules.yaml"));
  std::size_t alerts = 0;
  for (const auto& group : rules["groups"]) {
    for (const auto& rule : group["rules"]) {
      const std::string expr = rule["expr"].as<std::string>();
      auto r = query_prometheus(prom_port, expr);
      EXPECT_TRUE(r.ok) << "alert " << rule["alert"].as<std::string>("") << ": " << r.error;
      ++alerts;
    }
  }
  EXPECT_GT(alerts, 0u);
  std::printf("%zu of %zu dashboard queries returned data; %zu alert expressions evaluated\n",
              with_data, exprs.size(), alerts);

  (*prom)->stop();
  (*kdedup)->signal(SIGTERM);
  auto exit = (*kdedup)->wait(30s);
  EXPECT_EQ(exit, std::optional<int>(0)) << read_file(dir.file("kdedup.log"));
  EXPECT_NE(read_file(dir.file("kdedup.log")).find("serving /metrics"), std::string::npos);
}

}  // namespace
}  // namespace kdedup::testing
