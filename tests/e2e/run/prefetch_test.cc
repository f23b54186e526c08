// The consumer's prefetch through `kdedup run`: kdedup's default for
// librdkafka's queued.min.messages reaches the client, a config that names
// it wins, and a backlog many times the bound is read through the stops and
// restarts of fetching it causes without losing or repeating a record.
// librdkafka's fetch debug lines print the bound in force
// ("(N/BOUND msgs, ...)") and say when it stopped a partition's fetching.

#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "broker.h"
#include "kdedup/config/config.h"
#include "process.h"
#include "run_until_output.h"

namespace kdedup::testing {
namespace {

/// Runs kdedup on `in` with librdkafka's fetch debug lines until `out`
/// holds `expected_out` records (or 60 s), then stops it; returns its log.
std::string run_until(TestBroker& b, const TempDir& dir, const std::string& name,
                      const std::string& consumer_extra, std::size_t expected_out) {
  write_file(dir.file(name + ".yaml"),
             "group_id: prefetch-" + name +
                 "\n"
                 "input:\n  topics: [in]\n"
                 "output:\n  topic: out\n"
                 "identity:\n  salt: prefetch-test-salt\n"
                 "window: 1h\n"
                 "filter:\n  type: exact\n"
                 "dlq_topic: dlq\n"
                 "commit_interval: 200ms\n"
                 "log_level: debug\n"
                 "kafka:\n  bootstrap.servers: \"" +
                 b.bootstrap() +
                 "\"\n"
                 "consumer:\n  session.timeout.ms: \"6000\"\n  heartbeat.interval.ms: \"500\"\n"
                 "  debug: fetch\n" +
                 consumer_extra +
                 "metrics:\n  address: \"\"\n"
                 "state:\n  dir: \"\"\n");
  return run_until_output(b, dir.file(name + ".yaml"), dir.file(name + ".log"), expected_out, {},
                          std::chrono::seconds(60));
}

TEST(RunE2E, PrefetchDefaultReachesTheConsumer) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  ASSERT_TRUE(b.produce("in", {{"k1", "v1", 0, {}, 0}, {"k2", "v2", 0, {}, 1}}));
  TempDir dir;
  const std::string log = run_until(b, dir, "default", "", 2);
  const std::string bound = "/" + std::to_string(config::kDefaultPrefetchRecords) + " msgs";
  EXPECT_NE(log.find(bound), std::string::npos) << "no fetch line with '" << bound << "':\n"
                                                << log.substr(0, 4000);
  EXPECT_EQ(log.find("/100000 msgs"), std::string::npos) << "librdkafka's own default in force";
  // Each of the two workers reads its partitions from a queue of its own:
  // the byte bound, librdkafka's 64 MiB, is shared out between them.
  EXPECT_NE(log.find("/32768 kb"), std::string::npos) << log.substr(0, 4000);
  EXPECT_EQ(log.find("/65536 kb"), std::string::npos) << log.substr(0, 4000);
}

TEST(RunE2E, ABacklogPastTheSmallestPrefetchIsReadWhole) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:16", "out:16", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  // 20,000 records over 16 partitions waiting before the instance starts:
  // 16,000 identities, each 4th one sent twice. The prefetch bound is
  // librdkafka's smallest, 1 record across all partitions: every fetch
  // passes it.
  std::vector<TestRecord> records;
  for (int i = 0; i < 16'000; ++i) {
    const std::string key = "id-" + std::to_string(i);
    records.push_back({key, "v", 0, {}, i % 16});
    if (i % 4 == 0) records.push_back({key, "again", 0, {}, i % 16});
  }
  ASSERT_EQ(records.size(), 20'000U);
  ASSERT_TRUE(b.produce("in", records));
  TempDir dir;
  const std::string log = run_until(b, dir, "small", "  queued.min.messages: \"1\"\n", 16'000);
  EXPECT_NE(log.find("/1 msgs"), std::string::npos) << log.substr(0, 4000);
  // The bound was reached, so fetching stopped and started again.
  EXPECT_NE(log.find("queued.min.messages exceeded"), std::string::npos) << log.substr(0, 4000);

  auto out = b.read_topic("out");
  ASSERT_TRUE(out) << out.error().message;
  std::map<std::string, int> seen;
  for (const auto& r : *out) ++seen[r.key.value_or("")];
  EXPECT_EQ(seen.size(), 16'000U);
  for (const auto& [key, n] : seen) ASSERT_EQ(n, 1) << key << " emitted " << n << " times";
  EXPECT_EQ(out->size(), 16'000U);
  auto committed = b.committed("prefetch-small", "in");
  ASSERT_TRUE(committed) << committed.error().message;
  ASSERT_EQ(committed->size(), 16U);
  std::int64_t total = 0;
  for (const std::int64_t c : *committed) total += c;
  EXPECT_EQ(total, 20'000);
}

}  // namespace
}  // namespace kdedup::testing
