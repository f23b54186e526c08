// Snapshots that must not be used: a corrupted chunk, a snapshot written
// with another filter config, and a snapshot ahead of the group's committed
// offset (a new group on an old state dir). Each is refused, counted, the
// partition rebuilt from Kafka, and the verifier finds the output exact.
// Phase 1 of each test leaves a state dir with one snapshot per partition
// at the committed offset (graceful stop); phase 2 feeds more records that
// repeat phase 1's identities, so a wrong filter would show at once.

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <iostream>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t kVerifyWindowMs = 3'600'000;

struct Scenario {
  std::unique_ptr<TestBroker> broker;
  TempDir dir;
  RunSettings settings;
};

/// Broker with in:4/out:4, and phase 1 done: 2000 records through one
/// instance, stopped gracefully; 4 snapshots checked with inspect.
void phase_one(Scenario& s, const std::string& group) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:4", "out:4", "out2:4", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  s.broker = std::move(*broker);
  s.settings.group = group;
  s.settings.state_dir = s.dir.file("state");
  s.settings.snapshot_interval = "1s";
  Instance first("phase1", s.dir, s.broker->bootstrap(), s.settings);
  auto batch =
      run_batch(*s.broker, first,
                {.partitions = 4, .domain = 800, .per_second = 2000, .seed = 11, .limit = 2000});
  ASSERT_TRUE(batch) << batch.error().message;
  auto inspected = inspect_snapshots(s.settings.state_dir, true);
  ASSERT_EQ(inspected.exit_code, 0) << inspected.text;
  ASSERT_EQ(inspected.snapshots.size(), 4u) << inspected.text;
  auto committed = s.broker->committed(group, "in");
  ASSERT_TRUE(committed);
  for (const auto& snap : inspected.snapshots) {
    EXPECT_EQ(snap.status, "verified") << inspected.text;
    EXPECT_EQ(snap.next_offset, (*committed)[static_cast<std::size_t>(snap.partition)])
        << "a graceful stop snapshots at the committed offset\n"
        << inspected.text;
  }
  std::cout << "phase 1: 4 snapshots at the committed offsets" << std::endl;
}

/// Phase 2: `instance` runs over 1500 more records (same identity domain,
/// other draws); before it stops, the restore/rebuild counters are read.
struct PhaseTwo {
  double restores = -1;
  double rebuilds = -1;
  double replayed = -1;
};
PhaseTwo phase_two(Scenario& s, Instance& instance) {
  PhaseTwo out;
  EXPECT_TRUE(instance.start());
  EXPECT_TRUE(instance.wait_ready(60s)) << instance.log_tail();
  Feeder feeder(s.broker->bootstrap(),
                {.partitions = 4, .domain = 800, .per_second = 2000, .seed = 12, .limit = 1500});
  EXPECT_TRUE(feeder.wait_done(60s));
  EXPECT_TRUE(feeder.stop()) << feeder.error();
  EXPECT_TRUE(wait_committed_to_end(*s.broker, instance.settings().group, "in", 60s))
      << instance.log_tail();
  out.restores = instance.metric("kdedup_restores_total").value_or(0);
  out.rebuilds = instance.metric("kdedup_rebuilds_total").value_or(0);
  out.replayed = instance.metric("kdedup_rebuild_replayed_records_total").value_or(0);
  std::cout << instance.name() << ": restores " << out.restores << ", rebuilds " << out.rebuilds
            << ", replayed " << out.replayed << std::endl;
  EXPECT_EQ(instance.stop(), 0) << instance.log_tail();
  return out;
}

void expect_exact(Scenario& s, const std::string& output = "out") {
  auto report = verify_topics(*s.broker, "in", output, kVerifyWindowMs);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, 3500u);
}

/// Flips one byte in the value of the first chunk stored for `partition`
/// (keys 'c' | topic | partition | id, snapshot_store.h); returns the key's
/// size or 0 when no chunk was found.
std::size_t corrupt_one_chunk(const std::string& state_dir, const std::string& topic) {
  rocksdb::DB* raw = nullptr;
  rocksdb::Options options;
  auto st = rocksdb::DB::Open(options, state_dir, &raw);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return 0;
  std::unique_ptr<rocksdb::DB> db(raw);
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const std::string key = it->key().ToString();
    if (key.empty() || key[0] != 'c' || key.find(topic) == std::string::npos) continue;
    std::string value = it->value().ToString();
    value[value.size() / 2] = static_cast<char>(value[value.size() / 2] ^ 0x5a);
    it.reset();
    rocksdb::WriteOptions w;
    w.sync = true;
    st = db->Put(w, key, value);
    EXPECT_TRUE(st.ok()) << st.ToString();
    st = db->Close();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return key.size();
  }
  return 0;
}

