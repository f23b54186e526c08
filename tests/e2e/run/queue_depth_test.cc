// kdedup_queue_depth through `kdedup run`: each worker reads its
// partitions' records from a librdkafka queue of its own, so the records
// fetched and not yet processed are counted from librdkafka's statistics
// (next_offset minus app_offset). While an instance works through a backlog
// the gauge shows what waits; once everything was processed it is 0 for
// every assigned partition, and nothing was lost or emitted twice.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <map>
#include <thread>

#include "broker.h"
#include "http_get.h"
#include "kdedup/testbroker/child_process.h"
#include "metrics_doc.h"
#include "process.h"
#include "prometheus_query.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

TEST(RunE2E, QueueDepthCountsTheBacklogFetchedAndNotYetProcessed) {
  constexpr int kPartitions = 4;
  constexpr int kRecords = 20'000;
  auto broker = TestBroker::start(
      {.brokers = 1, .topics = {"in:" + std::to_string(kPartitions), "out:4", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  // The backlog waits before the instance starts: distinct keys, spread
  // over the partitions. The instance reads it for seconds (its producer
  // holds at most 200 records, each batch lingers 20 ms), so the metrics
  // bridge's one-second rounds see it under way.
  std::vector<TestRecord> records;
  records.reserve(kRecords);
  for (int i = 0; i < kRecords; ++i) {
    records.push_back({"id-" + std::to_string(i), "v", 0, {}, i % kPartitions});
  }
  ASSERT_TRUE(b.produce("in", records));

  TempDir dir;
  const int port = free_port();
  write_file(dir.file("kdedup.yaml"),
             "group_id: queue-depth\n"
             "input:\n  topics: [in]\n"
             "output:\n  topic: out\n"
             "identity:\n  salt: queue-depth-salt\n"
             "window: 1h\n"
             "filter:\n  type: exact\n"
             "threads: 1\n"
             "dlq_topic: dlq\n"
             "commit_interval: 200ms\n"
             "kafka:\n  bootstrap.servers: \"" +
                 b.bootstrap() +
                 "\"\n  statistics.interval.ms: \"100\"\n"
                 "consumer:\n  session.timeout.ms: \"6000\"\n  heartbeat.interval.ms: \"500\"\n"
                 "producer:\n  queue.buffering.max.messages: \"200\"\n  linger.ms: \"20\"\n"
                 "metrics:\n  address: \"127.0.0.1:" +
                 std::to_string(port) + "\"\n" + "state:\n  dir: \"\"\n");
  testbroker::ChildOptions o;
  o.stderr_file = dir.file("kdedup.log");
  auto kdedup = testbroker::ChildProcess::spawn(
      {KDEDUP_BINARY, "run", "--config", dir.file("kdedup.yaml")}, o);
  ASSERT_TRUE(kdedup) << kdedup.error().message;

  // Scrape while the backlog is read: the most the gauge showed, and the
  // last scrape once every record was processed and its statistics came.
  double most = 0;
  std::string text;
  bool drained = false;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    ASSERT_FALSE((*kdedup)->poll_exit()) << read_file(dir.file("kdedup.log"));
    auto r = http_get(port, "/metrics");
    if (r.status == 200) {
      text = r.body;
      const double depth = exposition_sum(text, "kdedup_queue_depth", {}).value_or(0.0);
      most = std::max(most, depth);
      const double in = exposition_sum(text, "kdedup_records_in_total", {}).value_or(0.0);
      if (in >= kRecords && depth == 0 &&
          exposition_sum(text, "kdedup_consumer_lag", {}).value_or(-1.0) == 0) {
        drained = true;
        break;
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(drained) << "records in, queue depth, lag never settled:\n"
                       << text.substr(0, 2000) << read_file(dir.file("kdedup.log"));
  EXPECT_GT(most, 0) << "the backlog never showed in kdedup_queue_depth"
                     << read_file(dir.file("kdedup.log"));
  EXPECT_LE(most, kRecords);
  EXPECT_EQ(exposition_series(text, "kdedup_queue_depth"), static_cast<std::size_t>(kPartitions));

  (*kdedup)->signal(SIGTERM);
  EXPECT_EQ((*kdedup)->wait(30s), 0) << read_file(dir.file("kdedup.log"));
  auto out = b.read_topic("out");
  ASSERT_TRUE(out) << out.error().message;
  std::map<std::string, int> seen;
  for (const auto& r : *out) ++seen[r.key.value_or("")];
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kRecords));
  EXPECT_EQ(out->size(), static_cast<std::size_t>(kRecords));
}

}  // namespace
}  // namespace kdedup::testing
