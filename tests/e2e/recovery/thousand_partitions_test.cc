// A thousand partitions through the binary: one `kdedup run` instance (4
// workers, the default timer filter, snapshots) assigned 1,024 input
// partitions while a feeder writes a keyed stream with duplicates to every
// one of them. Then half of them move to a second instance and back, and
// the first instance is SIGKILLed and restarted: every partition's first
// record after the restart meets a restored filter. The verifier judges the
// whole output against the exact oracle of the whole input (nothing lost,
// nothing emitted twice, false positives within the fpp), and the promises
// made for many partitions hold at that size: ready within 30 s of the
// start, the two instances' assignments adding up to 1,024, one log line
// per fresh partition, and no log line over 1 KiB (lines that name
// partitions summarise them). Once with a 1 h window (nothing expires) and
// once with 5 s (the run lasts many windows).

#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kPartitions = 1024;
constexpr std::size_t kLongestLine = 1024;

struct LogShape {
  std::size_t lines = 0;
  std::string longest;
};

/// How many lines `log` has, and its longest.
LogShape log_shape(const std::string& log) {
  std::istringstream in(log);
  LogShape out;
  std::string line;
  while (std::getline(in, line)) {
    ++out.lines;
    if (line.size() > out.longest.size()) out.longest = line;
  }
  return out;
}

/// Waits until `instance` reports `partitions` assigned partitions (the
/// metric is published once a second).
bool wait_assigned(Instance& instance, double partitions, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (instance.metric("kdedup_consumer_assigned_partitions") == partitions) return true;
    std::this_thread::sleep_for(200ms);
  }
  return false;
}

