// ConfirmStore against a real RocksDB in a temp dir: lookups of staged and
// stored deliveries, the snapshot protocol (what reaches disk, the binding,
// every refusal), the roll-back of everything past the snapshot after a
// crash, a fresh start, expiry by compaction, and the staging's index.

#include "kdedup/state/confirm_store.h"

#include <gtest/gtest.h>

#include <random>

#include "kdedup/state/snapshot_store.h"
#include "process.h"

namespace kdedup::state {
namespace {

using filter::Fingerprint;
using filter::Tick;
using kdedup::testing::TempDir;

constexpr filter::TickScale kScale(60'000, 64);  // a tick is 937.5 ms
const PartitionKey kKey{"orders", 3};

Fingerprint fp(std::uint64_t i) { return {i * 0x9E3779B97F4A7C15ULL + 1, i ^ 0xABCDEF}; }

ConfirmOptions direct() {
  ConfirmOptions o;
  o.staged = false;
  o.write_ahead_log = false;
  return o;
}

/// The ticks the store holds for fps 0..n-1 (none = absent).
std::vector<std::optional<Tick>> look(ConfirmPartition& p, std::uint64_t n) {
  std::vector<Fingerprint> fps;
  for (std::uint64_t i = 0; i < n; ++i) fps.push_back(fp(i));
  std::vector<std::optional<Tick>> out(n);
  EXPECT_TRUE(p.lookup(fps, out));
  return out;
}

/// Deliveries of fps [from, to) at offsets 100 + i and ticks i / 10.
std::vector<ConfirmWrite> deliveries(std::uint64_t from, std::uint64_t to) {
  std::vector<ConfirmWrite> w;
  for (std::uint64_t i = from; i < to; ++i) {
    w.push_back({fp(i), i / 10, static_cast<std::int64_t>(100 + i)});
  }
  return w;
}

/// What the snapshot store would have written for a snapshot at `offset`.
SnapshotInfo manifest(std::int64_t offset, std::int64_t created_ms) {
  SnapshotInfo info;
  info.key = kKey;
  info.next_offset = offset;
  info.created_ms = created_ms;
  info.fingerprint.tick_scale = kScale.fingerprint();
  return info;
}

TEST(ConfirmStore, DirectModeWritesEachBatchAndFindsIt) {
  TempDir dir;
  auto store = ConfirmStore::open(dir.file("confirm"), direct());
  ASSERT_TRUE(store) << store.error().message;
  auto p = (*store)->attach(kKey, kScale, std::nullopt);
  ASSERT_TRUE(p) << p.error().message;
  ASSERT_TRUE((*p)->record(deliveries(0, 500)));
  EXPECT_EQ((*p)->staged(), 0u);
  const auto found = look(**p, 600);
  for (std::uint64_t i = 0; i < 600; ++i) {
    if (i < 500) {
      ASSERT_EQ(found[i], std::optional<Tick>(i / 10)) << i;
    } else {
      ASSERT_FALSE(found[i]) << i;
    }
  }
  // A later delivery of the same identity replaces the tick.
  ASSERT_TRUE((*p)->record(std::vector<ConfirmWrite>{{fp(7), 900, 2000}}));
  EXPECT_EQ(look(**p, 8)[7], std::optional<Tick>(900));
  EXPECT_GT((*p)->approximate_bytes(), 0u);
}

TEST(ConfirmStore, StagedDeliveriesReachDiskOnlyWithTheSnapshotThatCoversThem) {
  TempDir dir;
  {
    auto store = ConfirmStore::open(dir.file("confirm"));
    ASSERT_TRUE(store) << store.error().message;
    auto p = (*store)->attach(kKey, kScale, std::nullopt);
    ASSERT_TRUE(p);
    ASSERT_TRUE((*p)->record(deliveries(0, 300)));  // offsets 100..399
    EXPECT_EQ((*p)->staged(), 300u);
    EXPECT_EQ(look(**p, 300)[299], std::optional<Tick>(29));  // from memory
    // The snapshot at offset 250 covers the deliveries at 100..249.
    ASSERT_TRUE((*store)->flush_for_snapshot(kKey, 250, 1111, 30'000));
    EXPECT_EQ((*p)->staged(), 150u);
    const auto both = look(**p, 300);
    for (std::uint64_t i = 0; i < 300; ++i) ASSERT_TRUE(both[i]) << i;
    EXPECT_FALSE((*store)->refusal(manifest(250, 1111)));
    // kill -9 here: the staged deliveries at 250..399 are gone with the process.
  }
  auto store = ConfirmStore::open(dir.file("confirm"));
  ASSERT_TRUE(store);
  ASSERT_FALSE((*store)->refusal(manifest(250, 1111)));
  auto p = (*store)->attach(kKey, kScale, ConfirmStore::Restored{250});
  ASSERT_TRUE(p) << p.error().message;
  const auto after = look(**p, 300);
  for (std::uint64_t i = 0; i < 300; ++i) {
    // Nothing at or after the snapshot's offset looks delivered: the replay
    // from 250 judges those records again without meeting themselves.
    if (100 + i < 250) {
      ASSERT_EQ(after[i], std::optional<Tick>(i / 10)) << i;
    } else {
      ASSERT_FALSE(after[i]) << "offset " << 100 + i << " is past the snapshot";
    }
  }
}

TEST(ConfirmStore, RefusesEverySnapshotItCannotBack) {
  TempDir dir;
  auto store = ConfirmStore::open(dir.file("confirm"));
  ASSERT_TRUE(store);
  // No record of the partition at all (a new or deleted store).
  auto why = (*store)->refusal(manifest(250, 1111));
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("holds no deliveries"), std::string::npos) << *why;

  auto p = (*store)->attach(kKey, kScale, std::nullopt);
  ASSERT_TRUE(p);
  ASSERT_TRUE((*p)->record(deliveries(0, 10)));
  // Not bound yet: no snapshot was written with the store.
  why = (*store)->refusal(manifest(250, 1111));
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("no snapshot"), std::string::npos) << *why;

  ASSERT_TRUE((*store)->flush_for_snapshot(kKey, 105, 2222, 1'000));
  EXPECT_FALSE((*store)->refusal(manifest(105, 2222)));
  // Another snapshot at the same offset (a crash between the two writes
  // left the previous manifest), or at another offset.
  EXPECT_TRUE((*store)->refusal(manifest(105, 2223)));
  EXPECT_TRUE((*store)->refusal(manifest(110, 2222)));
  // Another window or ticks_per_window.
  SnapshotInfo other = manifest(105, 2222);
  other.fingerprint.tick_scale = filter::TickScale(60'000, 128).fingerprint();
  why = (*store)->refusal(other);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("another window"), std::string::npos) << *why;
  // Restoring what the binding does not name is an internal error.
  EXPECT_FALSE((*store)->attach(kKey, kScale, ConfirmStore::Restored{106}));
}

TEST(ConfirmStore, AFreshStartForgetsEverythingAndTheBinding) {
  TempDir dir;
  auto store = ConfirmStore::open(dir.file("confirm"));
  ASSERT_TRUE(store);
  {
    auto p = (*store)->attach(kKey, kScale, std::nullopt);
    ASSERT_TRUE(p);
    ASSERT_TRUE((*p)->record(deliveries(0, 100)));
    ASSERT_TRUE((*store)->flush_for_snapshot(kKey, 500, 1, 5'000));
  }
  // Another partition's entries stay.
  const PartitionKey other{"orders", 4};
  auto q = (*store)->attach(other, kScale, std::nullopt);
  ASSERT_TRUE(q);
  ASSERT_TRUE((*q)->record(deliveries(0, 50)));
  ASSERT_TRUE((*store)->flush_for_snapshot(other, 500, 1, 5'000));

  auto p = (*store)->attach(kKey, kScale, std::nullopt);  // a rebuild from Kafka
  ASSERT_TRUE(p);
  for (const auto& t : look(**p, 100)) ASSERT_FALSE(t);
  EXPECT_TRUE((*store)->refusal(manifest(500, 1)));
  EXPECT_EQ(look(**q, 50)[49], std::optional<Tick>(4));
}

TEST(ConfirmStore, ANewSliceReplacesTheStagingOfTheOldOne) {
  TempDir dir;
  auto store = ConfirmStore::open(dir.file("confirm"));
  ASSERT_TRUE(store);
  auto old = (*store)->attach(kKey, kScale, std::nullopt);
  ASSERT_TRUE(old);
  ASSERT_TRUE((*old)->record(deliveries(0, 100)));
  ASSERT_TRUE((*store)->flush_for_snapshot(kKey, 150, 1, 5'000));  // 100..149 on disk
  ASSERT_TRUE((*old)->record(deliveries(100, 200)));               // staged, not covered
  // The partition comes back (restored from its snapshot at 150): the old
  // Slice's staged deliveries past it are not the new one's.
  auto now = (*store)->attach(kKey, kScale, ConfirmStore::Restored{150});
  ASSERT_TRUE(now) << now.error().message;
  EXPECT_EQ((*now)->staged(), 0u);
  ASSERT_TRUE((*store)->flush_for_snapshot(kKey, 400, 2, 9'000));
  const auto found = look(**now, 200);
  for (std::uint64_t i = 0; i < 200; ++i) EXPECT_EQ(found[i].has_value(), i < 50) << i;
}

TEST(ConfirmStore, CompactionDropsEntriesAWindowOlderThanTheHorizon) {
  TempDir dir;
  auto store = ConfirmStore::open(dir.file("confirm"), direct());
  ASSERT_TRUE(store);
  auto p = (*store)->attach(kKey, kScale, std::nullopt);
  ASSERT_TRUE(p);
  // 2,000 deliveries at ticks 0..199; the clock at 250: alive iff 250 - t <= 64.
  ASSERT_TRUE((*p)->record(deliveries(0, 2000)));
  (*p)->advance(250);
  ASSERT_TRUE((*store)->compact());
  const auto found = look(**p, 2000);
  std::uint64_t kept = 0;
  for (std::uint64_t i = 0; i < 2000; ++i) {
    const Tick t = i / 10;
    if (250 - t <= 64) {
      ASSERT_TRUE(found[i]) << "tick " << t << " is inside the window";
    } else {
      ASSERT_FALSE(found[i]) << "tick " << t << " expired";
    }
    kept += found[i].has_value();
  }
  EXPECT_EQ(kept, 140u);  // ticks 186..199
  EXPECT_EQ((*store)->expired(), 1860u);
}

TEST(ConfirmStore, StagedModeExpiresAtTheBoundSnapshotsClockOnly) {
  TempDir dir;
  auto store = ConfirmStore::open(dir.file("confirm"));
  ASSERT_TRUE(store);
  auto p = (*store)->attach(kKey, kScale, std::nullopt);
  ASSERT_TRUE(p);
  ASSERT_TRUE((*p)->record(deliveries(0, 2000)));  // offsets 100..2099, ticks 0..199
  // The live clock moves far ahead, but nothing is committed past the
  // snapshot: a crash could restart from it, whose clock is at tick 120.
  (*p)->advance(100'000);
  const std::int64_t clock_ms = kScale.start_ms(120);
  ASSERT_TRUE((*store)->flush_for_snapshot(kKey, 2100, 7, clock_ms));
  ASSERT_TRUE((*store)->compact());
  const auto found = look(**p, 2000);
  for (std::uint64_t i = 0; i < 2000; ++i) {
    ASSERT_EQ(found[i].has_value(), 120 - static_cast<std::int64_t>(i / 10) <= 64) << i;
  }
}

TEST(ConfirmStore, StagingKeepsTheLatestDeliveryAcrossManyBatchesAndMoves) {
  TempDir dir;
  auto store = ConfirmStore::open(dir.file("confirm"));
  ASSERT_TRUE(store);
  auto p = (*store)->attach(kKey, kScale, std::nullopt);
  ASSERT_TRUE(p);
  // 40,000 deliveries of 5,000 identities (each delivered 8 times), moved to
  // disk in ten snapshots: the index rebuilds and stale slots on the way.
  std::mt19937_64 rng(7);
  std::vector<std::optional<Tick>> latest(5000);
  std::int64_t offset = 0;
  for (int round = 0; round < 10; ++round) {
    std::vector<ConfirmWrite> batch;
    for (int i = 0; i < 4000; ++i) {
      const std::uint64_t id = rng() % 5000;
      const Tick t = static_cast<Tick>(offset / 100);
      batch.push_back({fp(id), t, offset++});
      latest[id] = t;
    }
    ASSERT_TRUE((*p)->record(batch));
    ASSERT_EQ(look(**p, 5000), latest) << "round " << round;
    ASSERT_TRUE((*store)->flush_for_snapshot(kKey, offset - 1000, round + 1, 0));
    ASSERT_EQ(look(**p, 5000), latest) << "after the move of round " << round;
  }
  EXPECT_EQ((*p)->staged(), 1000u);
}

TEST(ConfirmStore, TheSnapshotStoreMovesAndBindsBeforeItsManifest) {
  TempDir dir;
  StoreOptions so;
  so.confirm = ConfirmOptions{};
  so.sync = false;
  auto filter = filter::make_filter(filter::FilterConfig{
      .type = filter::FilterType::kTimer, .ticks_per_window = 64, .capacity = 1000});
  ASSERT_TRUE(filter);
  const StateFingerprint expected = state_fingerprint((*filter)->config(), kScale, 42);
  {
    auto snapshots = SnapshotStore::open(dir.path(), so);
    ASSERT_TRUE(snapshots) << snapshots.error().message;
    ConfirmStore* confirm = (*snapshots)->confirm();
    ASSERT_NE(confirm, nullptr);
    EXPECT_EQ(confirm->dir(), dir.path() + "/confirm");
    auto p = confirm->attach(kKey, kScale, std::nullopt);
    ASSERT_TRUE(p);
    ASSERT_TRUE((*p)->record(deliveries(0, 100)));
    auto written = (*snapshots)->write(capture_snapshot(kKey, **filter, kScale, 150, 9'000, 42));
    ASSERT_TRUE(written) << written.error().message;
    EXPECT_EQ((*p)->staged(), 50u);
    auto loaded = (*snapshots)->load(kKey, expected);
    ASSERT_TRUE(loaded) << loaded.error().message;
  }
  // The same state dir without confirmed mode writes a snapshot the confirm
  // store knows nothing of...
  {
    auto plain = SnapshotStore::open(dir.path());
    ASSERT_TRUE(plain);
    ASSERT_TRUE((*plain)->write(capture_snapshot(kKey, **filter, kScale, 170, 9'500, 42)));
  }
  // ...which confirmed mode then refuses: the partition is rebuilt.
  auto snapshots = SnapshotStore::open(dir.path(), so);
  ASSERT_TRUE(snapshots);
  auto loaded = (*snapshots)->load(kKey, expected);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().reason, LoadFailure::kConfirmStore);
  EXPECT_NE(loaded.error().message.find("not to this one at offset 170"), std::string::npos)
      << loaded.error().message;
  // inspect's view: read-only, next to the running owner.
  auto view = SnapshotStore::open_read_only(dir.path());
  ASSERT_TRUE(view) << view.error().message;
  ASSERT_NE((*view)->confirm(), nullptr);
  auto listed = (*view)->confirm()->list(true);
  ASSERT_TRUE(listed) << listed.error().message;
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].entries, std::optional<std::uint64_t>(50));
  EXPECT_EQ((*listed)[0].snapshot_offset, std::optional<std::int64_t>(150));
}

}  // namespace
}  // namespace kdedup::state