TEST(RecoveryE2E, CorruptChunkIsRefusedAndRebuilt) {
  const auto t0 = std::chrono::steady_clock::now();
  Scenario s;
  ASSERT_NO_FATAL_FAILURE(phase_one(s, "rs-chunk"));
  ASSERT_GT(corrupt_one_chunk(s.settings.state_dir, "in"), 0u) << "no chunk stored";
  auto inspected = inspect_snapshots(s.settings.state_dir, true);
  EXPECT_EQ(inspected.exit_code, 1) << "inspect --verify must see the flipped byte\n"
                                    << inspected.text;
  int corrupt = 0;
  for (const auto& snap : inspected.snapshots) corrupt += snap.status == "corrupt";
  ASSERT_EQ(corrupt, 1) << inspected.text;
  std::cout << "one chunk corrupted; inspect --verify reports it" << std::endl;

  Instance second("phase2", s.dir, s.broker->bootstrap(), s.settings);
  auto counts = phase_two(s, second);
  EXPECT_EQ(counts.rebuilds, 1) << second.log_tail();
  EXPECT_EQ(counts.restores, 3) << second.log_tail();
  {
    auto refusal = line_with_all(second.log(), {"snapshot", "corrupt"});
    EXPECT_TRUE(refusal) << "no line saying the snapshot was refused (corrupt)\n"
                         << second.log_tail();
    std::cout << "refusal: " << refusal.value_or("(none)") << std::endl;
  }
  expect_exact(s);
  std::cout << "CorruptChunkIsRefusedAndRebuilt took " << seconds_since(t0) << " s" << std::endl;
}

TEST(RecoveryE2E, SnapshotOfAnotherFilterConfigIsRefusedAndRebuilt) {
  const auto t0 = std::chrono::steady_clock::now();
  Scenario s;
  ASSERT_NO_FATAL_FAILURE(phase_one(s, "rs-fpp"));
  RunSettings changed = s.settings;
  changed.fpp = 0.0001;
  Instance second("phase2", s.dir, s.broker->bootstrap(), changed);
  auto counts = phase_two(s, second);
  EXPECT_EQ(counts.rebuilds, 4) << second.log_tail();
  EXPECT_EQ(counts.restores, 0) << second.log_tail();
  {
    auto refusal = line_with_all(second.log(), {"snapshot", "config_changed"});
    EXPECT_TRUE(refusal) << "no line saying the snapshot was refused (config)\n"
                         << second.log_tail();
    std::cout << "refusal: " << refusal.value_or("(none)") << std::endl;
  }
  expect_exact(s);
  // The next snapshots carry the new config: a third run restores them all.
  Instance third("phase3", s.dir, s.broker->bootstrap(), changed);
  ASSERT_TRUE(third.start());
  ASSERT_TRUE(third.wait_ready(60s)) << third.log_tail();
  EXPECT_EQ(third.metric("kdedup_restores_total").value_or(0), 4) << third.log_tail();
  EXPECT_EQ(third.stop(), 0) << third.log_tail();
  std::cout << "SnapshotOfAnotherFilterConfigIsRefusedAndRebuilt took " << seconds_since(t0) << " s"
            << std::endl;
}

TEST(RecoveryE2E, SnapshotAheadOfTheCommitIsRefused) {
  const auto t0 = std::chrono::steady_clock::now();
  Scenario s;
  ASSERT_NO_FATAL_FAILURE(phase_one(s, "rs-first-group"));
  // A new group on the same state dir: nothing committed, every snapshot is
  // ahead. Used, it would make the whole input look like duplicates.
  RunSettings fresh = s.settings;
  fresh.group = "rs-other-group";
  fresh.output = "out2";
  fresh.extra_yaml = "";
  Instance second("newgroup", s.dir, s.broker->bootstrap(), fresh);
  ASSERT_TRUE(second.start());
  ASSERT_TRUE(wait_committed_to_end(*s.broker, fresh.group, "in", 60s)) << second.log_tail();
  const double restores = second.metric("kdedup_restores_total").value_or(-1);
  EXPECT_EQ(restores, 0) << second.log_tail();
  {
    auto refusal = line_with_all(second.log(), {"snapshot", "ahead"});
    EXPECT_TRUE(refusal) << "no line saying the snapshot was refused (ahead)\n"
                         << second.log_tail();
    std::cout << "refusal: " << refusal.value_or("(none)") << std::endl;
  }
  EXPECT_EQ(second.stop(), 0) << second.log_tail();
  auto report = verify_topics(*s.broker, "in", "out2", kVerifyWindowMs);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, 2000u);
  std::cout << "SnapshotAheadOfTheCommitIsRefused took " << seconds_since(t0) << " s" << std::endl;
}

}  // namespace
}  // namespace kdedup::testing