void thousand_partitions(const std::string& window) {
  const auto t0 = std::chrono::steady_clock::now();
  auto broker = TestBroker::start({.brokers = 1,
                                   .topics = {"in:" + std::to_string(kPartitions),
                                              "out:" + std::to_string(kPartitions), "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "thousand";
  s.window = window;
  s.filter = "timer";
  s.fpp = 0.001;
  s.threads = 4;
  s.snapshot_interval = "1s";
  RunSettings sa = s, sb = s;
  sa.state_dir = dir.file("a-state");
  sb.state_dir = dir.file("b-state");
  Instance a("a", dir, b.bootstrap(), sa);
  Instance bi("b", dir, b.bootstrap(), sb);

  const auto a_started = std::chrono::steady_clock::now();
  ASSERT_TRUE(a.start());
  ASSERT_TRUE(a.wait_ready(60s)) << a.log_tail();
  const double ready_s = seconds_since(a_started);
  std::cout << "a ready with " << kPartitions << " partitions after " << ready_s << " s"
            << std::endl;
  EXPECT_LE(ready_s, 30.0) << "1,024 partitions must be ready within 30 s";
  EXPECT_TRUE(wait_assigned(a, kPartitions, 10s)) << a.log_tail();
  // A partition with nothing to replay is ready at once: one line says its
  // plan and its outcome.
  {
    std::istringstream in(a.run_log());
    std::size_t fresh = 0, lines = 0;
    for (std::string line; std::getline(in, line); ++lines) {
      if (line.find("recovery done (fresh_partition)") == std::string::npos) continue;
      ++fresh;
      EXPECT_NE(line.find("no committed offset"), std::string::npos) << line;
    }
    EXPECT_EQ(fresh, static_cast<std::size_t>(kPartitions));
    EXPECT_LT(lines, static_cast<std::size_t>(kPartitions) + 100) << "one line per partition";
  }

  // ~4 records per partition and second; identities repeat about three
  // times each and new ones keep arriving (drift).
  Feeder feeder(b.bootstrap(), {.partitions = kPartitions,
                                .domain = 20'000,
                                .per_second = 4'000,
                                .seed = 1024,
                                .drift = 0.3});
  std::this_thread::sleep_for(5s);

  // Half the partitions move to b, which has no snapshots: it rebuilds
  // them from what a delivered before it emits.
  ASSERT_TRUE(bi.start());
  std::cout << "b joins at feeder " << feeder.produced() << std::endl;
  ASSERT_TRUE(bi.wait_ready(90s)) << bi.log_tail();
  double a_share = 0, b_share = 0;
  for (int i = 0; i < 300 && (b_share == 0 || a_share + b_share != kPartitions); ++i) {
    std::this_thread::sleep_for(200ms);
    a_share = a.metric("kdedup_consumer_assigned_partitions").value_or(0);
    b_share = bi.metric("kdedup_consumer_assigned_partitions").value_or(0);
  }
  std::cout << "after b joined: a holds " << a_share << ", b " << b_share << " partitions"
            << std::endl;
  EXPECT_GT(b_share, 0) << bi.log_tail();
  EXPECT_GT(a_share, 0) << a.log_tail();
  EXPECT_EQ(a_share + b_share, kPartitions);
  std::this_thread::sleep_for(4s);

  // b leaves: a takes its partitions back and restores them from the
  // snapshots it wrote when it handed them over.
  const double a_restores_before = a.metric("kdedup_restores_total").value_or(0);
  EXPECT_EQ(bi.stop(), 0) << bi.log_tail();
  std::cout << "b left (SIGTERM) at feeder " << feeder.produced() << std::endl;
  EXPECT_TRUE(wait_assigned(a, kPartitions, 90s)) << a.log_tail();
  std::this_thread::sleep_for(1500ms);  // metrics are published once a second
  const double a_restores = a.metric("kdedup_restores_total").value_or(0);
  std::cout << "a restores " << a_restores_before << " -> " << a_restores
            << "; a's log so far: " << recovery_lines(a.run_log()).to_string() << std::endl;
  EXPECT_GT(a_restores, a_restores_before) << a.log_tail();
  std::this_thread::sleep_for(3s);

  // SIGKILL a while the feeder runs; its restart restores every partition
  // from its snapshots and replays what came after them.
  a.kill9();
  std::cout << "a SIGKILLed at feeder " << feeder.produced() << std::endl;
  const auto restarted = std::chrono::steady_clock::now();
  ASSERT_TRUE(a.start());
  ASSERT_TRUE(a.wait_ready(90s)) << a.log_tail();
  EXPECT_TRUE(wait_assigned(a, kPartitions, 30s)) << a.log_tail();
  std::cout << "a ready again after " << seconds_since(restarted)
            << " s; the restarted run: " << recovery_lines(a.run_log()).to_string() << std::endl;
  std::this_thread::sleep_for(1500ms);
  EXPECT_GT(a.metric("kdedup_restores_total").value_or(0), 0) << a.log_tail();
  std::this_thread::sleep_for(3s);

  ASSERT_TRUE(feeder.stop()) << feeder.error();
  EXPECT_TRUE(wait_committed_to_end(b, "thousand", "in", 120s)) << a.log_tail();
  EXPECT_EQ(a.stop(), 0) << a.log_tail();

  for (const Instance* i : {&a, &bi}) {
    const LogShape shape = log_shape(i->log());
    std::cout << i->name() << "'s log: " << shape.lines << " lines, the longest "
              << shape.longest.size() << " bytes" << std::endl;
    EXPECT_LE(shape.longest.size(), kLongestLine) << i->name() << ": " << shape.longest;
  }
  auto report = verify_topics(b, s);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, feeder.produced());
  EXPECT_EQ(report->lost, 0u);
  EXPECT_EQ(report->duplicated, 0u);
  EXPECT_LE(report->false_positives, report->fp_bound);
  EXPECT_LT(report->oracle_distinct, report->input_records) << "the stream must hold duplicates";
  std::cout << "AThousandPartitions (window " << window << ") took " << seconds_since(t0) << " s"
            << std::endl;
}

TEST(RecoveryE2E, AThousandPartitionsOnOneInstanceMoveHalfAndBackAndSurviveAKill) {
  thousand_partitions("1h");
}
// A window far shorter than the test: identities expire and repeat across
// every move and the kill, and the second instance rebuilds its share
// mid-stream from one window of what the first delivered.
TEST(RecoveryE2E, AThousandPartitionsShortWindow) { thousand_partitions("5s"); }

}  // namespace
}  // namespace kdedup::testing
