// A snapshot behind the input's retention: the snapshot's offset S is below
// the partition's low watermark L (the test broker keeps ~5 MiB per
// partition, so 7 MiB of input after the snapshot pushes L past S), while
// the committed offset C is at the end. Replaying from S is impossible (the
// records in [S, L) are gone): the snapshot is refused, counted, and the
// partition rebuilt from what is still stored; records after the crash are
// judged against it.

#include <gtest/gtest.h>

#include <iostream>
#include <set>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

TEST(RecoveryE2E, SnapshotBehindTheInputRetentionIsRefused) {
  const auto t0 = std::chrono::steady_clock::now();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "retention-group";
  s.state_dir = dir.file("state");
  s.snapshot_interval = "500ms";
  Instance first("phase1", dir, b.bootstrap(), s);
  auto batch = run_batch(
      b, first, {.partitions = 1, .domain = 100, .per_second = 2000, .seed = 51, .limit = 300});
  ASSERT_TRUE(batch) << batch.error().message;
  auto in = b.read_topic("in");
  ASSERT_TRUE(in && !in->empty());
  const std::string repeated = *in->front().key;

  // Phase 2: no periodic snapshot; 7 MiB of repeats of one delivered key
  // (all duplicates: the output stays small), then SIGKILL (no final
  // snapshot): S = 300 stays, C moves to the end, L moves past S.
  RunSettings quiet = s;
  quiet.snapshot_interval = "1h";
  quiet.snapshot_records = 100'000'000;
  Instance second("phase2", dir, b.bootstrap(), quiet);
  ASSERT_TRUE(second.start());
  ASSERT_TRUE(second.wait_ready(60s)) << second.log_tail();
  const std::string padding(10 * 1024, 'p');
  for (int chunk = 0; chunk < 7; ++chunk) {
    std::vector<TestRecord> bulk;
    for (int i = 0; i < 100; ++i) {
      bulk.push_back(
          {.key = repeated, .value = padding + std::to_string(chunk * 100 + i), .partition = 0});
    }
    ASSERT_TRUE(b.produce("in", bulk));
  }
  ASSERT_TRUE(wait_committed_to_end(b, "retention-group", "in", 60s)) << second.log_tail();
  second.kill9();
  auto marks = b.watermarks("in");
  ASSERT_TRUE(marks);
  const std::int64_t low = (*marks)[0].low, bulk_end = (*marks)[0].high;
  auto inspected = inspect_snapshots(s.state_dir, false);
  ASSERT_EQ(inspected.snapshots.size(), 1u) << inspected.text;
  const std::int64_t snapshot_at = inspected.snapshots[0].next_offset;
  std::cout << "snapshot at " << snapshot_at << ", input low watermark " << low
            << ", committed/high " << bulk_end << std::endl;
  ASSERT_LT(snapshot_at, low) << "the broker did not drop the records after the snapshot; "
                                 "the refusal cannot be tested";

  // Phase 3: the restart must not use the snapshot.
  Instance third("phase3", dir, b.bootstrap(), s);
  ASSERT_TRUE(third.start());
  ASSERT_TRUE(third.wait_ready(60s)) << third.log_tail();
  std::vector<TestRecord> tail;
  for (int i = 0; i < 5; ++i) tail.push_back({.key = repeated, .value = "again", .partition = 0});
  for (int i = 0; i < 100; ++i) {
    tail.push_back({.key = "fresh-" + std::to_string(i % 50), .value = "f", .partition = 0});
  }
  ASSERT_TRUE(b.produce("in", tail));
  ASSERT_TRUE(wait_committed_to_end(b, "retention-group", "in", 60s)) << third.log_tail();
  const double restores = third.metric("kdedup_restores_total").value_or(-1);
  const double rebuilds = third.metric("kdedup_rebuilds_total").value_or(-1);
  const double replayed = third.metric("kdedup_rebuild_replayed_records_total").value_or(-1);
  std::cout << "restart: restores " << restores << ", rebuilds " << rebuilds << ", replayed "
            << replayed << std::endl;
  EXPECT_EQ(restores, 0) << third.log_tail();
  EXPECT_EQ(rebuilds, 1) << third.log_tail();
  {
    auto refusal = line_with_all(third.log(), {"snapshot", "retention"});
    EXPECT_TRUE(refusal) << "no line saying the snapshot was refused (retention)\n"
                         << third.log_tail();
    std::cout << "refusal: " << refusal.value_or("(none)") << std::endl;
  }
  EXPECT_EQ(third.stop(), 0) << third.log_tail();

  // Exactly the first occurrence of each fresh key was emitted after the
  // bulk; the repeats of the delivered key were not (its delivery, whose
  // input record retention deleted, is learned from the output record
  // itself), and nothing of the bulk was.
  std::set<std::int64_t> want, got;
  for (int i = 0; i < 50; ++i) want.insert(bulk_end + 5 + i);
  auto out = b.read_topic("out");
  ASSERT_TRUE(out);
  for (const auto& r : *out) {
    const auto source = std::stoll(r.header("kdedup-source-offset").value_or("-1"));
    EXPECT_TRUE(source < snapshot_at || source >= bulk_end) << "bulk duplicate emitted: " << source;
    if (source >= bulk_end) {
      EXPECT_TRUE(got.insert(source).second) << source << " twice";
    }
  }
  EXPECT_EQ(got, want);
  std::cout << "after the restart: " << got.size() << " of " << want.size()
            << " expected records emitted, none of the repeats; took " << seconds_since(t0) << " s"
            << std::endl;
}

}  // namespace
}  // namespace kdedup::testing
