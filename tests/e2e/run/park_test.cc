// Parking, through `kdedup run` on the test broker as a user runs it
// (`state.park_after`, DESIGN.md "Memory follows load"): a partition that
// went quiet frees its filter once its snapshot holds it as it stands, and
// reads it back before its next record:
// - the first record after parking, a copy of the last one delivered, is
//   dropped, and so is every identity delivered before; new ones go out;
// - 256 partitions that went quiet after a burst give back all their
//   filters' memory, and each one drops the burst's copies afterwards;
// - a parked partition survives a stop: the next start restores it;
// - the window's edge holds to the millisecond across parking (a 10 s
//   window: the read-back filter expires what the window left);
// - a thousand partitions that have had no record are parked from their
//   assignment on without a snapshot (and without a state dir), and each
//   makes its filter for its first record; so does a partition rebuilt
//   from the window's input, for the replay's first record, also when a
//   window shorter than the test starts the replay mid-stream;
// - `park_after: 0` never parks, nor does the largest value.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <numeric>
#include <set>
#include <string>

#include "broker.h"
#include "instance.h"
#include "kdedup/filter/tick_scale.h"
#include "process.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

/// A 1 h window unless told (every record of most tests stays in it),
/// snapshots every second, parking after `park_after` of wall time without
/// records. `type` "timer+confirm": a timer filter in confirmed mode.
std::string parking(const TempDir& dir, std::string type, const std::string& park_after,
                    const std::string& window = "1h") {
  const std::string confirm = "+confirm";
  const bool confirmed = type.size() > confirm.size() && type.ends_with(confirm);
  if (confirmed) type.resize(type.size() - confirm.size());
  return "window: " + window + "\nfilter:\n  type: " + type +
         (confirmed ? "\n  confirm_store: true" : "") + "\n  fpp: 0.01\nstate:\n  dir: \"" +
         dir.file("state") + "\"\n  snapshot_interval: 1s\n  park_after: " + park_after + "\n";
}

bool took(Instance& k, std::size_t n, std::chrono::seconds limit = 60s) {
  return k.wait_for_sum("kdedup_records_in_total", static_cast<double>(n), limit);
}

bool assigned(Instance& k, double partitions) {
  return k.wait_for_sum("kdedup_consumer_assigned_partitions", partitions, 120s);
}

bool duplicates_reach(Instance& k, double n) {
  return k.wait_for_sum("kdedup_records_duplicate_total", n, 10s);
}

bool parked(Instance& k, double partitions, std::chrono::seconds limit = 60s) {
  return k.wait_for_sum("kdedup_filter_parked", partitions, limit);
}

/// Waits until the records taken are `n`, then reads the duplicates.
double duplicates_once_taken(Instance& k, std::size_t n) {
  if (!took(k, n)) return -1;
  std::this_thread::sleep_for(1500ms);  // the last counts of the batch
  return k.sum("kdedup_records_duplicate_total");
}

/// A first instance of `config` takes `records` and stops cleanly, parked
/// first when `park` (its snapshot then holds the filter). Returns the
/// records it dropped (false positives), or -1 when a step failed.
double take_then_stop(TempDir& dir, TestBroker& b, const std::string& config,
                      const std::vector<TestRecord>& records, bool park) {
  Instance k(dir, "first", b.bootstrap(), config);
  if (!assigned(k, 1) || !b.produce("in", records)) {
    ADD_FAILURE() << k.log();
    return -1;
  }
  const double dropped = duplicates_once_taken(k, records.size());
  if (dropped < 0 || (park && !parked(k, 1))) {
    ADD_FAILURE() << k.log();
    return -1;
  }
  k.process().signal(SIGTERM);
  if (k.process().wait(30s) != 0) {
    ADD_FAILURE() << k.log();
    return -1;
  }
  return dropped;
}

class Park : public ::testing::TestWithParam<std::string> {};

