// Memory follows load, through `kdedup run` on the test broker as a user
// runs it (DESIGN.md "Memory follows load"):
// - 256 idle assigned partitions with capacity 1000000 hold their floors
//   (timer and compact filters): the process stays under 256 MiB;
// - under a memory.max_bytes smaller than the load needs (timer and compact
//   filters), the filters stay within it (plus one floor per partition),
//   the effective fpp is raised and reported, the audited false-positive
//   rate stays within the reported estimate, nothing is emitted twice, the
//   log says so once per step, and the target returns once the load falls,
//   also when a partition went quiet with the window it held, and also
//   once no partition gets records any more;
// - a budget smaller than the partitions' floors says so once;
// - a burst across 256 partitions grows every partition's filter, and every
//   one gives the memory back once the load falls;
// - a filter grown by a burst shrinks once the load falls, and so does one
//   restored from a snapshot taken at the peak of a burst, which still
//   drops the burst's identities resent after the restart;
// - a fall by less than half shrinks the timer filter in place, and its
//   snapshot restores shrunk;
// - a shrunk timer filter whose load climbs back grows in place, and its
//   snapshot, taken while the copies are alive, restores and still finds
//   the identities held in them;
// - a 5x burst of repeats grows the timer filter in place once, within 2x
//   of what its peak needs, and it gives the memory back after the burst;
// - jemalloc's background thread, which hands freed pages back by the
//   clock while the process is quiet, runs in `kdedup run`, and
//   MALLOC_CONF turns it off.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <thread>

#include "broker.h"
#include "figures.h"
#include "http_get.h"
#include "instance.h"
#include "kdedup/filter/timer_filter.h"
#include "kdedup/testbroker/child_process.h"
#include "metrics_doc.h"
#include "prometheus_query.h"
#include "streams.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;
using testbroker::ChildOptions;
using testbroker::ChildProcess;

/// A filter type, and whether quiet partitions park (the default
/// park_after) or not (0).
struct IdleCase {
  const char* type;
  bool parking;
};

class IdlePartitions : public ::testing::TestWithParam<IdleCase> {};

