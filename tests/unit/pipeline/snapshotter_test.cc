// Snapshotter: captures wait for a commit that covers them, one waiting and
// one in flight per partition, a newer capture replaces a waiting one, a
// dropped or reset partition's capture is never written, and a write result
// reaches the callback. The store is replaced by a recording submit
// function (no RocksDB here).

#include "kdedup/pipeline/snapshotter.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace kdedup::pipeline {
namespace {

struct Submitted {
  state::SnapshotCapture capture;
  Snapshotter::Done done;
};

state::SnapshotCapture capture_at(std::int32_t partition, std::int64_t next_offset) {
  state::SnapshotCapture c;
  c.key = state::PartitionKey{"in", partition};
  c.next_offset = next_offset;
  c.state = "state@" + std::to_string(next_offset);
  return c;
}

class SnapshotterTest : public ::testing::Test {
 protected:
  std::mutex mu;
  std::vector<Submitted> submitted;
  std::vector<std::pair<PartitionId, bool>> written;
  Snapshotter snapshotter{[this](state::SnapshotCapture c, Snapshotter::Done done) {
                            std::lock_guard lock(mu);
                            submitted.push_back({std::move(c), std::move(done)});
                          },
                          [this](const PartitionId& id, const Result<state::WriteReport>& r) {
                            std::lock_guard lock(mu);
                            written.emplace_back(id, static_cast<bool>(r));
                          }};
  const PartitionId p0{"in", 0};
  const PartitionId p1{"in", 1};

  void finish(std::size_t i, bool ok = true) {
    Snapshotter::Done done = submitted.at(i).done;
    if (ok) {
      done(state::WriteReport{});
    } else {
      done(fail("disk full"));
    }
  }
};

TEST_F(SnapshotterTest, WaitsForACommitThatCoversTheCapture) {
  snapshotter.reset(p0, 100);
  snapshotter.offer(capture_at(0, 150));
  EXPECT_TRUE(submitted.empty()) << "150 is ahead of the committed 100";
  EXPECT_TRUE(snapshotter.busy(p0));
  EXPECT_FALSE(snapshotter.busy(p1));
  snapshotter.committed(p0, 149);
  EXPECT_TRUE(submitted.empty());
  snapshotter.committed(p0, 150);
  ASSERT_EQ(submitted.size(), 1u);
  EXPECT_EQ(submitted[0].capture.next_offset, 150);
  EXPECT_TRUE(snapshotter.busy(p0)) << "in flight";
  finish(0);
  EXPECT_FALSE(snapshotter.busy(p0));
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].first, p0);
  EXPECT_TRUE(written[0].second);
  EXPECT_TRUE(snapshotter.wait_idle(std::chrono::milliseconds(0)));
  EXPECT_EQ(snapshotter.counts().written, 1u);
}

TEST_F(SnapshotterTest, CaptureAtOrBelowTheCommitGoesAtOnce) {
  snapshotter.reset(p0, 100);
  snapshotter.offer(capture_at(0, 100));
  ASSERT_EQ(submitted.size(), 1u);
  snapshotter.reset(p1, std::nullopt);  // never committed: nothing may be written
  snapshotter.offer(capture_at(1, 1));
  EXPECT_EQ(submitted.size(), 1u);
}

TEST_F(SnapshotterTest, OneInFlightPerPartitionAndANewerCaptureReplacesTheWaitingOne) {
  snapshotter.reset(p0, 10);
  snapshotter.offer(capture_at(0, 10));
  ASSERT_EQ(submitted.size(), 1u);
  // While it is written, two more captures arrive: only the newest waits.
  snapshotter.committed(p0, 30);
  snapshotter.offer(capture_at(0, 20));
  snapshotter.offer(capture_at(0, 30));
  EXPECT_EQ(submitted.size(), 1u);
  EXPECT_EQ(snapshotter.counts().replaced, 1u);
  EXPECT_FALSE(snapshotter.wait_idle(std::chrono::milliseconds(1)));
  finish(0);  // the write done: the waiting one goes next
  ASSERT_EQ(submitted.size(), 2u);
  EXPECT_EQ(submitted[1].capture.next_offset, 30);
  EXPECT_EQ(submitted[1].capture.state, "state@30");
  finish(1);
  EXPECT_TRUE(snapshotter.wait_idle(std::chrono::milliseconds(0)));
  EXPECT_EQ(snapshotter.counts().written, 2u);
}

