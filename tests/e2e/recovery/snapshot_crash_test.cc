// Crashes around snapshots. (1) The state dir is rolled back to an older
// copy (snapshot S behind the committed offset C, as after a crash between a
// commit and the next snapshot): the restart restores S and replays [S, C)
// in rebuild mode, emitting nothing twice and losing nothing. (2) kill -9
// while large snapshots are being written, several times: the store always
// holds a complete old or new snapshot (inspect --verify), and the run
// continues with an exact output.

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <random>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST(RecoveryE2E, OlderSnapshotIsRestoredAndReplayedToTheCommit) {
  const auto t0 = std::chrono::steady_clock::now();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "older";
  s.state_dir = dir.file("state");
  s.snapshot_interval = "500ms";
  Instance inst("inst", dir, b.bootstrap(), s);
  auto batch = run_batch(
      b, inst, {.partitions = 2, .domain = 600, .per_second = 2000, .seed = 21, .limit = 1500});
  ASSERT_TRUE(batch) << batch.error().message;
  auto old = inspect_snapshots(s.state_dir, true);
  ASSERT_EQ(old.snapshots.size(), 2u) << old.text;
  fs::copy(s.state_dir, dir.file("state-old"), fs::copy_options::recursive);

  // Phase 2 runs past the copy, snapshots at the new commit, then dies.
  ASSERT_TRUE(inst.start());
  ASSERT_TRUE(inst.wait_ready(60s)) << inst.log_tail();
  {
    Feeder feeder(b.bootstrap(),
                  {.partitions = 2, .domain = 600, .per_second = 2000, .seed = 22, .limit = 1500});
    ASSERT_TRUE(feeder.wait_done(30s));
    ASSERT_TRUE(feeder.stop()) << feeder.error();
  }
  ASSERT_TRUE(wait_committed_to_end(b, "older", "in", 60s)) << inst.log_tail();
  auto committed = b.committed("older", "in");
  ASSERT_TRUE(committed);
  // Periodic snapshots reach the committed offset also once the input
  // pauses (idle partitions are snapshotted when their interval passed).
  bool caught_up = false;
  Inspection now;
  for (int i = 0; i < 50 && !caught_up; ++i) {
    std::this_thread::sleep_for(200ms);
    now = inspect_snapshots(s.state_dir, false);
    caught_up = now.snapshots.size() == 2;
    for (const auto& snap : now.snapshots) {
      caught_up =
          caught_up && snap.next_offset == (*committed)[static_cast<std::size_t>(snap.partition)];
    }
  }
  EXPECT_TRUE(caught_up) << now.text;
  for (const auto& snap : now.snapshots) {
    std::cout << "live snapshot in[" << snap.partition << "] at " << snap.next_offset
              << ", committed " << (*committed)[static_cast<std::size_t>(snap.partition)]
              << std::endl;
  }
  inst.kill9();

  std::int64_t behind = 0;
  for (const auto& snap : old.snapshots) {
    behind += (*committed)[static_cast<std::size_t>(snap.partition)] - snap.next_offset;
  }
  fs::remove_all(s.state_dir);
  fs::rename(dir.file("state-old"), s.state_dir);
  std::cout << "killed after the commit; state dir rolled back: snapshots " << behind
            << " records behind the committed offsets" << std::endl;
  ASSERT_GT(behind, 0);

  ASSERT_TRUE(inst.start());
  ASSERT_TRUE(inst.wait_ready(60s)) << inst.log_tail();
  {
    Feeder feeder(b.bootstrap(),
                  {.partitions = 2, .domain = 600, .per_second = 2000, .seed = 23, .limit = 1000});
    ASSERT_TRUE(feeder.wait_done(30s));
    ASSERT_TRUE(feeder.stop()) << feeder.error();
  }
  ASSERT_TRUE(wait_committed_to_end(b, "older", "in", 60s)) << inst.log_tail();
  const double restores = inst.metric("kdedup_restores_total").value_or(-1);
  const double rebuilds = inst.metric("kdedup_rebuilds_total").value_or(-1);
  const double replayed = inst.metric("kdedup_rebuild_replayed_records_total").value_or(-1);
  std::cout << "restart: restores " << restores << ", rebuilds " << rebuilds << ", replayed "
            << replayed << std::endl;
  EXPECT_EQ(restores, 2) << inst.log_tail();
  EXPECT_EQ(rebuilds, 0) << inst.log_tail();
  EXPECT_GE(replayed, static_cast<double>(behind)) << inst.log_tail();
  EXPECT_EQ(inst.stop(), 0) << inst.log_tail();

  auto report = verify_topics(b, "in", "out", 3'600'000);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, 4000u);
  std::cout << "OlderSnapshotIsRestoredAndReplayedToTheCommit took " << seconds_since(t0) << " s"
            << std::endl;
}