TEST_P(IdlePartitions, TwoHundredFiftySixHoldAFloorAtMost) {
  // 256 partitions assigned, no record, capacity 1000000. With parking
  // (the default park_after) none holds a filter before its first record;
  // without, each holds its 64 KiB floor (and a little bookkeeping), not
  // the 12 MiB (timer) or 1.8 MiB (compact) a filter sized for the
  // capacity would.
  const auto [type, parking] = GetParam();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:256", "out:256"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TempDir dir;
  Instance k(dir, "idle", (*broker)->bootstrap(),
             std::string("window: 1h\nfilter:\n  type: ") + type +
                 "\n  fpp: 0.01\n  capacity: 1000000\n"
                 "state:\n  dir: \"\"\n" +
                 (parking ? "" : "  park_after: 0\n"));
  ASSERT_TRUE(k.wait_for_sum("kdedup_consumer_assigned_partitions", 256, 120s)) << k.log();
  if (parking) {
    ASSERT_TRUE(k.wait_for_sum("kdedup_filter_parked", 256, 10s)) << k.log();
  } else {
    ASSERT_TRUE(k.wait_for([&] { return k.values("kdedup_filter_bytes").size() == 256; }, 10s))
        << k.log();
  }
  std::this_thread::sleep_for(2s);
  const double filters = k.sum("kdedup_filter_bytes");
  const double rss = rss_bytes(k.pid());
  std::printf("256 idle partitions, %s, %s: filters %.0f KiB, RSS %.0f MiB\n", type,
              parking ? "parking" : "park_after 0", filters / 1024, rss / (1 << 20));
  if (parking) {
    EXPECT_EQ(filters, 0);
    EXPECT_EQ(k.sum("kdedup_memory_used_bytes"), 0);
  } else {
    EXPECT_EQ(k.sum("kdedup_filter_parked"), 0);
    EXPECT_LE(filters, 256 * (64 + 4) * 1024.0);
    EXPECT_GE(k.sum("kdedup_memory_used_bytes"), 256 * 64 * 1024.0);
  }
  EXPECT_LT(rss, 256.0 * (1 << 20)) << "RSS " << rss / (1 << 20) << " MiB";
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

INSTANTIATE_TEST_SUITE_P(RunMemory, IdlePartitions,
                         ::testing::Values(IdleCase{"timer", true}, IdleCase{"compact", true},
                                           IdleCase{"timer", false}, IdleCase{"compact", false}),
                         [](const ::testing::TestParamInfo<IdleCase>& p) {
                           return std::string(p.param.type) +
                                  (p.param.parking ? "_parking" : "_park_after_0");
                         });

TEST(RunMemory, ABurstAcrossTwoHundredFiftySixPartitionsGrowsEachFilterAndEachGivesItBack) {
  // Memory follows the load per partition, at the partition count of the
  // idle test above: a burst of about 1,000 new identities a partition,
  // stamped within one second, then a trickle of 2 a partition a second
  // for two and a half 10 s windows (event time: the partitions' clocks
  // follow the stamps, not the test's pace). A 4 KiB floor (it holds about
  // 330 identities at fpp 1%, 8-bit timers) keeps the records few. Every
  // partition's filter grows past its floor for the burst, and every one
  // gives the memory back once the burst has left its window; every
  // record is taken and every key emitted at most once. Parking is off,
  // so that each partition holds its floor from its assignment on.
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:256", "out:256"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance k(dir, "many", b.bootstrap(),
             "window: 10s\nfilter:\n  type: timer\n  fpp: 0.01\n  capacity: 1000000\n"
             "  min_bytes: 4KiB\nstate:\n  dir: \"\"\n  park_after: 0\n");
  ASSERT_TRUE(k.wait_for_sum("kdedup_consumer_assigned_partitions", 256, 120s)) << k.log();
  ASSERT_TRUE(k.wait_for([&] { return k.values("kdedup_filter_bytes").size() == 256; }, 10s))
      << k.log();
  // A floor's cells and the filter's bookkeeping, the same in every
  // partition.
  const std::vector<double> floors = k.values("kdedup_filter_bytes");
  const double floor = floors.front();
  EXPECT_EQ(std::count(floors.begin(), floors.end(), floor), 256);
  EXPECT_GE(floor, 4096);
  EXPECT_LT(floor, 2 * 4096);
  const std::int64_t t0 = wall_ms() - 120'000;
  const auto burst = stamped("burst-", 256'000, t0, 1);
  const auto trickle = stamped("trickle-", 510, t0 + 1'000, 25);
  auto took = [&](std::size_t n) {
    return k.wait_for_sum("kdedup_records_in_total", static_cast<double>(n), 120s);
  };
  ASSERT_TRUE(b.produce("in", burst));
  ASSERT_TRUE(took(burst.size())) << k.log();
  std::this_thread::sleep_for(1500ms);
  const std::vector<double> grown = k.values("kdedup_filter_bytes");
  ASSERT_EQ(grown.size(), 256U);
  const double peak = std::accumulate(grown.begin(), grown.end(), 0.0);
  EXPECT_GT(*std::min_element(grown.begin(), grown.end()), floor)
      << "every partition's filter grows for its burst";
  ASSERT_TRUE(b.produce("in", trickle));
  ASSERT_TRUE(took(burst.size() + trickle.size())) << k.log();
  std::this_thread::sleep_for(1500ms);
  const std::vector<double> after = k.values("kdedup_filter_bytes");
  ASSERT_EQ(after.size(), 256U);
  const double held = std::accumulate(after.begin(), after.end(), 0.0);
  std::printf(
      "256 partitions: %.0f KiB at the floors, %.0f KiB after the burst, %.0f KiB after "
      "the trickle (the largest %.0f KiB)\n",
      256 * floor / 1024, peak / 1024, held / 1024,
      *std::max_element(after.begin(), after.end()) / 1024);
  // Each folds back to its floor or to the line count a fold by a whole
  // factor reaches from what it grew to (under twice the floor).
  EXPECT_LT(*std::max_element(after.begin(), after.end()), 2 * floor);
  EXPECT_LT(held, peak / 3);
  EXPECT_EQ(static_cast<double>(expect_each_key_once(b)) + k.sum("kdedup_records_duplicate_total"),
            static_cast<double>(burst.size() + trickle.size()));
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

/// Whether one of a process's threads is named `name` (/proc/PID/task/*/comm).
bool has_thread(pid_t pid, const std::string& name) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks)) {
    std::ifstream in(task.path() / "comm");
    std::string comm;
    if (std::getline(in, comm) && comm == name) return true;
  }
  return false;
}

/// Whether the process has libjemalloc mapped (the release binaries link
/// it; the sanitizer builds run on glibc's allocator).
bool runs_on_jemalloc(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(in, line);) {
    if (line.find("libjemalloc") != std::string::npos) return true;
  }
  return false;
}

TEST(RunMemory, JemallocsBackgroundThreadHandsFreedPagesBackWhileTheProcessIsQuiet) {
  // Without it jemalloc purges freed pages only as threads allocate, so
  // what a burst freed stayed resident in a quiet instance
  // (docs/performance.md, "Freed memory leaves a quiet process").
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TempDir dir;
  Instance k(dir, "allocator", (*broker)->bootstrap(), "window: 1m\nstate:\n  dir: \"\"\n");
  ASSERT_TRUE(k.wait_for_sum("kdedup_consumer_assigned_partitions", 1, 60s)) << k.log();
  if (!runs_on_jemalloc(k.pid())) GTEST_SKIP() << "this build runs on glibc's allocator";
  EXPECT_TRUE(has_thread(k.pid(), "jemalloc_bg_thd"));
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();

  // MALLOC_CONF overrides the binary's choice (the same binary, its
  // test broker: the allocator's options are the process's, whatever runs).
  ChildOptions o;
  o.env = {"MALLOC_CONF=background_thread:false"};
  o.stderr_file = dir.file("off.log");
  auto off = ChildProcess::spawn({KDEDUP_BINARY, "testbroker"}, o);
  ASSERT_TRUE(off) << off.error().message;
  std::this_thread::sleep_for(2s);
  ASSERT_FALSE((*off)->poll_exit()) << read_file(dir.file("off.log"));
  EXPECT_FALSE(has_thread((*off)->pid(), "jemalloc_bg_thd"));
  (*off)->signal(SIGTERM);
  static_cast<void>((*off)->wait(30s));
}

