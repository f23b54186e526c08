// Output reconciliation against the test broker: records with provenance
// headers produced by librdkafka (and kcat, an independent client), then the
// highest source offset per input partition found from the output tail.

#include "kdedup/pipeline/reconcile.h"

#include <gtest/gtest.h>

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

  auto report = read_output_tail(options_, "out", {0});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 7u);
  EXPECT_EQ(report->highest({"in", 0}), 5);
  EXPECT_EQ(report->highest({"other", 0}), 99);
  EXPECT_FALSE(report->highest({"in", 1})) << "partition 1 was not read";

  // partitioning: key -> every output partition.
  auto count = output_partition_count(options_, "out");
  ASSERT_TRUE(count) << count.error().message;
  ASSERT_EQ(*count, 3);
  report = read_output_tail(options_, "out",
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
  auto report = read_output_tail(options_, "out", {0});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->records_read, 10u);
  // The tail holds source offsets 960..951; the maximum of the whole
  // partition (1000) is older than the tail and deliberately not seen.
  EXPECT_EQ(report->highest({"in", 0}), 960);
}

TEST_F(ReconcileTest, EmptyTopicFindsNothing) {
  auto report = read_output_tail(options_, "empty", {0, 1});
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

  auto report = read_output_tail(options_, "out", {2});
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
  auto report = read_output_tail(options_, "out", {3});
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
  auto report = read_output_tail(options_, "out", {0});
  ASSERT_FALSE(report);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
  EXPECT_NE(report.error().message.find("output reconciliation"), std::string::npos)
      << report.error().message;
  ASSERT_TRUE(broker_->control("broker 1 up"));
  options_.timeout = 15s;
  report = read_output_tail(options_, "out", {0});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->highest({"in", 0}), 1);
}

}  // namespace
}  // namespace kdedup::pipeline