TEST(RecoveryE2E, KillDuringLargeSnapshotWritesLeavesOldOrNew) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t seed = std::random_device{}();
  std::cout << "kill schedule seed " << seed << std::endl;
  std::mt19937_64 rng(seed);
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "large";
  s.state_dir = dir.file("state");
  s.snapshot_interval = "200ms";
  s.snapshot_records = 50;
  // A timer filter sized for 50k identities at 1e-7: ~15 MiB of state per
  // snapshot, while the few thousand identities of the test make a false
  // positive practically impossible (the verifier is exact).
  s.filter = "timer";
  s.fpp = 1e-7;
  s.capacity = 50'000;
  Instance inst("large", dir, b.bootstrap(), s);
  ASSERT_TRUE(inst.start());
  Feeder feeder(b.bootstrap(),
                {.partitions = 1, .domain = 600, .per_second = 400, .seed = seed, .drift = 0.3});
  std::uniform_int_distribution<int> run_ms(1200, 3500);
  std::uint64_t largest = 0;
  for (int round = 1; round <= 5; ++round) {
    // Killed members hold their partitions until the session times out:
    // wait for the assignment and restore, then kill while snapshots run.
    ASSERT_TRUE(inst.wait_ready(60s)) << inst.log_tail();
    std::this_thread::sleep_for(std::chrono::milliseconds(run_ms(rng)));
    const bool alive = inst.running();
    inst.kill9();
    auto inspected = inspect_snapshots(s.state_dir, true);
    std::cout << "round " << round << ": SIGKILL at feeder " << feeder.produced()
              << "; inspect --verify exit " << inspected.exit_code;
    for (const auto& snap : inspected.snapshots) {
      std::cout << ", " << snap.topic << "/" << snap.partition << " " << snap.status << " at "
                << snap.next_offset << " (" << snap.logical_bytes << " bytes)";
      largest = std::max<std::uint64_t>(largest, snap.logical_bytes);
    }
    std::cout << std::endl;
    ASSERT_TRUE(alive) << inst.log_tail();
    EXPECT_EQ(inspected.exit_code, 0) << inspected.text;
    for (const auto& snap : inspected.snapshots)
      EXPECT_EQ(snap.status, "verified") << inspected.text;
    ASSERT_TRUE(inst.start());
  }
  EXPECT_GE(largest, 4u << 20) << "snapshots should be large\n" << inst.log_tail(60);
  ASSERT_TRUE(feeder.stop()) << feeder.error();
  EXPECT_TRUE(wait_committed_to_end(b, "large", "in", 90s)) << inst.log_tail();
  EXPECT_EQ(inst.stop(), 0) << inst.log_tail();
  auto report = verify_topics(b, "in", "out", 3'600'000);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  std::cout << "KillDuringLargeSnapshotWritesLeavesOldOrNew took " << seconds_since(t0) << " s"
            << std::endl;
}

}  // namespace
}  // namespace kdedup::testing