struct BudgetCase {
  const char* type;
  int budget_kib;
  // Between the batches: the budget level moves when a filter's clock does,
  // at most a step every two ticks. A compact tick is a tenth of the window
  // (2 s here), an 8-bit timer's 1/192: paced, both see the load over
  // several of their ticks, as a load that lasts longer than a burst, and
  // the run is the same each time (unpaced, how far the level climbs
  // depends on how the batches fall on the ticks).
  std::chrono::milliseconds pause;
};

class UnderABudget : public ::testing::TestWithParam<BudgetCase> {};

TEST_P(UnderABudget, TheFppRisesEvenlyWithoutFalseNegatives) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  // 60k identities inside a 20 s window need about 1.1 MiB at fpp 0.001
  // with 8-bit timers (1.5 MiB as they arrive, in a burst), about 150 KiB
  // with the compact filter; the budget is 640 KiB or 96 KiB, plus one
  // 4 KiB floor per partition. Every identity is audited (audit_sample: 1).
  // One worker thread takes both partitions: with two, how their batches
  // interleave on a loaded machine decided which filter took the budget's
  // room first: in one CI run, and in one of five runs beside two busy
  // cores (on the library before and after the change that came with this
  // one), the level stopped a step lower (0.128) while a filter rejected
  // new identities until its next tick (audited 0.188 and 0.163, within
  // the estimate that counts them, 0.59 and 0.48). With one, the level
  // reached 0.25 in four runs of four beside two busy cores.
  const BudgetCase& bc = GetParam();
  const double kBudget = bc.budget_kib * 1024.0, kFloors = 2 * 4 * 1024;
  Instance k(dir, "budget", b.bootstrap(),
             std::string("window: 20s\nfilter:\n  type: ") + bc.type +
                 "\n  fpp: 0.001\n  min_bytes: 4KiB\nmemory:\n  max_bytes: " +
                 std::to_string(bc.budget_kib) + "KiB\nstate:\n  dir: \"\"\n",
             "  audit_sample: 1\n", 1);
  ASSERT_TRUE(k.wait_for_sum("kdedup_consumer_assigned_partitions", 2, 60s)) << k.log();
  EXPECT_EQ(k.sum("kdedup_memory_budget_bytes"), kBudget);
  const double rss_before = rss_bytes(k.pid());

  // 60k identities, each 10th one resent right away (a duplicate inside the
  // window), produced while the instance runs; the largest reservation and
  // the largest estimate are watched all along, every 100 ms (the bridge
  // publishes once a second): the audited rate below is an average over the
  // run, so it is judged against the highest estimate published, not one
  // sampled between batches.
  double worst_used = 0, worst_estimate = 0, worst_effective = 0;
  auto watch = [&] {
    worst_used = std::max(worst_used, k.sum("kdedup_memory_used_bytes"));
    worst_estimate = std::max(worst_estimate, k.max("kdedup_filter_fpp_estimate"));
    worst_effective = std::max(worst_effective, k.sum("kdedup_filter_fpp_effective_target"));
  };
  auto watch_for = [&](std::chrono::milliseconds span) {
    const auto until = std::chrono::steady_clock::now() + span;
    do {
      watch();
      std::this_thread::sleep_for(100ms);
    } while (std::chrono::steady_clock::now() < until);
  };
  int total = 0;
  for (int batch = 0; batch < 12; ++batch) {
    auto records = keys("id-", batch * 5000, (batch + 1) * 5000);
    for (int i = 0; i < 500; ++i) records.push_back(records[static_cast<std::size_t>(i * 10)]);
    total += static_cast<int>(records.size());
    ASSERT_TRUE(b.produce("in", records));
    watch_for(bc.pause);
  }
  ASSERT_TRUE(k.wait_for(
      [&] {
        watch();
        return k.sum("kdedup_records_in_total") == total;
      },
      60s))
      << k.log();
  watch_for(1500ms);  // the bridge's last round
  const double rss_after = rss_bytes(k.pid());

  // Within the budget (plus the floors); the fpp raised for every partition
  // and reported.
  EXPECT_LE(worst_used, kBudget + kFloors);
  EXPECT_LE(k.sum("kdedup_filter_bytes"), kBudget + kFloors + 64 * 1024);  // + bookkeeping
  EXPECT_GT(worst_effective, 0.001);
  EXPECT_GT(worst_estimate, 0.001);
  // The process grew by less than the budget and its client buffers.
  EXPECT_LT(rss_after - rss_before, kBudget + 64.0 * (1 << 20))
      << rss_before / (1 << 20) << " -> " << rss_after / (1 << 20) << " MiB";
  // No false negative: the audit saw none, and no key came out twice.
  EXPECT_EQ(k.sum("kdedup_audit_false_negatives_total"), 0);
  EXPECT_EQ(
      expect_each_key_once(b) + static_cast<std::size_t>(k.sum("kdedup_records_duplicate_total")),
      static_cast<std::size_t>(total));
  // Observed false positives within what the filters reported.
  const double fp = k.sum("kdedup_audit_false_positives_total");
  const double fresh = k.sum("kdedup_audit_truly_new_total");
  ASSERT_GT(fresh, 50'000);
  EXPECT_LE(fp / fresh, 1.2 * worst_estimate) << fp << " / " << fresh;
  // ... and within the effective target the budget raised the fpp to (the
  // project's tolerance for a measured rate against a target, 1.2x): the
  // level rises with the load, and a filter that took more than its share
  // before the others' load was known gives it back. The level moves at
  // most a step every two of a filter's ticks; a filter that fills before
  // the next step rejects new identities until its next tick, and counts
  // them in its estimate (checked above). In one CI run on a loaded machine
  // the level stopped a step lower than usual: 0.1345 against 0.128 (two
  // worker threads then; one since, above).
  EXPECT_LE(fp / fresh, 1.2 * worst_effective) << fp << " / " << fresh;
  // One warning per step up, not per record.
  const std::string log = k.log();
  const std::size_t raised = count_lines(log, "effective fpp raised to");
  std::printf(
      "%s, budget %.0f KiB: at most %.1f KiB reserved, effective fpp up to %g, estimate up to "
      "%g, audited FP rate %.4f (%.0f / %.0f), RSS %+.1f MiB, %zu warnings\n",
      bc.type, kBudget / 1024, worst_used / 1024, worst_effective, worst_estimate, fp / fresh, fp,
      fresh, (rss_after - rss_before) / (1 << 20), raised);
  EXPECT_GE(raised, 1U) << log;
  EXPECT_LE(raised, 8U) << log;  // 0.001 * 2^8 > 0.25: at most 8 steps

  // The load falls to a trickle of new identities, all on partition 1, for
  // little more than a window, then to nothing: the filters fit again and
  // size for filter.fpp. Partition 0 goes quiet: its clock (event time)
  // stands still with the window it held; after a window of wall time it
  // asks for no more than it holds, and does not keep partition 1's fpp
  // raised (before, its demand for that window at filter.fpp did, for as
  // long as it stayed quiet). Once the trickle stops no filter's clock moves
  // and the level falls by the workers' wall-clock votes (before, it stayed
  // wherever the last tick left it: one step down per two ticks is slower
  // than the trickle is long).
  for (int i = 0; i < 30; ++i) {
    auto late = keys("late-", i * 10, i * 10 + 10);
    for (auto& r : late) r.partition = 1;
    ASSERT_TRUE(b.produce("in", late));
    std::this_thread::sleep_for(900ms);
  }
  EXPECT_TRUE(k.wait_for_sum("kdedup_filter_fpp_effective_target", 0.001, 60s)) << k.log();
  EXPECT_NE(k.log().find("every partition sizes for filter.fpp 0.001 again"), std::string::npos);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

INSTANTIATE_TEST_SUITE_P(RunMemory, UnderABudget,
                         ::testing::Values(BudgetCase{"timer", 640, 1000ms},
                                           BudgetCase{"compact", 96, 1000ms}),
                         [](const ::testing::TestParamInfo<BudgetCase>& p) {
                           return std::string(p.param.type);
                         });

TEST(RunMemory, ABudgetSmallerThanTheFloorsSaysSoOnce) {
  // 32 partitions hold at least filter.min_bytes (4 KiB) each once they
  // take records: 128 KiB, twice the 64 KiB budget. The log says so at the
  // assignment; no fpp makes that fit: the level climbs to the top (0.25),
  // the log says once why it cannot do more and what to change, and every
  // record still goes through without a duplicate out.
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:32", "out:32"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance k(dir, "floors", b.bootstrap(),
             "window: 10s\nfilter:\n  type: timer\n  fpp: 0.01\n  min_bytes: 4KiB\n"
             "memory:\n  max_bytes: 64KiB\nstate:\n  dir: \"\"\n");
  ASSERT_TRUE(k.wait_for_sum("kdedup_consumer_assigned_partitions", 32, 60s)) << k.log();
  // Said at the assignment, before any partition has a filter: the floors
  // of every assigned partition against the budget.
  const std::string floors =
      "the 32 assigned partitions need at least filter.min_bytes (4096 bytes) each once they "
      "have had a record, 128.0 KiB together, more than memory.max_bytes (64.0 KiB)";
  ASSERT_TRUE(k.wait_for([&] { return k.log().find(floors) != std::string::npos; }, 10s))
      << k.log();
  EXPECT_EQ(k.sum("kdedup_filter_parked"), 32) << k.log();
  // A few rounds on every partition, so that each filter's clock ticks and
  // it publishes what it needs.
  int total = 0;
  for (int round = 0; round < 6; ++round) {
    auto records = keys("r" + std::to_string(round) + "-", 0, 320);
    for (std::size_t i = 0; i < records.size(); ++i) {
      records[i].partition = static_cast<std::int32_t>(i % 32);
    }
    records.push_back(records.front());  // one duplicate a round
    total += static_cast<int>(records.size());
    ASSERT_TRUE(b.produce("in", records));
    std::this_thread::sleep_for(500ms);
  }
  ASSERT_TRUE(k.wait_for_sum("kdedup_records_in_total", total, 60s)) << k.log();
  EXPECT_TRUE(k.wait_for_sum("kdedup_filter_fpp_effective_target", 0.25, 30s)) << k.log();
  const std::string log = k.log();
  EXPECT_EQ(count_lines(log, floors), 1U) << log;
  EXPECT_EQ(count_lines(log, " partitions' filters need"), 1U) << log;
  EXPECT_EQ(count_lines(log, "raise memory.max_bytes or lower filter.min_bytes"), 2U) << log;
  // The partitions holding a filter when it was said: each makes its
  // filter at its first record (parked until then), and more than 16
  // floors pass the budget.
  const std::size_t need = log.find(" partitions' filters need");
  ASSERT_NE(need, std::string::npos) << log;
  const std::size_t said = log.rfind(' ', need - 1) + 1;
  const int holding = std::stoi(log.substr(said, need - said));
  EXPECT_GT(holding, 16);
  EXPECT_LE(holding, 32);
  std::printf("%s\n", log.substr(said, log.find('\n', said) - said).c_str());
  // Nothing lost: each record out once or counted a duplicate (at fpp 0.25
  // some distinct ones are: false positives), no key out twice.
  EXPECT_GE(k.sum("kdedup_records_duplicate_total"), 6);
  EXPECT_EQ(
      expect_each_key_once(b) + static_cast<std::size_t>(k.sum("kdedup_records_duplicate_total")),
      static_cast<std::size_t>(total));
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

/// A 10 s window, a filter of `type` at fpp 1% with the default capacity
/// hint, and a state dir in `dir` with snapshots only at stop.
std::string with_state(const TempDir& dir, const std::string& type = "timer") {
  return "window: 10s\nfilter:\n  type: " + type +
         "\n  fpp: 0.01\n  capacity: 1000000\n"
         "state:\n  dir: \"" +
         dir.file("state") + "\"\n  snapshot_interval: 1h\n";
}

/// A restored instance `k` is sent `again`: records the stopped instance
/// took, stamped as then, within the window of the clock it stopped at. It
/// restored the snapshot unrefused; every record delivered before is
/// dropped, and only those the stopped instance dropped (false positives,
/// new to Definition 4: `first_duplicates` of the `taken` records it took)
/// may be emitted now. Everything the stopped instance did not judge a
/// duplicate was emitted (checked by the watermarks: the test broker keeps
/// only the last few MiB of a partition).
void expect_restored_drops(TestBroker& b, Instance& k, const std::vector<TestRecord>& again,
                           double taken, double first_duplicates) {
  auto before = b.watermarks("out");
  ASSERT_TRUE(before && before->size() == 1);
  EXPECT_EQ(before->front().high, taken - first_duplicates);
  ASSERT_TRUE(k.wait_for_sum("kdedup_restores_total", 1, 60s)) << k.log();
  EXPECT_EQ(k.sum("kdedup_snapshot_refusals_total"), 0) << k.log();
  ASSERT_TRUE(b.produce("in", again));
  const auto n = static_cast<double>(again.size());
  ASSERT_TRUE(k.wait_for_sum("kdedup_records_in_total", n, 30s)) << k.log();
  std::this_thread::sleep_for(1500ms);
  auto after = b.watermarks("out");
  ASSERT_TRUE(after && after->size() == 1);
  const double emitted = static_cast<double>(after->front().high - before->front().high);
  EXPECT_EQ(k.sum("kdedup_records_duplicate_total") + emitted, n);
  EXPECT_LE(emitted, first_duplicates);
}

// A burst, then a trickle over two windows, twice; the instance stops at
// the second burst's peak and the next one restores that snapshot. The
// compact filter's burst is larger: its tables take about a sixth of the
// timer filter's bytes per identity.
class BurstShrinks : public ::testing::TestWithParam<std::string> {};

TEST_P(BurstShrinks, AfterwardsAndSoDoesItsRestoredSnapshot) {
  const std::string& type = GetParam();
  const int burst = type == "compact" ? 200'000 : 40'000;
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  const std::string config = with_state(dir, type);
  auto trickle = [&](const std::string& prefix, int seconds) {
    for (int i = 0; i < seconds * 4; ++i) {
      if (!b.produce("in", keys(prefix, i * 10, i * 10 + 10))) return false;
      std::this_thread::sleep_for(250ms);
    }
    return true;
  };
  double peak = 0;
  std::int64_t burst_b_at = 0;
  {
    Instance k(dir, "first", b.bootstrap(), config);
    ASSERT_TRUE(k.wait_for_sum("kdedup_consumer_assigned_partitions", 1, 60s)) << k.log();
    const double floor = k.sum("kdedup_filter_bytes");
    // A burst grows the filter...
    ASSERT_TRUE(b.produce("in", keys("burst-a-", 0, burst)));
    ASSERT_TRUE(k.wait_for_sum("kdedup_records_in_total", burst, 60s));
    std::this_thread::sleep_for(1500ms);
    peak = k.sum("kdedup_filter_bytes");
    EXPECT_GT(peak, 4 * floor);
    // ... and a trickle over two windows (40 ids/s) gives it back.
    ASSERT_TRUE(trickle("trickle-a-", 22));
    std::this_thread::sleep_for(1500ms);
    EXPECT_LT(k.sum("kdedup_filter_bytes"), peak / 4) << k.log();

    // A second burst; the instance stops at its peak (the snapshot at stop
    // holds the grown filter).
    burst_b_at = wall_ms();
    ASSERT_TRUE(b.produce("in", keys("burst-b-", 0, burst, burst_b_at)));
    ASSERT_TRUE(k.wait_for_sum("kdedup_records_in_total", burst + 22 * 4 * 10 + burst, 60s));
    std::this_thread::sleep_for(1500ms);
    peak = k.sum("kdedup_filter_bytes");
    k.process().signal(SIGTERM);
    ASSERT_EQ(k.process().wait(30s), 0) << k.log();
  }
  Instance k(dir, "second", b.bootstrap(), config);
  ASSERT_TRUE(k.wait_for_sum("kdedup_restores_total", 1, 60s)) << k.log();
  // The burst's identities, sent again within the window (event time: the
  // partition clock is where the snapshot left it): all dropped.
  ASSERT_TRUE(b.produce("in", keys("burst-b-", 0, 2'000, burst_b_at)));
  ASSERT_TRUE(k.wait_for_sum("kdedup_records_duplicate_total", 2'000, 30s)) << k.log();
  EXPECT_GT(k.sum("kdedup_filter_bytes"), peak / 2);  // restored as it was
  // The restored filter shrinks as the clock moves on.
  ASSERT_TRUE(trickle("trickle-b-", 22));
  std::this_thread::sleep_for(1500ms);
  EXPECT_LT(k.sum("kdedup_filter_bytes"), peak / 4) << k.log();
  expect_each_key_once(b);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

INSTANTIATE_TEST_SUITE_P(RunMemory, BurstShrinks, ::testing::Values("timer", "compact"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

/// Sends `high`, then `low` (the rate of new identities falls by less than
/// half) to a new instance `k`; the timer filter shrinks in place: one
/// sub-filter, under 0.85x the bytes it held at the fall. Returns the bytes
/// after the fall.
double fall_and_shrink(TestBroker& b, Instance& k, const std::vector<TestRecord>& high,
                       const std::vector<TestRecord>& low) {
  auto took = [&](std::size_t n) {
    return k.wait_for_sum("kdedup_records_in_total", static_cast<double>(n), 60s);
  };
  EXPECT_TRUE(k.wait_for_sum("kdedup_consumer_assigned_partitions", 1, 60s)) << k.log();
  if (!b.produce("in", high) || !took(high.size())) {
    ADD_FAILURE() << "the first rate was not taken: " << k.log();
    return 0;
  }
  std::this_thread::sleep_for(1500ms);
  const double at_fall = k.sum("kdedup_filter_bytes");
  if (!b.produce("in", low) || !took(high.size() + low.size())) {
    ADD_FAILURE() << "the second rate was not taken: " << k.log();
    return 0;
  }
  std::this_thread::sleep_for(1500ms);
  const double shrunk = k.sum("kdedup_filter_bytes");
  EXPECT_EQ(k.sum("kdedup_filter_subfilters"), 1);
  EXPECT_LT(shrunk, 0.85 * at_fall) << shrunk << " bytes after the fall, " << at_fall << " at it";
  return shrunk;
}

/// A test broker with one input and one output partition, a state dir, and
/// the schedule of a fall: 2,000 new identities a second for two 10 s
/// windows, then 1,400 for three, stamped on a schedule that ended a minute
/// ago (event time: the partition's clock and the filter's rate follow the
/// stamps, not the test's pace).
class RateFall : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
    ASSERT_TRUE(started) << started.error().message;
    broker_ = std::move(*started);
  }
  TestBroker& b() { return *broker_; }

  TempDir dir;
  const std::string config = with_state(dir);
  const std::int64_t t0 = wall_ms() - 120'000;
  const std::vector<TestRecord> high = stamped("high-", 2'000, t0, 20);
  const std::vector<TestRecord> low = stamped("low-", 1'400, t0 + 20'000, 30);

 private:
  std::unique_ptr<TestBroker> broker_;
};

TEST_F(RateFall, ByLessThanHalfShrinksInPlaceAndItsSnapshotRestoresShrunk) {
  // A fall by 30%, which no fold by an integer factor fits. The timer
  // filter shrinks in place (it kept the sub-filter sized for 2,000 a
  // second before); the snapshot at stop holds the shrunk filter, which the
  // next instance restores and which still drops the identities sent again
  // within the window.
  TestBroker& b = this->b();
  double shrunk = 0, first_duplicates = 0;
  {
    Instance k(dir, "first", b.bootstrap(), config);
    shrunk = fall_and_shrink(b, k, high, low);
    if (shrunk <= 0) return;  // a rate was not taken (reported)
    // False positives within the target (every key is new).
    first_duplicates = k.sum("kdedup_records_duplicate_total");
    EXPECT_LE(first_duplicates, 0.012 * 82'000);
    k.process().signal(SIGTERM);
    ASSERT_EQ(k.process().wait(30s), 0) << k.log();
  }
  Instance k(dir, "second", b.bootstrap(), config);
  // The last two seconds' identities again, as stamped before.
  expect_restored_drops(b, k, {low.end() - 2'800, low.end()}, 82'000, first_duplicates);
  EXPECT_LE(k.sum("kdedup_filter_bytes"), shrunk);  // restored shrunk
  expect_each_key_once(b);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

TEST_F(RateFall, ThenAClimbGrowsTheShrunkFilterInPlaceAndItRestoresWithItsCopiesAlive) {
  // The fall (the timer filter shrinks in place), then 2,800 new
  // identities a second for five seconds. The shrunk sub-filter grows in
  // place, keeping its shape: each line is copied into m lines
  // (docs/performance.md, "Growth in place"), where it was sealed beside a
  // new sub-filter before.
  // The instance stops within a window of that, so its snapshot holds the
  // copies still alive (timer state format 3 on). The next instance restores
  // it unrefused and as large, drops every identity of the window sent
  // again (those from before the expansion are found through the copies),
  // and takes new identities into the same sub-filter.
  TestBroker& b = this->b();
  const auto climb = stamped("climb-", 2'800, t0 + 50'000, 5);
  double shrunk = 0, grown = 0, first_duplicates = 0;
  {
    Instance k(dir, "first", b.bootstrap(), config);
    shrunk = fall_and_shrink(b, k, high, low);
    if (shrunk <= 0) return;  // a rate was not taken (reported)
    ASSERT_TRUE(b.produce("in", climb));
    ASSERT_TRUE(k.wait_for_sum("kdedup_records_in_total", 96'000, 60s));
    // Copied into at least twice its lines (the window's counts are not
    // copied), and not sealed. The gauges follow within a few seconds of
    // the last batch (metrics are published once a second).
    EXPECT_TRUE(k.wait_for([&] { return k.sum("kdedup_filter_bytes") > 1.9 * shrunk; }, 10s))
        << k.sum("kdedup_filter_bytes") << " bytes after the climb, " << shrunk << " before";
    std::this_thread::sleep_for(1500ms);
    grown = k.sum("kdedup_filter_bytes");
    std::printf("bytes shrunk %.0f, grown in place %.0f\n", shrunk, grown);
    EXPECT_EQ(k.sum("kdedup_filter_subfilters"), 1) << k.log();
    first_duplicates = k.sum("kdedup_records_duplicate_total");
    EXPECT_LE(first_duplicates, 0.012 * 96'000);  // every key is new
    k.process().signal(SIGTERM);
    ASSERT_EQ(k.process().wait(30s), 0) << k.log();
  }
  Instance k(dir, "second", b.bootstrap(), config);
  // The last two seconds before the climb (held in the copies) and the
  // climb, as stamped before.
  std::vector<TestRecord> again(low.end() - 2'800, low.end());
  again.insert(again.end(), climb.begin(), climb.end());
  expect_restored_drops(b, k, again, 96'000, first_duplicates);
  EXPECT_EQ(k.sum("kdedup_filter_bytes"), grown);  // restored as it was
  // New identities after the restore, on from where the climb stopped: the
  // restored sub-filter takes them (false positives on this small a sample
  // within twice the target).
  const double dropped = k.sum("kdedup_records_duplicate_total");
  const auto more = stamped("more-", 2'800, t0 + 55'000, 2);
  ASSERT_TRUE(b.produce("in", more));
  const double in = static_cast<double>(again.size() + more.size());
  ASSERT_TRUE(k.wait_for_sum("kdedup_records_in_total", in, 30s)) << k.log();
  EXPECT_LE(k.sum("kdedup_records_duplicate_total") - dropped, 0.02 * 5'600);
  EXPECT_EQ(k.sum("kdedup_filter_subfilters"), 1) << k.log();
  expect_each_key_once(b);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

/// The stamps of the records of `records` (in stamp order) an exact filter
/// delivers with a window of `window_ms`: each one unless its key was
/// delivered less than a window before.
std::vector<std::int64_t> delivered_stamps(const std::vector<TestRecord>& records,
                                           std::int64_t window_ms) {
  std::map<std::string, std::int64_t> last;
  std::vector<std::int64_t> delivered;
  for (const TestRecord& r : records) {
    auto [at, fresh] = last.try_emplace(*r.key, r.timestamp_ms);
    if (!fresh && r.timestamp_ms - at->second < window_ms) continue;
    at->second = r.timestamp_ms;
    delivered.push_back(r.timestamp_ms);
  }
  return delivered;
}

/// Bytes of the timer filter `kdedup run` builds at fpp 1% (8-bit timers,
/// their default ticks a window), pre-sized for `ids` identities a window.
double presized_run_timer_bytes(std::uint64_t ids) {
  filter::FilterConfig c;
  c.type = filter::FilterType::kTimer;
  c.fpp = 0.01;
  c.capacity = ids;
  auto normalized = filter::normalize(c);
  EXPECT_TRUE(normalized) << normalized.error().message;
  return static_cast<double>(
      (*filter::TimerFilter::create_presized(*normalized))->presized_bytes());
}

TEST(RunMemory, ABurstOfRepeatsGrowsTheTimerFilterOnceWithinTwiceWhatItsPeakNeeds) {
  // family_bench's uniform 5x burst of repeats at a tenth of its size:
  // 19,660 draws a 10 s window from a domain of as many identities, 5x as
  // often in the middle third of six windows, as keyed records stamped on
  // the stream's ticks, through `kdedup run` with the default timer filter
  // (8-bit timers). Produced half a window of event time at a time; after
  // each half is taken, the filter's bytes (its clock follows the stamps:
  // what the filter holds at that point of the stream, however fast the
  // instance runs). At a tenth of family_bench's size the burst expanded
  // the filter by 2 twice (2.75x in the library); now once, one sub-filter
  // throughout (never sealed beside a new one), at most 2x the pre-sized
  // figure for the most identities a window delivers, and back within 1.5x
  // of the pre-sized figure after the burst. No false negative (every
  // record audited), false positives within 1.2x the target, every record
  // emitted or counted a duplicate.
  KDEDUP_FIGURES_TEST();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  testing::StreamSpec spec;
  spec.base_rate = 4.8;
  spec.domain = static_cast<std::uint64_t>(spec.base_rate * testing::kFineTicksPerWindow);
  spec.ticks = 6 * testing::kFineTicksPerWindow;
  spec.burst_factor = 5;
  spec.seed = 7;
  const std::int64_t t0 = wall_ms() - 120'000;
  std::vector<TestRecord> records;
  testing::EventStream events(spec);
  for (testing::Event e; events.next(e);) {
    TestRecord r;
    r.key = "u-" + std::to_string(e.fp.lo >> 2);
    r.value = "v";
    r.timestamp_ms = t0 + static_cast<std::int64_t>(e.tick) * 10'000 /
                              static_cast<std::int64_t>(testing::kFineTicksPerWindow);
    records.push_back(std::move(r));
  }
  Instance k(dir, "repeats", b.bootstrap(),
             "window: 10s\nfilter:\n  type: timer\n  fpp: 0.01\nstate:\n  dir: \"\"\n",
             "  audit_sample: 1\n");
  ASSERT_TRUE(k.wait_for_sum("kdedup_consumer_assigned_partitions", 1, 60s)) << k.log();
  double peak = 0, most_subfilters = 0, last = 0;
  std::size_t sent = 0;
  for (int half = 1; half <= 12; ++half) {
    const std::int64_t until = t0 + half * 5'000LL;
    std::vector<TestRecord> part;
    while (sent < records.size() && records[sent].timestamp_ms < until) {
      part.push_back(records[sent++]);
    }
    ASSERT_TRUE(b.produce("in", part));
    ASSERT_TRUE(k.wait_for_sum("kdedup_records_in_total", static_cast<double>(sent), 60s))
        << k.log();
    std::this_thread::sleep_for(1200ms);  // the metrics are published once a second
    last = k.sum("kdedup_filter_bytes");
    // From the end of the first window on (its probes drain through it).
    if (half <= 2) continue;
    peak = std::max(peak, last);
    most_subfilters = std::max(most_subfilters, k.sum("kdedup_filter_subfilters"));
  }
  ASSERT_EQ(sent, records.size());
  const std::vector<std::int64_t> delivered = delivered_stamps(records, 10'000);
  const std::size_t most = testing::most_within(delivered, 10'000);
  // What the last window delivers.
  const auto end = static_cast<std::size_t>(std::count_if(
      delivered.begin(), delivered.end(), [&](std::int64_t ts) { return ts >= t0 + 50'000; }));
  const double presized = presized_run_timer_bytes(most);
  std::printf("peak %.0f bytes: %.2fx the pre-sized figure for %zu; end %.2fx for %zu\n", peak,
              peak / presized, most, last / presized_run_timer_bytes(end), end);
  EXPECT_GT(peak, presized) << "the burst must grow the filter";
  // A rebuild along the burst (a rebalance hands the partition back without
  // a state dir) grows a filter from the floor again: up to 3.9x in the
  // library (docs/performance.md, "A rebuild along a burst of repeats").
  // Said with the figure, so that a failure tells the two apart.
  EXPECT_LE(peak, 2.0 * presized) << peak / presized << "x, after "
                                  << k.sum("kdedup_consumer_rebalances_total")
                                  << " rebalance(s) and " << k.sum("kdedup_rebuilds_total")
                                  << " rebuild(s)\n"
                                  << k.log();
  EXPECT_EQ(most_subfilters, 1) << "a sub-filter was sealed beside a new one";
  EXPECT_LE(last, 1.5 * presized_run_timer_bytes(end)) << last << " bytes at the end";
  EXPECT_EQ(k.sum("kdedup_audit_false_negatives_total"), 0);
  const double fp = k.sum("kdedup_audit_false_positives_total");
  const double fresh = k.sum("kdedup_audit_truly_new_total");
  EXPECT_LE(fp, 1.2 * 0.01 * fresh) << fp << " / " << fresh;
  auto out = b.watermarks("out");
  ASSERT_TRUE(out && out->size() == 1);
  EXPECT_EQ(static_cast<double>(out->front().high) + k.sum("kdedup_records_duplicate_total"),
            static_cast<double>(records.size()));
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

}  // namespace
}  // namespace kdedup::testing
