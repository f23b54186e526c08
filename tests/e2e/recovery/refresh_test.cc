// on_duplicate: refresh through `kdedup run` across kill -9 without
// snapshots: every restart rebuilds the filter from the input of the window
// before the committed offset, which under refresh must learn every
// occurrence (delivered or dropped), not only the deliveries. Window 3 s and
// identities repeating every ~2 s on average: many repeats are within the
// window of the previous occurrence but not of the last delivery, exactly
// where a keep_first rebuild would let copies through. The verifier's
// refresh oracle judges the whole output.

#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

TEST(RecoveryE2E, RefreshSurvivesKillNineWithoutSnapshots) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:4", "out:4", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "refresh-kill";
  s.window = "3s";
  s.refresh = true;
  s.state_dir = "";  // every restart rebuilds from Kafka
  s.session_timeout_ms = 3000;
  Instance instance("i", dir, b.bootstrap(), s);
  ASSERT_TRUE(instance.start());
  const std::uint64_t seed = std::random_device{}();
  std::cout << "seed " << seed << std::endl;
  std::mt19937_64 rng(seed);
  Feeder feeder(b.bootstrap(), {.partitions = 4, .domain = 500, .per_second = 250, .seed = seed});
  // Each run lives long enough to rejoin (the killed member's session
  // expires first) and commit, so every kill meets assigned partitions.
  for (int cycle = 1; cycle <= 4; ++cycle) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5000 + rng() % 2500));
    ASSERT_TRUE(instance.running()) << instance.log_tail();
    instance.kill9();
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 800));
    ASSERT_TRUE(instance.start()) << instance.log_tail();
    std::cout << "cycle " << cycle << ": SIGKILL + restart, feeder at " << feeder.produced()
              << std::endl;
  }
  ASSERT_TRUE(feeder.stop()) << feeder.error();
  EXPECT_TRUE(wait_committed_to_end(b, s.group, "in", 90s)) << instance.log_tail();
  EXPECT_EQ(instance.stop(), 0) << instance.log_tail();
  auto rebuilds = recovery_lines(instance.log());
  std::cout << "recoveries: " << rebuilds.to_string() << std::endl;
  EXPECT_GE(rebuilds.by_reason["rebuild_from_window"], 8)
      << "most restarts must rebuild partitions from the window before the commit";
  auto report = verify_topics(b, s);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->input_records, feeder.produced());
  EXPECT_EQ(report->lost, 0u);
  EXPECT_EQ(report->duplicated, 0u);
  EXPECT_EQ(report->unexpected, 0u);
  EXPECT_EQ(report->out_of_order, 0u);
  // Refresh must make a difference on this stream: keep_first's oracle
  // would want more deliveries.
  auto keep_first = verify_topics(b, s.input, s.output, 3'000, 0.0, false);
  ASSERT_TRUE(keep_first) << keep_first.error().message;
  EXPECT_GT(keep_first->oracle_distinct, report->oracle_distinct);
}

}  // namespace
}  // namespace kdedup::testing
