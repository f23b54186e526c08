// Output reconciliation against the test broker: records with provenance
// headers produced by librdkafka (and kcat, an independent client), then the
// highest source offset per input partition found from the output tail.

#include "kdedup/pipeline/reconcile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "broker.h"

namespace kdedup::pipeline {
namespace {

using namespace std::chrono_literals;
using testing::TestBroker;
using testing::TestRecord;

TestRecord emitted(std::string topic, std::int32_t src_partition, std::int64_t src_offset,
                   std::int32_t out_partition) {
  TestRecord r;
  r.key = "k" + std::to_string(src_offset);
  r.value = "v";
  r.partition = out_partition;
  r.headers = {{"kdedup-source-topic", std::move(topic)},
               {"kdedup-source-partition", std::to_string(src_partition)},
               {"kdedup-source-offset", std::to_string(src_offset)}};
  return r;
}

class ReconcileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = TestBroker::start({.brokers = 1, .topics = {"out:3", "empty:2"}});
    ASSERT_TRUE(b) << b.error().message;
    broker_ = std::move(*b);
    options_.properties = {{"bootstrap.servers", broker_->bootstrap()}};
    options_.timeout = 15s;
  }
  std::unique_ptr<TestBroker> broker_;
  ReconcileOptions options_;
};

TEST_F(ReconcileTest, FindsHighestSourceOffsetPerInputPartition) {
  std::vector<TestRecord> records;
  // input partition p writes output partition p (partitioning: input), out of
  // order inside a partition as retries may leave them.
  for (std::int64_t o : {0, 1, 2, 5, 4, 3}) records.push_back(emitted("in", 0, o, 0));
  for (std::int64_t o : {10, 11, 12}) records.push_back(emitted("in", 1, o, 1));
  records.push_back(emitted("other", 0, 99, 0));  // another input topic, same partition
  ASSERT_TRUE(broker_->produce("out", records));

  auto report = read_output(options_, "out", {0});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 7u);
  EXPECT_EQ(report->highest({"in", 0}), 5);
  EXPECT_EQ(report->highest({"other", 0}), 99);
  EXPECT_FALSE(report->highest({"in", 1})) << "partition 1 was not read";

  // partitioning: key -> every output partition.
  auto count = output_partition_count(options_, "out");
  ASSERT_TRUE(count) << count.error().message;
  ASSERT_EQ(*count, 3);
  report = read_output(options_, "out",
                       output_partitions_to_read(config::Partitioning::kKey, 1, *count));
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 10u);
  EXPECT_EQ(report->highest({"in", 1}), 12);
  EXPECT_EQ(report->highest({"in", 0}), 5);
}

TEST_F(ReconcileTest, ReadsOnlyTheTail) {
  std::vector<TestRecord> records;
  for (std::int64_t o = 0; o < 50; ++o) records.push_back(emitted("in", 0, 1000 - o, 0));
  ASSERT_TRUE(broker_->produce("out", records));
  options_.tail_records = 10;
  auto report = read_output(options_, "out", {0});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 10u);
  // The tail holds source offsets 960..951; the maximum of the whole
  // partition (1000) is older than the tail and deliberately not seen.
  EXPECT_EQ(report->highest({"in", 0}), 960);
}

