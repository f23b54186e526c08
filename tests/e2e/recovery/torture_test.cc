// The kill -9 torture: two `kdedup run` instances in one group, each with
// its own state dir, while a feeder produces a keyed stream with duplicates;
// 20 times a random instance is SIGKILLed at a random moment and restarted.
// Then the feeder stops, the group drains, both stop gracefully, and the
// verifier compares the whole output with the exact oracle of the whole
// input: nothing lost, nothing duplicated, nothing out of order (with the
// timer filter: false positives counted and within fpp).
//
// Each runs with a window of 1 h (nothing expires during the test) and of
// 5 s: the stream lasts many windows, so identities expire and repeat
// across every kill, and a partition rebuilt without its snapshot must
// reproduce the decisions of its previous owner at the window's edge.
//
// In confirmed mode (filter.confirm_store) the timer filter runs at fpp
// 0.05 with a 1 KiB floor, so it makes false positives all along, and the
// verifier judges with the exact oracle: not one record may be lost.
//
// The seed is printed; KDEDUP_TORTURE_SEED=<n> replays the same schedule.

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <random>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

std::uint64_t torture_seed() {
  if (const char* s = std::getenv("KDEDUP_TORTURE_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

/// Two instances in group `group`, `cycles` random SIGKILL + restart
/// cycles while the feeder runs, then drain, graceful stop and the verifier.
void torture(const std::string& group, int cycles, const std::string& partitioning,
             const std::string& window = "1h", const std::string& filter = "exact",
             bool confirm = false) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t seed = torture_seed();
  std::cout << "torture seed " << seed << " (KDEDUP_TORTURE_SEED=" << seed << " to replay)"
            << std::endl;
  std::mt19937_64 rng(seed);

  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:4", "out:4", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = group;
  s.partitioning = partitioning;
  s.window = window;
  s.filter = filter;
  if (filter != "exact") s.fpp = confirm ? 0.05 : 0.001;
  if (confirm) {
    s.confirm = true;
    s.min_bytes = "1KiB";
  }
  s.snapshot_interval = "1s";
  s.session_timeout_ms = 3000;
  std::vector<std::unique_ptr<Instance>> instances;
  for (const char* name : {"a", "b"}) {
    RunSettings own = s;
    own.state_dir = dir.file(std::string(name) + "-state");
    instances.push_back(std::make_unique<Instance>(name, dir, b.bootstrap(), own));
    ASSERT_TRUE(instances.back()->start());
  }
  Feeder feeder(b.bootstrap(),
                {.partitions = 4, .domain = 600, .per_second = 300, .seed = seed, .drift = 0.3});

  std::uniform_int_distribution<int> pick(0, 1);
  std::uniform_int_distribution<int> run_ms(1500, 6000);
  std::uniform_int_distribution<int> down_ms(0, 1500);
  for (int cycle = 1; cycle <= cycles; ++cycle) {
    const int wait = run_ms(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait));
    Instance& victim = *instances[static_cast<std::size_t>(pick(rng))];
    const pid_t pid = victim.pid();
    // Its exit status if it ended by itself (128 + n: signal n).
    const std::optional<int> exited = victim.wait_exit(std::chrono::milliseconds(0));
    const bool was_running = !exited;
    victim.kill9();
    const std::string killed_log = victim.run_log();
    const auto recovered = recovery_lines(killed_log);
    const int down = down_ms(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(down));
    ASSERT_TRUE(victim.start()) << victim.log_tail();
    std::cout << "cycle " << cycle << ": after " << wait << " ms SIGKILL " << victim.name()
              << " (pid " << pid << (was_running ? "" : ", had already exited") << "), feeder at "
              << feeder.produced() << " records, restarted after " << down << " ms as pid "
              << victim.pid() << "; the killed run had: " << recovered.to_string() << std::endl;
    // A segmentation fault is a crash like the kill (crashed_by_itself);
    // any other end (an error exit, an abort) fails the test.
    if (!crashed_by_itself(victim.name(), exited, killed_log,
                           "before the kill in cycle " + std::to_string(cycle))) {
      ASSERT_TRUE(was_running) << victim.name() << " exited by itself before the kill, status "
                               << exited.value_or(-1) << "\n"
                               << victim.log_tail();
    }
  }
  ASSERT_TRUE(feeder.stop()) << feeder.error();
  std::cout << "feeder stopped at " << feeder.produced() << " records after " << seconds_since(t0)
            << " s" << std::endl;

  EXPECT_TRUE(wait_committed_to_end(b, group, "in", 90s))
      << instances[0]->log_tail() << instances[1]->log_tail();
  double lookups = 0, prevented = 0;
  if (confirm) {
    std::this_thread::sleep_for(1500ms);  // metrics are published once a second
    for (auto& i : instances) {
      lookups += i->metric("kdedup_confirm_lookups_total").value_or(0);
      prevented += i->metric("kdedup_confirm_prevented_false_positives_total").value_or(0);
    }
    std::cout << "confirmed mode, the last runs: " << lookups << " duplicates of the filter "
              << "looked up, " << prevented << " false positives prevented" << std::endl;
  }
  for (auto& i : instances) {
    std::cout << i->name() << " over all runs: " << recovery_lines(i->log()).to_string()
              << std::endl;
    // After the assignor's fault the other member took the partitions over
    // and drained them (wait_committed_to_end), and the output is judged as
    // always; any other end than a clean stop fails the test.
    if (const auto status = stop_after_kills(*i)) {
      EXPECT_EQ(*status, 0) << i->log_tail();
    }
  }
  auto report = verify_topics(b, s);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->input_records, feeder.produced());
  EXPECT_EQ(report->lost, 0u);
  EXPECT_EQ(report->duplicated, 0u);
  EXPECT_EQ(report->out_of_order, 0u);
  EXPECT_EQ(report->unexpected, 0u);
  EXPECT_LE(report->false_positives, report->fp_bound);
  EXPECT_GT(report->oracle_distinct, 0u);
  EXPECT_LT(report->oracle_distinct, report->input_records) << "the stream must hold duplicates";
  if (confirm) {
    EXPECT_EQ(report->false_positives, 0u);
    EXPECT_GT(lookups, 0) << "the filter's duplicates must have been confirmed";
  }
  std::cout << "torture seed " << seed << " done in " << seconds_since(t0) << " s" << std::endl;
}

TEST(RecoveryE2E, KillNineTorture) { torture("torture", 20, "input"); }

// Output partitioned by key: every input partition writes every output
// partition, so reconciliation must read all output tails.
TEST(RecoveryE2E, KillNineTortureKeyPartitionedOutput) { torture("torture-key", 10, "key"); }

// Windows far shorter than the test (10 cycles: about 40 s of traffic, 8
// windows).
TEST(RecoveryE2E, KillNineTortureShortWindow) { torture("torture-5s", 10, "input", "5s"); }
TEST(RecoveryE2E, KillNineTortureShortWindowTimerFilter) {
  torture("torture-5s-timer", 10, "input", "5s", "timer");
}
TEST(RecoveryE2E, KillNineTortureShortWindowKeyPartitionedOutput) {
  torture("torture-5s-key", 8, "key", "5s");
}
// Confirmed mode: the confirm store must never make a record past the
// committed offset look delivered (it would be lost as a duplicate of
// itself) nor forget a delivery (a duplicate would pass).
TEST(RecoveryE2E, KillNineTortureShortWindowConfirmed) {
  torture("torture-5s-confirm", 12, "input", "5s", "timer", true);
}

}  // namespace
}  // namespace kdedup::testing
