// kill -9 in the middle of a recovery: the partitions are being rebuilt
// (no snapshots: state.dir is empty, so every assignment replays one window
// from Kafka) with small fetches and a slow broker, so the replay takes
// seconds; the instance is killed while /readyz still says 503, restarted
// (slow again) and stopped with SIGTERM during the replay (exit 0), then
// restarted at full speed: nothing emitted twice, nothing lost.

#include <gtest/gtest.h>

#include <iostream>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

void kill_during_rebuild(const std::string& window) {
  const auto t0 = std::chrono::steady_clock::now();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "replay-kill";
  s.state_dir = "";  // no snapshots: every assignment rebuilds
  s.window = window;
  Instance inst("inst", dir, b.bootstrap(), s);
  auto batch = run_batch(b, inst,
                         {.partitions = 2,
                          .domain = 600,
                          .per_second = 4000,
                          .seed = 61,
                          .limit = 8000,
                          .drift = 0.3});
  ASSERT_TRUE(batch) << batch.error().message;

  // Slow replay: 50 ms round trips and ~2 KiB per partition and fetch
  // (the recovery's output read too: it takes seconds, longer than the
  // readers' timeout of 15 s as a whole for the long window, which is fine
  // while records keep arriving).
  inst.settings().consumer_extra = {{"max.partition.fetch.bytes", "2048"}};
  ASSERT_TRUE(b.control("rtt 1 50"));
  ASSERT_TRUE(inst.start());
  bool killed_in_replay = false;
  const auto in_time = [](std::chrono::steady_clock::time_point since) {
    return std::chrono::steady_clock::now() - since < 150s;
  };
  for (const auto start = std::chrono::steady_clock::now(); in_time(start) && !killed_in_replay;) {
    const std::string log = inst.run_log();
    if (log.find("recovery done") != std::string::npos) break;
    if (log.find("recovery of 2 partition(s) planned") != std::string::npos) {
      std::this_thread::sleep_for(500ms);
      const int ready = inst.readyz();
      if (inst.run_log().find("recovery done") == std::string::npos) {
        inst.kill9();
        killed_in_replay = true;
        std::cout << "SIGKILL during the replay (/readyz " << ready << ")" << std::endl;
        EXPECT_EQ(ready, 503);
      }
    }
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(killed_in_replay) << "the replay finished before the kill\n" << inst.log_tail();

  // Again slow, and this time SIGTERM during the replay: a clean stop.
  ASSERT_TRUE(inst.start());
  bool stopped_in_replay = false;
  for (const auto start = std::chrono::steady_clock::now(); in_time(start) && !stopped_in_replay;) {
    const std::string log = inst.run_log();
    if (log.find("recovery done") != std::string::npos) break;
    if (log.find("recovery of 2 partition(s) planned") != std::string::npos) {
      std::this_thread::sleep_for(500ms);
      if (inst.run_log().find("recovery done") == std::string::npos) {
        const int code = inst.stop(30s);
        stopped_in_replay = true;
        std::cout << "SIGTERM during the replay: exit " << code << std::endl;
        EXPECT_EQ(code, 0) << inst.log_tail();
        EXPECT_NE(inst.run_log().find("stopped cleanly"), std::string::npos) << inst.log_tail();
      }
    }
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(stopped_in_replay) << "the replay finished before the stop\n" << inst.log_tail();

  // Restart at full speed while new records (same identities) arrive.
  ASSERT_TRUE(b.control("rtt 1 0"));
  inst.settings().consumer_extra.clear();
  ASSERT_TRUE(inst.start());
  Feeder feeder(b.bootstrap(), {.partitions = 2,
                                .domain = 600,
                                .per_second = 2000,
                                .seed = 62,
                                .limit = 2000,
                                .drift = 0.3});
  ASSERT_TRUE(inst.wait_ready(60s)) << inst.log_tail();
  ASSERT_TRUE(feeder.wait_done(30s));
  ASSERT_TRUE(feeder.stop()) << feeder.error();
  ASSERT_TRUE(wait_committed_to_end(b, "replay-kill", "in", 60s)) << inst.log_tail();
  std::cout << "restart: " << recovery_lines(inst.run_log()).to_string() << std::endl;
  EXPECT_EQ(inst.stop(), 0) << inst.log_tail();
  auto report = verify_topics(b, s);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, 10'000u);
  std::cout << "KillDuringRebuildReplay (window " << window << ") took " << seconds_since(t0)
            << " s" << std::endl;
}

TEST(RecoveryE2E, KillDuringRebuildReplay) { kill_during_rebuild("1h"); }
// The feeder writes 8000 records in 2 s: a 1 s window rebuilds from half of
// them, and the restart's 2000 new records repeat identities at its edge.
TEST(RecoveryE2E, KillDuringRebuildReplayShortWindow) { kill_during_rebuild("1s"); }

}  // namespace
}  // namespace kdedup::testing