// A rebuild needs every delivery since its window start: the output is read
// back to the first record at or after a timestamp (the test broker cannot
// look offsets up by time: bisection), beyond the tail; offsets of other
// input partitions are not kept.
TEST_F(ReconcileTest, ReadsBackToATimeAndKeepsOnlyTheWantedSources) {
  constexpr std::int64_t kT0 = 1'700'000'000'000;
  std::vector<TestRecord> records;
  for (std::int64_t o = 0; o < 300; ++o) {
    TestRecord r = emitted("in", o % 3 == 0 ? 1 : 0, o, 0);
    r.timestamp_ms = kT0 + o * 10;
    records.push_back(r);
  }
  ASSERT_TRUE(broker_->produce("out", records));
  options_.tail_records = 10;
  // C = 150: the read holds a record below it, so nothing more is needed.
  auto report = read_output(options_, "out", {0}, {{0, kT0 + 1'000}},
                            {{PartitionId{"in", 0}, Coverage{.from_offset = 150}}});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 200u) << "from the record at t0 + 1 s on";
  const auto offsets = report->emitted({"in", 0});
  ASSERT_FALSE(offsets.empty());
  EXPECT_EQ(offsets.front(), 100);
  EXPECT_EQ(offsets.back(), 299);
  EXPECT_FALSE(report->highest({"in", 1})) << "not a wanted source";

  // A time after the newest record: only the tail.
  report = read_output(options_, "out", {0}, {{0, kT0 + 10'000}});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 10u);
  // A time before the oldest: everything.
  report = read_output(options_, "out", {0}, {{0, kT0 - 5}});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 300u);
}

// Commits stalled (the group kept rebalancing) while a source emitted far
// more than the tail holds: everything its tail shows lies past C, so the
// read goes back to the time bound (or the partition's start) to find every
// offset emitted since C.
TEST_F(ReconcileTest, ExtendsBackWhenTheUncommittedOutputOutgrewTheTail) {
  constexpr std::int64_t kT0 = 1'700'000'000'000;
  std::vector<TestRecord> records;
  for (std::int64_t o = 0; o < 300; ++o) {
    TestRecord r = emitted("in", 0, o, 0);
    r.timestamp_ms = kT0 + o * 10;
    records.push_back(r);
  }
  ASSERT_TRUE(broker_->produce("out", records));
  options_.tail_records = 10;
  auto report =
      read_output(options_, "out", {0}, {},
                  {{PartitionId{"in", 0}, Coverage{.from_offset = 200, .since_ms = kT0 + 1'000}}});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 200u) << "the tail, then back to t0 + 1 s";
  EXPECT_EQ(report->extended, 1u);
  EXPECT_EQ(report->emitted({"in", 0}).front(), 100);
  EXPECT_EQ(report->emitted({"in", 0}).size(), 200u);

  // Unknown time bound: back to the partition's start.
  report =
      read_output(options_, "out", {0}, {}, {{PartitionId{"in", 0}, Coverage{.from_offset = 200}}});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 300u);

  // The tail reaches below C: the tail is enough.
  report = read_output(options_, "out", {0}, {},
                       {{PartitionId{"in", 0}, Coverage{.from_offset = 295, .since_ms = kT0}}});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 10u);
  EXPECT_EQ(report->extended, 0u);
}

TEST_F(ReconcileTest, EmptyTopicFindsNothing) {
  auto report = read_output(options_, "empty", {0, 1});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 0u);
  EXPECT_TRUE(report->highest_by_source.empty());
}

TEST_F(ReconcileTest, SkipsRecordsWithoutHeadersAndCountsMalformed) {
  std::vector<TestRecord> records;
  records.push_back(emitted("in", 2, 7, 2));
  TestRecord plain;  // not written by kdedup
  plain.key = "x";
  plain.value = "y";
  plain.partition = 2;
  records.push_back(plain);
  TestRecord bad = emitted("in", 2, 0, 2);
  bad.headers[2].value = "12abc";  // malformed offset
  records.push_back(bad);
  TestRecord partial = emitted("in", 2, 0, 2);
  partial.headers.pop_back();  // offset header missing
  records.push_back(partial);
  ASSERT_TRUE(broker_->produce("out", records));
  // kcat, an independent client: a header with a negative offset.
  auto kcat = broker_->kcat_produce("out", {"k\tv"}, '\t',
                                    {"-p", "2", "-H", "kdedup-source-topic=in", "-H",
                                     "kdedup-source-partition=2", "-H", "kdedup-source-offset=-3"});
  ASSERT_EQ(kcat.exit_code, 0) << kcat.err;
  // and a valid one, the highest.
  kcat = broker_->kcat_produce("out", {"k\tv"}, '\t',
                               {"-p", "2", "-H", "kdedup-source-topic=in", "-H",
                                "kdedup-source-partition=2", "-H", "kdedup-source-offset=8"});
  ASSERT_EQ(kcat.exit_code, 0) << kcat.err;

  auto report = read_output(options_, "out", {2});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 6u);
  EXPECT_EQ(report->without_provenance, 1u);
  EXPECT_EQ(report->malformed, 3u);
  ASSERT_EQ(report->malformed_examples.size(), 3u);
  EXPECT_NE(report->malformed_examples[0].find("12abc"), std::string::npos)
      << report->malformed_examples[0];
  EXPECT_NE(report->malformed_examples[0].find("offset 2"), std::string::npos)
      << "names the output position: " << report->malformed_examples[0];
  EXPECT_EQ(report->highest({"in", 2}), 8);
}

TEST_F(ReconcileTest, MissingPartitionIsAnError) {
  options_.timeout = 3s;
  auto report = read_output(options_, "out", {3});
  ASSERT_FALSE(report);
  EXPECT_NE(report.error().message.find("partition 3 does not exist"), std::string::npos)
      << report.error().message;
  // A missing topic is reported the same way by a real cluster; the mock
  // cluster creates any topic a metadata request names, so only the
  // partition check can be exercised here.
}

TEST_F(ReconcileTest, UnreachableBrokerTimesOut) {
  ASSERT_TRUE(broker_->produce("out", {emitted("in", 0, 1, 0)}));
  ASSERT_TRUE(broker_->control("broker 1 down"));
  options_.timeout = 2s;
  const auto started = std::chrono::steady_clock::now();
  auto report = read_output(options_, "out", {0});
  ASSERT_FALSE(report);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
  EXPECT_NE(report.error().message.find("output reconciliation"), std::string::npos)
      << report.error().message;
  ASSERT_TRUE(broker_->control("broker 1 up"));
  options_.timeout = 15s;
  report = read_output(options_, "out", {0});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->highest({"in", 0}), 1);
}

// The timeout bounds a stall, not the whole read: 20 record batches
// through small fetches at 250 ms round trips take about 5 s, longer than a
// 2 s timeout, and are read whole. (The timeout leaves room for one slow
// fetch round on a loaded machine or a sanitizer build: 1 s stalled once.)
TEST_F(ReconcileTest, ASlowReadLongerThanTheTimeoutFinishesWhileRecordsArrive) {
  constexpr std::int64_t kBatches = 20, kPerBatch = 250;
  for (std::int64_t batch = 0; batch < kBatches; ++batch) {
    std::vector<TestRecord> records;
    for (std::int64_t o = batch * kPerBatch; o < (batch + 1) * kPerBatch; ++o) {
      records.push_back(emitted("in", 0, o, 0));
    }
    ASSERT_TRUE(broker_->produce("out", records));  // one record batch each
  }
  ASSERT_TRUE(broker_->control("rtt 1 250"));
  options_.properties["max.partition.fetch.bytes"] = "2048";
  options_.timeout = 2s;
  const auto started = std::chrono::steady_clock::now();
  auto report = read_output(options_, "out", {0});
  const auto took = std::chrono::steady_clock::now() - started;
  ASSERT_TRUE(broker_->control("rtt 1 0"));
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, static_cast<std::uint64_t>(kBatches * kPerBatch));
  EXPECT_EQ(report->highest({"in", 0}), kBatches * kPerBatch - 1);
  EXPECT_GT(took, options_.timeout)
      << "the read must outlast the timeout for this test to mean anything";
}

// The test broker answers no offsets-for-times query, so the window start
// is searched by reading records: every target time (before the first
// record, inside a produce batch, on a run of equal timestamps, between two
// records, at a batch's edges, at the committed record itself) must give the
// first offset whose timestamp reaches it, as a scan of the partition does.
TEST_F(ReconcileTest, FindsTheFirstOffsetAtOrAfterATimeWithoutATimeIndex) {
  ASSERT_TRUE(broker_->create_topic("in", 1));
  std::vector<std::int64_t> stamps;
  for (const std::int64_t batch : {100, 57, 1, 300}) {  // one record batch each
    std::vector<TestRecord> records;
    for (std::int64_t i = 0; i < batch; ++i) {
      TestRecord r;
      r.key = "k";
      r.value = "v";
      r.partition = 0;
      // Non-decreasing, in runs of three equal timestamps.
      r.timestamp_ms = 1'000'000 + static_cast<std::int64_t>(stamps.size()) / 3 * 10;
      stamps.push_back(r.timestamp_ms);
      records.push_back(std::move(r));
    }
    ASSERT_TRUE(broker_->produce("in", records));
  }
  const auto committed = static_cast<std::int64_t>(stamps.size());  // C: every record processed
  const std::int64_t newest = stamps.back();
  const PartitionId id{"in", 0};
  std::vector<std::int64_t> targets = {stamps.front() - 1000, stamps.front(), newest};
  for (const std::int64_t o : {1, 2, 3, 50, 99, 100, 101, 156, 157, 158, 300, 456}) {
    targets.push_back(stamps[static_cast<std::size_t>(o)]);      // on a record's time
    targets.push_back(stamps[static_cast<std::size_t>(o)] - 5);  // between two records
  }
  for (const std::int64_t target : targets) {
    const auto expected = static_cast<std::int64_t>(
        std::lower_bound(stamps.begin(), stamps.end(), target) - stamps.begin());
    auto points = find_commit_points(options_, {{id, committed}}, {id}, newest - target);
    ASSERT_TRUE(points) << points.error().message;
    ASSERT_EQ(points->count(id), 1u);
    EXPECT_EQ(points->at(id).timestamp_ms, newest);
    ASSERT_TRUE(points->at(id).window_offset) << "target " << target;
    EXPECT_EQ(*points->at(id).window_offset, expected) << "target " << target;
  }
}

// A search round keeps at most a few thousand records of what its fetch
// brought (a large partition is not read whole into memory): past that it
// narrows by bisection, and still finds the first offset at or after each
// time in a partition of one 20,000-record batch.
TEST_F(ReconcileTest, FindsTheFirstOffsetAtOrAfterATimeInAPartitionLargerThanARound) {
  ASSERT_TRUE(broker_->create_topic("big", 1));
  std::vector<TestRecord> records;
  for (std::int64_t o = 0; o < 20'000; ++o) {
    TestRecord r;
    r.key = "k";
    r.value = "v";
    r.partition = 0;
    r.timestamp_ms = 2'000'000 + o * 2;
    records.push_back(std::move(r));
  }
  ASSERT_TRUE(broker_->produce("big", records));
  const std::int64_t newest = 2'000'000 + 19'999 * 2;
  const PartitionId id{"big", 0};
  for (const std::int64_t o : {0, 1, 4095, 4096, 4097, 10'000, 15'001, 19'998, 19'999}) {
    for (const std::int64_t early : {0, 1}) {  // on a record's time, and just before it
      const std::int64_t target = 2'000'000 + o * 2 - early;
      auto points = find_commit_points(options_, {{id, 20'000}}, {id}, newest - target);
      ASSERT_TRUE(points) << points.error().message;
      ASSERT_TRUE(points->at(id).window_offset) << "target " << target;
      EXPECT_EQ(*points->at(id).window_offset, o) << "target " << target;
    }
  }
}

}  // namespace
}  // namespace kdedup::pipeline
