// OffsetTracker: the commit position never passes an undelivered output.

#include "kdedup/pipeline/offset_tracker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

namespace kdedup::pipeline {
namespace {

TEST(OffsetTracker, NothingProcessedMeansNothingToCommit) {
  OffsetTracker t;
  EXPECT_FALSE(t.committable().has_value());
  EXPECT_EQ(t.in_flight(), 0u);
}

TEST(OffsetTracker, RecordsWithoutOutputsCommitImmediately) {
  OffsetTracker t;
  ASSERT_TRUE(t.add(10, 0));
  ASSERT_TRUE(t.add(11, 0));
  EXPECT_EQ(t.committable(), 12);
}

TEST(OffsetTracker, WaitsForDeliveryInOffsetOrder) {
  OffsetTracker t;
  std::vector<OffsetTracker::Processed> batch{{0, 1}, {1, 0}, {2, 1}, {3, 1}, {4, 0}};
  ASSERT_TRUE(t.add(batch));
  EXPECT_FALSE(t.committable().has_value());
  EXPECT_EQ(t.in_flight(), 3u);
  t.delivered(3);  // out of order: 0 and 2 still outstanding
  EXPECT_FALSE(t.committable().has_value());
  t.delivered(0);
  EXPECT_EQ(t.committable(), 2);  // 0 and 1 done, 2 outstanding
  t.delivered(2);
  EXPECT_EQ(t.committable(), 5);  // everything, including output-less 4
  EXPECT_EQ(t.in_flight(), 0u);
  EXPECT_EQ(t.pending_records(), 0u);
}

TEST(OffsetTracker, GapsInOffsetsAreFine) {
  OffsetTracker t;
  ASSERT_TRUE(t.add(5, 1));
  ASSERT_TRUE(t.add(9, 1));
  t.delivered(9);
  EXPECT_FALSE(t.committable().has_value());
  t.delivered(5);
  EXPECT_EQ(t.committable(), 10);
}

// Dense runs with gaps between them: a report finds its own record whether
// it sits where consecutive offsets put it or past a gap, and a report for
// an offset in a gap (or before the first entry) matches nothing.
TEST(OffsetTracker, FindsRecordsInDenseRunsAndPastGaps) {
  OffsetTracker t;
  ASSERT_TRUE(t.add(
      std::vector<OffsetTracker::Processed>{{10, 1}, {11, 1}, {12, 1}, {20, 1}, {21, 1}, {40, 1}}));
  t.delivered(15);  // in a gap: 15 - 10 = 5 places in holds offset 40
  t.delivered(9);   // before the first entry
  EXPECT_EQ(t.in_flight(), 6u);
  for (std::int64_t o : {40, 21, 11, 20, 12}) t.delivered(o);
  EXPECT_FALSE(t.committable().has_value());
  t.delivered(10);
  EXPECT_EQ(t.committable(), 41);
  EXPECT_EQ(t.in_flight(), 0u);
}

TEST(OffsetTracker, FailureNeverCommitsPastTheRecord) {
  OffsetTracker t;
  ASSERT_TRUE(t.add(std::vector<OffsetTracker::Processed>{{0, 1}, {1, 1}, {2, 1}}));
  t.delivered(0);
  t.failed(1, "output: message too large");
  t.delivered(2);
  EXPECT_EQ(t.committable(), 1);  // 0 is done; 1 failed; 2 must wait behind it
  ASSERT_TRUE(t.add(3, 0));
  EXPECT_EQ(t.committable(), 1);
  EXPECT_EQ(t.failure(), "output: message too large");
  t.failed(2, "second");
  EXPECT_EQ(t.failure(), "output: message too large");  // the first reason is kept
}

TEST(OffsetTracker, RejectsOffsetsGoingBackwards) {
  OffsetTracker t;
  ASSERT_TRUE(t.add(7, 1));
  EXPECT_FALSE(t.add(7, 0));
  EXPECT_FALSE(t.add(std::vector<OffsetTracker::Processed>{{8, 0}, {6, 0}}));
  t.delivered(7);
  EXPECT_EQ(t.committable(), 8);  // the rejected batch registered nothing
}

TEST(OffsetTracker, UnknownDeliveriesDoNotMoveThePosition) {
  OffsetTracker t;
  ASSERT_TRUE(t.add(1, 1));
  t.delivered(42);
  t.delivered(1);
  t.delivered(1);  // a duplicate report must not underflow
  EXPECT_EQ(t.committable(), 2);
  EXPECT_EQ(t.in_flight(), 0u);
}

// Random delivery order from another thread: the position is always a prefix
// of fully delivered records and ends one past the last record.
TEST(OffsetTracker, ConcurrentShuffledDeliveries) {
  OffsetTracker t;
  constexpr int kRecords = 20000;
  std::vector<std::int64_t> with_output;
  std::vector<OffsetTracker::Processed> batch;
  std::mt19937 rng(7);
  for (int i = 0; i < kRecords; ++i) {
    std::uint32_t n = rng() % 3 == 0 ? 0 : 1;
    batch.push_back({i * 2, n});  // even offsets only: gaps everywhere
    if (n) with_output.push_back(i * 2);
  }
  std::shuffle(with_output.begin(), with_output.end(), rng);
  ASSERT_TRUE(t.add(batch));
  std::thread deliverer([&] {
    for (auto o : with_output) t.delivered(o);
  });
  for (int i = 0; i < 1000; ++i) {
    auto c = t.committable();
    if (c) {
      EXPECT_EQ(*c % 2, 1);  // always one past a registered (even) offset
    }
  }
  deliverer.join();
  EXPECT_EQ(t.committable(), (kRecords - 1) * 2 + 1);
  EXPECT_EQ(t.in_flight(), 0u);
}

}  // namespace
}  // namespace kdedup::pipeline