TEST_P(Park, AQuietPartitionFreesItsFilterAndReadsItBackForItsNextRecord) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance k(dir, "park", b.bootstrap(), parking(dir, GetParam(), "2s"));
  ASSERT_TRUE(assigned(k, 1)) << k.log();
  const std::int64_t at = wall_ms();
  const auto first = keys("first-", 0, 20'000, at);
  ASSERT_TRUE(b.produce("in", first));
  // False positives among new identities (fpp 1%): not emitted, and never
  // emitted later either.
  const double dropped = duplicates_once_taken(k, first.size());
  ASSERT_GE(dropped, 0) << k.log();
  EXPECT_LE(dropped, 3 * 0.01 * 20'000);
  EXPECT_GT(k.sum("kdedup_filter_bytes"), 0);
  EXPECT_EQ(k.sum("kdedup_filter_parked"), 0) << "parked before the quiet spell";

  // Quiet: the snapshot is written, then the filter goes.
  ASSERT_TRUE(parked(k, 1)) << k.log();
  // Its snapshot covers everything it processed: never stale while quiet.
  std::this_thread::sleep_for(4s);
  EXPECT_LT(static_cast<double>(wall_ms()) / 1e3 -
                k.sum("kdedup_snapshot_last_success_timestamp_seconds"),
            2.5);
  EXPECT_EQ(k.sum("kdedup_filter_bytes"), 0);
  EXPECT_EQ(k.sum("kdedup_memory_used_bytes"), 0);
  // Parked from its assignment on (no record yet), its first record made
  // the filter: one unpark so far.
  EXPECT_EQ(k.sum("kdedup_filter_unparks_total"), 1);

  // The first record after parking: a copy of the last one delivered.
  ASSERT_TRUE(b.produce("in", keys("first-", 19'999, 20'000, at)));
  ASSERT_TRUE(took(k, first.size() + 1)) << k.log();
  EXPECT_EQ(k.sum("kdedup_filter_parked"), 0);
  EXPECT_EQ(k.sum("kdedup_filter_unparks_total"), 2);
  EXPECT_TRUE(duplicates_reach(k, dropped + 1)) << k.log();

  // Every identity delivered before is still known; new ones go out.
  auto again = keys("first-", 0, 19'999, at);
  const auto fresh = keys("fresh-", 0, 1'000, at);
  again.insert(again.end(), fresh.begin(), fresh.end());
  ASSERT_TRUE(b.produce("in", again));
  const double now_dropped = duplicates_once_taken(k, first.size() + 1 + again.size());
  const double fresh_dropped = now_dropped - dropped - 20'000;
  EXPECT_GE(fresh_dropped, 0) << "a copy of an earlier identity went out";
  EXPECT_LE(fresh_dropped, 3 * 0.01 * 1'000);
  EXPECT_EQ(static_cast<double>(expect_each_key_once(b)), 21'000 - dropped - fresh_dropped);
  EXPECT_GT(k.sum("kdedup_filter_bytes"), 0);

  // Quiet again: it parks again.
  EXPECT_TRUE(parked(k, 1)) << k.log();
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

TEST_P(Park, AParkedPartitionIsRestoredByTheNextStart) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  const std::string config = parking(dir, GetParam(), "1s");
  const std::int64_t at = wall_ms();
  const auto first = keys("first-", 0, 5'000, at);
  const double dropped = take_then_stop(dir, b, config, first, true);
  ASSERT_GE(dropped, 0);
  Instance k(dir, "second", b.bootstrap(), config);
  ASSERT_TRUE(k.wait_for_sum("kdedup_restores_total", 1, 60s)) << k.log();
  EXPECT_EQ(k.sum("kdedup_snapshot_refusals_total"), 0) << k.log();
  ASSERT_TRUE(b.produce("in", first));
  ASSERT_TRUE(took(k, first.size())) << k.log();
  EXPECT_TRUE(duplicates_reach(k, static_cast<double>(first.size()))) << k.log();
  EXPECT_EQ(static_cast<double>(expect_each_key_once(b)), 5'000 - dropped);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

TEST_P(Park, TheWindowEdgeHoldsToTheMillisecondAcrossParking) {
  // A 10 s window in event time, in the past (no timestamp is capped):
  // an identity delivered at t is a duplicate at t + 1 ms, t + window - 1 ms
  // and t + window, and forgotten by t + window + one tick. The repeats come
  // to a parked partition, the last one after it parked again, so the
  // read-back filter's clock moves past the window and expires its entries.
  const bool compact = GetParam() == "compact";
  const std::int64_t window = 10'000;
  const std::int64_t tick = filter::TickScale(window, compact ? 10 : 192).tick_ms_ceil();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance k(dir, "edge", b.bootstrap(), parking(dir, GetParam(), "1s", "10s"));
  ASSERT_TRUE(assigned(k, 1)) << k.log();
  const std::int64_t t = wall_ms() - 60'000;
  auto record = [](const std::string& key, std::int64_t ts) {
    return TestRecord{.key = key, .value = key + "@" + std::to_string(ts), .timestamp_ms = ts};
  };
  ASSERT_TRUE(
      b.produce("in", {record("e-0", t), record("e-1", t), record("e-2", t), record("e-3", t)}));
  ASSERT_TRUE(took(k, 4)) << k.log();
  ASSERT_TRUE(parked(k, 1)) << k.log();
  const std::vector<TestRecord> inside = {record("e-0", t + 1), record("e-1", t + window - 1),
                                          record("e-2", t + window)};
  ASSERT_TRUE(b.produce("in", inside));
  ASSERT_TRUE(took(k, 7)) << k.log();
  EXPECT_TRUE(duplicates_reach(k, 3)) << "a repeat inside the window went out after parking";
  ASSERT_TRUE(parked(k, 1)) << k.log();
  const TestRecord past = record("e-3", t + window + tick);
  ASSERT_TRUE(b.produce("in", {past}));
  ASSERT_TRUE(took(k, 8)) << k.log();
  EXPECT_TRUE(k.wait_for_sum("kdedup_records_distinct_total", 5, 10s))
      << "the repeat past the window and a tick was not emitted";
  // The first records made the filter, the next two read it back.
  EXPECT_EQ(k.sum("kdedup_filter_unparks_total"), 3);
  auto out = b.read_topic("out");
  ASSERT_TRUE(out) << out.error().message;
  std::set<std::string> values;
  for (const auto& r : *out) values.insert(r.value);
  for (const auto& r : inside) EXPECT_FALSE(values.count(r.value)) << r.value;
  EXPECT_TRUE(values.count(past.value)) << past.value;
  EXPECT_EQ(out->size(), 5U);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

INSTANTIATE_TEST_SUITE_P(RunPark, Park, ::testing::Values("timer", "compact", "timer+confirm"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = p.param;
                           std::replace(name.begin(), name.end(), '+', '_');
                           return name;
                         });

TEST(RunPark, TwoHundredFiftySixQuietPartitionsGiveBackTheirFiltersAndEachReadsItsBack) {
  // A burst of about 1,000 new identities a partition, then silence: every
  // partition parks, the filters' memory goes to nothing, and each one
  // drops the burst's copies sent afterwards (one unpark each).
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:256", "out:256"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance k(dir, "many", b.bootstrap(), parking(dir, "timer", "2s"));
  ASSERT_TRUE(assigned(k, 256)) << k.log();
  const std::int64_t at = wall_ms();
  const auto burst = keys("burst-", 0, 256'000, at);
  ASSERT_TRUE(b.produce("in", burst));
  ASSERT_TRUE(took(k, burst.size(), 120s)) << k.log();
  std::this_thread::sleep_for(1500ms);
  const double dropped = k.sum("kdedup_records_duplicate_total");
  const double busy = k.sum("kdedup_filter_bytes");
  // Read after the bytes: a partition whose records came first may have
  // parked already (park_after 2 s; on a loaded machine the burst takes
  // longer than that to go through), and one that parks between the two
  // readings is counted here, never missing from both.
  const double parked_busy = k.sum("kdedup_filter_parked");
  const double used = k.sum("kdedup_memory_used_bytes");
  const double rss_busy = rss_bytes(k.pid());
  ASSERT_TRUE(parked(k, 256, 120s)) << k.log();
  std::this_thread::sleep_for(1500ms);
  const double rss = rss_bytes(k.pid());
  std::printf(
      "256 partitions: filters %.0f KiB (memory used %.0f KiB) busy, %.0f KiB parked; "
      "RSS %.0f MiB busy, %.0f MiB parked\n",
      busy / 1024, used / 1024, k.sum("kdedup_filter_bytes") / 1024, rss_busy / (1 << 20),
      rss / (1 << 20));
  EXPECT_LT(parked_busy, 256) << "no partition was busy when read";
  EXPECT_GT(busy, (256 - parked_busy) * 64 * 1024.0)
      << "every partition not parked holds at least its floor while busy (" << parked_busy
      << " parked)";
  EXPECT_EQ(k.sum("kdedup_filter_bytes"), 0);
  EXPECT_EQ(k.sum("kdedup_memory_used_bytes"), 0);
  // The RSS is printed, not compared: jemalloc's background thread hands
  // the burst's buffers back meanwhile, and the snapshot writes grow
  // RocksDB's memtables, both by more than these 16 MiB of filters. The
  // 1,024-partition test below checks that parked floors leave the process.

  // Every identity sent again (stamped as before): each partition reads
  // its filter back once and drops them all.
  ASSERT_TRUE(b.produce("in", burst));
  ASSERT_TRUE(took(k, 2 * burst.size(), 120s)) << k.log();
  EXPECT_EQ(k.sum("kdedup_filter_parked"), 0);
  // Each partition made its filter at its first record (it had none from
  // its assignment on) and read it back at its second burst.
  EXPECT_EQ(k.sum("kdedup_filter_unparks_total"), 2 * 256);
  EXPECT_TRUE(duplicates_reach(k, dropped + static_cast<double>(burst.size()))) << k.log();
  EXPECT_EQ(static_cast<double>(expect_each_key_once(b)),
            static_cast<double>(burst.size()) - dropped);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

/// `per_partition` records for each of `partitions` partitions, keys
/// "p<partition>-<i>", stamped `at`.
std::vector<TestRecord> on_every_partition(int partitions, int per_partition, std::int64_t at) {
  std::vector<TestRecord> out;
  for (int p = 0; p < partitions; ++p) {
    for (int i = 0; i < per_partition; ++i) {
      TestRecord r;
      r.key = "p" + std::to_string(p) + "-" + std::to_string(i);
      r.value = "v";
      r.timestamp_ms = at;
      r.partition = p;
      out.push_back(std::move(r));
    }
  }
  return out;
}

TEST(RunPark, AThousandPartitionsThatHaveHadNoRecordHoldNoFilterUntilTheirFirstRecord) {
  // 1,024 partitions assigned, no record: each is parked from its
  // assignment on, long before park_after (15 s), and holds no filter; no
  // snapshot is written (an empty filter is made anew). The first records
  // make each one's filter; once snapshots hold them they park again, and
  // the same records sent again are each read back and dropped.
  constexpr int kPartitions = 1024;
  const std::string n = std::to_string(kPartitions);
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:" + n, "out:" + n}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance k(dir, "thousand", b.bootstrap(), parking(dir, "timer", "15s"));
  ASSERT_TRUE(assigned(k, kPartitions)) << k.log();
  const auto assigned_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(parked(k, kPartitions, 8s))
      << "partitions without records held a filter until park_after\n"
      << k.log();
  std::printf(
      "%d partitions without records: all parked %.1f s after the assignment, RSS %.0f MiB\n",
      kPartitions,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - assigned_at).count(),
      rss_bytes(k.pid()) / (1 << 20));
  EXPECT_EQ(k.sum("kdedup_filter_bytes"), 0);
  EXPECT_EQ(k.sum("kdedup_memory_used_bytes"), 0);
  EXPECT_EQ(k.sum("kdedup_snapshots_total"), 0) << "nothing to snapshot: no record came";

  const auto records = on_every_partition(kPartitions, 4, wall_ms());
  ASSERT_TRUE(b.produce("in", records));
  ASSERT_TRUE(took(k, records.size(), 120s)) << k.log();
  EXPECT_TRUE(k.wait_for_sum("kdedup_filter_unparks_total", kPartitions, 10s));
  EXPECT_TRUE(k.wait_for_sum("kdedup_records_distinct_total", records.size(), 10s))
      << "a new filter for each partition's first records: all four distinct";
  EXPECT_EQ(k.sum("kdedup_filter_parked"), 0);

  // Snapshots now hold the filters: they park again and are read back.
  ASSERT_TRUE(parked(k, kPartitions, 90s)) << k.log();
  EXPECT_GE(k.sum("kdedup_snapshots_total"), kPartitions);
  ASSERT_TRUE(b.produce("in", records));
  ASSERT_TRUE(took(k, 2 * records.size(), 120s)) << k.log();
  EXPECT_TRUE(k.wait_for_sum("kdedup_filter_unparks_total", 2 * kPartitions, 10s));
  EXPECT_TRUE(duplicates_reach(k, static_cast<double>(records.size()))) << k.log();
  EXPECT_EQ(expect_each_key_once(b), records.size());
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

TEST(RunPark, WithoutAStateDirOnlyPartitionsThatHaveHadNoRecordPark) {
  // No snapshots to read a filter back from: a partition that took
  // records keeps its filter; one that took none parks, and its first
  // record, later, makes it anew. The start-up warns that park_after acts
  // on the second kind only.
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:8", "out:8"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance k(dir, "nodir", b.bootstrap(),
             "window: 1h\nfilter:\n  type: timer\n  fpp: 0.01\nstate:\n  dir: \"\"\n"
             "  park_after: 2s\n");
  ASSERT_TRUE(assigned(k, 8)) << k.log();
  auto busy = on_every_partition(4, 100, wall_ms());  // partitions 0-3
  ASSERT_TRUE(b.produce("in", busy));
  ASSERT_TRUE(took(k, busy.size())) << k.log();
  ASSERT_TRUE(parked(k, 4)) << k.log();
  std::this_thread::sleep_for(4s);  // twice park_after more: the busy four stay
  EXPECT_EQ(k.sum("kdedup_filter_parked"), 4);
  EXPECT_GE(k.sum("kdedup_filter_bytes"), 4 * 65536.0);
  EXPECT_NE(k.log().find("parks only partitions that have had no record"), std::string::npos)
      << k.log();

  // Every partition's records again, and partition 7's first: the busy
  // four drop theirs, the parked ones make a new filter.
  auto again = busy;
  TestRecord first;
  first.key = "p7-first";
  first.value = "v";
  first.timestamp_ms = wall_ms();
  first.partition = 7;
  again.push_back(first);
  ASSERT_TRUE(b.produce("in", again));
  ASSERT_TRUE(took(k, busy.size() + again.size())) << k.log();
  EXPECT_TRUE(duplicates_reach(k, static_cast<double>(busy.size())));
  // Each partition's first records made its filter (it had none from its
  // assignment on): the busy four's, then partition 7's.
  EXPECT_TRUE(k.wait_for_sum("kdedup_filter_unparks_total", 5, 10s));
  EXPECT_EQ(expect_each_key_once(b), busy.size() + 1);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

/// No state dir (every start rebuilds from the input), parking after an
/// hour: a `window` window, and `extra` lines of `state`.
std::string rebuilding(const std::string& window, const std::string& extra = "") {
  return "window: " + window +
         "\nfilter:\n  type: timer\n  fpp: 0.01\nstate:\n  dir: \"\"\n  park_after: 1h\n" + extra;
}

/// `k` rebuilds its one partition, replaying at least `replayed` records,
/// and the replay's first record made the filter of a partition parked from
/// its assignment on (one unpark).
void expect_rebuilt_from_parked(Instance& k, double replayed) {
  ASSERT_TRUE(assigned(k, 1)) << k.log();
  ASSERT_TRUE(k.wait_for_sum("kdedup_rebuilds_total", 1, 60s)) << k.log();
  ASSERT_TRUE(
      k.wait_for([&] { return k.sum("kdedup_rebuild_replayed_records_total") >= replayed; }, 60s))
      << k.log();
  EXPECT_EQ(k.sum("kdedup_filter_unparks_total"), 1)
      << "the replay's first record makes the filter of a partition parked from its assignment";
  EXPECT_EQ(k.sum("kdedup_filter_parked"), 0);
}

TEST(RunPark, APartitionRebuiltWithoutASnapshotStartsParkedAndLearnsItsWindowFromTheReplay) {
  // No state dir: the second start rebuilds the partition from the
  // window's input. Nothing is learned from the output alone (every
  // delivery's input is still there), so the partition is parked from its
  // assignment on; the replay's first record makes its filter and the
  // replay fills it: the first instance's records sent again are dropped,
  // new ones go out, each key once.
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  const std::string config = rebuilding("1h");
  const std::int64_t at = wall_ms();
  const auto first = keys("first-", 0, 5'000, at);
  const double dropped = take_then_stop(dir, b, config, first, false);
  ASSERT_GE(dropped, 0);
  Instance k(dir, "second", b.bootstrap(), config);
  expect_rebuilt_from_parked(k, 5'000 - dropped);
  if (HasFatalFailure()) return;
  auto again = first;
  const auto fresh = keys("fresh-", 0, 1'000, at);
  again.insert(again.end(), fresh.begin(), fresh.end());
  ASSERT_TRUE(b.produce("in", again));
  const double now_dropped = duplicates_once_taken(k, again.size());
  ASSERT_GE(now_dropped, 0) << k.log();
  // Every copy of a delivered identity is dropped. The first instance's
  // false positives were never delivered (nor learned by the replay), so
  // their copies are new to it, like the fresh keys: a few of those are
  // false positives again (fpp 1%).
  const double delivered = 5'000 - dropped;
  EXPECT_GE(now_dropped, delivered) << "a copy of a delivered identity went out";
  const double new_dropped = now_dropped - delivered;
  EXPECT_LE(new_dropped, 3 * 0.01 * (1'000 + dropped));
  EXPECT_EQ(static_cast<double>(expect_each_key_once(b)),
            delivered + 1'000 + dropped - new_dropped);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

TEST(RunPark, ARebuildThatStartsMidStreamMakesItsFilterFromTheWindowsRecordsOnly) {
  // A 10 s window, shorter than the test, and no lateness: the second
  // start replays only the records of the last window. The partition is
  // parked from its assignment on and the replay's first record makes its
  // filter; copies of the window's records are dropped, copies of records
  // that left the window (stamped 30 s before) go out again.
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  const std::string config = rebuilding("10s", "  rebuild_lateness: 0s\n");
  const std::int64_t now = wall_ms();
  auto first = keys("old-", 0, 1'000, now - 30'000);
  const auto inside = keys("new-", 0, 1'000, now);
  first.insert(first.end(), inside.begin(), inside.end());
  const double dropped = take_then_stop(dir, b, config, first, false);
  ASSERT_GE(dropped, 0);

  Instance k(dir, "second", b.bootstrap(), config);
  expect_rebuilt_from_parked(k, 1'000 - dropped);
  if (HasFatalFailure()) return;
  std::this_thread::sleep_for(1500ms);  // the replay's last counts
  EXPECT_LT(k.sum("kdedup_rebuild_replayed_records_total"), 1'500)
      << "the replay started before the window";
  auto again = keys("old-", 0, 1'000, now);
  for (auto& r : again) r.value = "again";
  auto copies = keys("new-", 0, 1'000, now);
  for (auto& r : copies) r.value = "again";
  again.insert(again.end(), copies.begin(), copies.end());
  ASSERT_TRUE(b.produce("in", again));
  ASSERT_GE(duplicates_once_taken(k, again.size()), 0) << k.log();
  auto out = b.read_topic("out");
  ASSERT_TRUE(out) << out.error().message;
  std::set<std::string> old_again, new_again;
  for (const auto& r : *out) {
    if (r.value != "again" || !r.key) continue;
    (r.key->starts_with("old-") ? old_again : new_again).insert(*r.key);
  }
  EXPECT_TRUE(new_again.empty()) << new_again.size()
                                 << " copies of records within the window went out";
  // Outside the window now, so new to the filter: all but its false
  // positives (fpp 1%) go out.
  EXPECT_GE(old_again.size(), 970U);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

/// `park_after` 0 turns parking off; the largest value (what int64
/// milliseconds hold) is never reached.
class NeverParks : public ::testing::TestWithParam<std::string> {};

TEST_P(NeverParks, WithParkAfter) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance k(dir, "never", b.bootstrap(), parking(dir, "timer", GetParam()));
  ASSERT_TRUE(assigned(k, 1)) << k.log();
  ASSERT_TRUE(b.produce("in", keys("k-", 0, 1'000)));
  ASSERT_TRUE(took(k, 1'000)) << k.log();
  // Snapshots every second, quiet for five: it would have parked at 1 s.
  std::this_thread::sleep_for(5s);
  EXPECT_EQ(k.sum("kdedup_filter_parked"), 0);
  EXPECT_GT(k.sum("kdedup_filter_bytes"), 0);
  EXPECT_GE(k.sum("kdedup_snapshots_total"), 1);
  k.process().signal(SIGTERM);
  EXPECT_EQ(k.process().wait(30s), 0) << k.log();
}

INSTANTIATE_TEST_SUITE_P(RunPark, NeverParks, ::testing::Values("0", "106751991167d"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return p.param == "0" ? std::string("zero") : std::string("largest");
                         });

}  // namespace
}  // namespace kdedup::testing