TEST_F(SnapshotterTest, DroppedAndResetPartitionsNeverWriteTheirWaitingCapture) {
  snapshotter.reset(p0, 10);
  snapshotter.offer(capture_at(0, 50));
  snapshotter.drop(p0);  // lost: its final commit will not come from us
  snapshotter.committed(p0, 60);
  EXPECT_TRUE(submitted.empty());
  EXPECT_EQ(snapshotter.counts().dropped, 1u);

  // Re-assigned with a lower committed offset (offsets reset by hand): the
  // old gate position no longer vouches for anything.
  snapshotter.offer(capture_at(0, 55));  // covered by the commit of 60
  ASSERT_EQ(submitted.size(), 1u);
  finish(0);
  snapshotter.reset(p0, 20);
  snapshotter.offer(capture_at(0, 40));
  EXPECT_EQ(submitted.size(), 1u) << "40 is ahead of the group's committed 20";
}

TEST_F(SnapshotterTest, AFailedWriteIsReported) {
  snapshotter.reset(p1, 5);
  snapshotter.offer(capture_at(1, 5));
  ASSERT_EQ(submitted.size(), 1u);
  finish(0, false);
  ASSERT_EQ(written.size(), 1u);
  EXPECT_FALSE(written[0].second);
  EXPECT_EQ(snapshotter.counts().failed, 1u);
  EXPECT_FALSE(snapshotter.busy(p1));
}

TEST_F(SnapshotterTest, SubmitMayCallBackAtOnce) {
  // A store that fails synchronously (read-only) calls `done` inside submit.
  std::vector<bool> results;
  Snapshotter inline_store(
      [](state::SnapshotCapture, Snapshotter::Done done) { done(fail("read-only")); },
      [&](const PartitionId&, const Result<state::WriteReport>& r) {
        results.push_back(static_cast<bool>(r));
      });
  inline_store.reset(p0, 10);
  inline_store.offer(capture_at(0, 10));
  inline_store.offer(capture_at(0, 10));
  EXPECT_EQ(results, (std::vector<bool>{false, false}));
  EXPECT_TRUE(inline_store.wait_idle(std::chrono::milliseconds(0)));
}

TEST_F(SnapshotterTest, WritesFinishingOnAnotherThread) {
  snapshotter.reset(p0, 1'000);
  snapshotter.reset(p1, 1'000);
  // Finishes every write submitted so far on another thread (as the store's
  // writer would); a finished write may submit the waiting capture.
  auto finish_all = [&] {
    for (;;) {
      std::vector<Snapshotter::Done> to_finish;
      {
        std::lock_guard lock(mu);
        for (auto& s : submitted) {
          if (s.done) to_finish.push_back(std::move(s.done));
          s.done = nullptr;
        }
      }
      if (to_finish.empty()) return;
      std::thread t([&] {
        for (auto& d : to_finish) d(state::WriteReport{});
      });
      t.join();
    }
  };
  for (int i = 1; i <= 200; ++i) {
    snapshotter.offer(capture_at(i % 2, i));
    if (i % 3 == 0) finish_all();
  }
  finish_all();
  EXPECT_TRUE(snapshotter.wait_idle(std::chrono::seconds(1)));
  const auto c = snapshotter.counts();
  EXPECT_EQ(c.written, c.submitted);
  EXPECT_EQ(c.waiting, 0u);
}

}  // namespace
}  // namespace kdedup::pipeline
