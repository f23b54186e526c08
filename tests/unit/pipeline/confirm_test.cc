// Confirmed mode through Slice::decide (the path kdedup run and kdedup
// filter share): property tests against the exact filter on streams with
// bursts and Zipf keys at fpp 0.05, where the filters alone make many false
// positives; a crash past the last snapshot and the restart from it; and
// the in-batch case of a prevented false positive followed by a copy the
// filter calls new.

#include "kdedup/pipeline/confirm.h"

#include <gtest/gtest.h>

#include <map>

#include "kdedup/pipeline/slice.h"
#include "kdedup/state/confirm_store.h"
#include "process.h"
#include "streams.h"

namespace kdedup::pipeline {
namespace {

using filter::Decision;
using filter::FilterType;
using filter::Fingerprint;
using filter::Tick;
using kdedup::testing::Event;
using kdedup::testing::StreamSpec;
using kdedup::testing::TempDir;

constexpr std::uint32_t kTicks = 10;        // ticks per window: every filter type allows it
constexpr std::int64_t kWindowMs = 10'000;  // so a tick is one second
constexpr std::size_t kBatch = 256;         // records per decide() call
const filter::TickScale kScale(kWindowMs, kTicks);

SliceOptions options_for(FilterType type, bool refresh, state::ConfirmStore* confirm) {
  SliceOptions o;
  o.window_ms = kWindowMs;
  o.refresh = refresh;
  o.filter.type = type;
  o.filter.ticks_per_window = kTicks;
  o.filter.fpp = 0.05;
  o.filter.capacity = 2'000;
  o.filter.min_bytes = 4096;
  o.confirm = confirm;
  return o;
}

std::unique_ptr<Slice> make(FilterType type, bool refresh, state::ConfirmStore* confirm,
                            SliceStart start = {}) {
  auto s =
      Slice::create(PartitionId{"in", 0}, options_for(type, refresh, confirm), std::move(start));
  EXPECT_TRUE(s) << s.error().message;
  return s ? std::move(*s) : nullptr;
}

/// Decisions of `slice` for events [from, to), offset = index, in batches.
std::vector<Decision> run(Slice& slice, const std::vector<Event>& events, std::size_t from,
                          std::size_t to) {
  std::vector<Decision> out(to - from);
  std::vector<Fingerprint> fps;
  std::vector<Tick> ticks;
  std::vector<std::int64_t> offsets;
  for (std::size_t i = from; i < to; i += kBatch) {
    const std::size_t end = std::min(to, i + kBatch);
    fps.clear();
    ticks.clear();
    offsets.clear();
    for (std::size_t j = i; j < end; ++j) {
      fps.push_back(events[j].fp);
      ticks.push_back(events[j].tick);
      offsets.push_back(static_cast<std::int64_t>(j));
    }
    slice.decide(fps, ticks, std::span(out).subspan(i - from, end - i), {}, offsets);
    EXPECT_FALSE(slice.failure()) << *slice.failure();
  }
  return out;
}

struct Score {
  std::uint64_t false_positives = 0, false_negatives = 0, duplicates = 0;
};

Score score(const std::vector<Decision>& got, const std::vector<Decision>& exact) {
  Score s;
  for (std::size_t i = 0; i < got.size(); ++i) {
    s.duplicates += exact[i] == Decision::kDuplicate;
    if (got[i] == Decision::kDuplicate && exact[i] == Decision::kDistinct) ++s.false_positives;
    if (got[i] == Decision::kDistinct && exact[i] == Decision::kDuplicate) ++s.false_negatives;
  }
  return s;
}

/// Zipf keys with a 5x burst, and uniform keys with a 2x burst: 40-60%
/// duplicates, 60 windows.
std::vector<StreamSpec> streams() {
  StreamSpec zipf;
  zipf.distribution = testing::Distribution::kZipf;
  zipf.domain = 200'000;
  zipf.base_rate = 300;
  zipf.ticks = 600;
  zipf.burst_factor = 5;
  zipf.seed = 11;
  StreamSpec uniform;
  uniform.domain = 6'000;
  uniform.base_rate = 300;
  uniform.ticks = 600;
  uniform.burst_factor = 2;
  uniform.seed = 12;
  return {zipf, uniform};
}

struct Case {
  FilterType type;
  bool refresh;
};

class ConfirmedDecisions : public ::testing::TestWithParam<Case> {};

TEST_P(ConfirmedDecisions, EqualTheExactFiltersOnBurstsAndZipfKeysAtFpp5Percent) {
  const Case c = GetParam();
  for (const StreamSpec& spec : streams()) {
    const std::vector<Event> events = testing::generate_stream(spec);
    TempDir dir;
    state::ConfirmOptions co;
    co.write_ahead_log = false;
    auto store = state::ConfirmStore::open(dir.file("confirm"), co);
    ASSERT_TRUE(store) << store.error().message;
    auto exact = make(FilterType::kExact, c.refresh, nullptr);
    auto alone = make(c.type, c.refresh, nullptr);
    auto confirmed = make(c.type, c.refresh, store->get());
    const auto truth = run(*exact, events, 0, events.size());
    const Score a = score(run(*alone, events, 0, events.size()), truth);
    // Staged deliveries move to disk every 10,000 records, as snapshots would.
    std::vector<Decision> got;
    for (std::size_t i = 0; i < events.size(); i += 10'000) {
      const std::size_t end = std::min(events.size(), i + 10'000);
      const auto part = run(*confirmed, events, i, end);
      got.insert(got.end(), part.begin(), part.end());
      ASSERT_TRUE((*store)->flush_for_snapshot(state::PartitionKey{"in", 0},
                                               static_cast<std::int64_t>(end), 1,
                                               kScale.start_ms(events[end - 1].tick)));
    }
    const Score s = score(got, truth);
    const ConfirmCounts counts = confirmed->counters()->confirm.read();
    std::printf(
        "%s %s, %s stream: %zu records, %llu duplicates; filter alone %llu FP %llu FN; "
        "confirmed %llu FP %llu FN, %llu lookups, %llu prevented\n",
        filter::to_string(c.type), c.refresh ? "refresh" : "keep_first",
        spec.distribution == testing::Distribution::kZipf ? "Zipf 5x burst" : "uniform 2x burst",
        events.size(), static_cast<unsigned long long>(s.duplicates),
        static_cast<unsigned long long>(a.false_positives),
        static_cast<unsigned long long>(a.false_negatives),
        static_cast<unsigned long long>(s.false_positives),
        static_cast<unsigned long long>(s.false_negatives),
        static_cast<unsigned long long>(counts.lookups),
        static_cast<unsigned long long>(counts.prevented));
    EXPECT_EQ(s.false_positives, 0u);
    EXPECT_EQ(s.false_negatives, 0u);
    EXPECT_EQ(got, truth);
    // The streams must hold duplicates and make the filter err.
    EXPECT_GT(s.duplicates, events.size() / 5);
    EXPECT_GT(a.false_positives, 50u) << "the filter alone should make many false positives";
    // Most of what the filter alone gets wrong is prevented. (The two runs
    // diverge after the first prevented false positive, and the filter
    // alone's count includes identities whose earlier copy it had dropped:
    // 0.5-1.2 of it here.)
    EXPECT_GE(counts.prevented, a.false_positives / 3);
    EXPECT_GE(counts.lookups, s.duplicates);
  }
}

INSTANTIATE_TEST_SUITE_P(
    FiltersAndModes, ConfirmedDecisions,
    ::testing::Values(Case{FilterType::kTimer, false}, Case{FilterType::kTimer, true},
                      Case{FilterType::kAging, false}, Case{FilterType::kAging, true},
                      Case{FilterType::kCompact, false}, Case{FilterType::kCompact, true}),
    [](const auto& param) {
      return std::string(filter::to_string(param.param.type)) +
             (param.param.refresh ? "_refresh" : "_keep_first");
    });

// A crash after the last snapshot: the restart restores the snapshot's
// filter and the store rolls back to the snapshot (its staged deliveries
// past it are gone), then replays from the snapshot. Every decision is still
// the exact filter's: no record past the snapshot meets its own delivery.
TEST(ConfirmedRecovery, ACrashPastTheSnapshotReplaysToTheExactDecisions) {
  StreamSpec spec = streams()[1];
  const std::vector<Event> events = testing::generate_stream(spec);
  auto exact = make(FilterType::kExact, false, nullptr);
  const auto truth = run(*exact, events, 0, events.size());
  TempDir dir;
  const state::PartitionKey key{"in", 0};
  const std::size_t snapshot_at = events.size() / 2;
  const std::size_t crash_at = snapshot_at + 30'000;  // several windows past it
  std::string filter_state;
  std::int64_t clock_ms = 0;
  std::vector<Decision> got;
  {
    auto store = state::ConfirmStore::open(dir.file("confirm"));
    ASSERT_TRUE(store);
    auto slice = make(FilterType::kTimer, false, store->get());
    got = run(*slice, events, 0, snapshot_at);
    filter_state = slice->filter()->serialize();
    clock_ms = kScale.start_ms(events[snapshot_at - 1].tick);
    ASSERT_TRUE(
        (*store)->flush_for_snapshot(key, static_cast<std::int64_t>(snapshot_at), 99, clock_ms));
    // Processed past the snapshot, then kill -9: nothing of it was committed.
    (void)run(*slice, events, snapshot_at, crash_at);
  }
  auto store = state::ConfirmStore::open(dir.file("confirm"));
  ASSERT_TRUE(store);
  auto restored = filter::restore_filter(filter_state);
  ASSERT_TRUE(restored);
  SliceStart start;
  start.filter = std::move(*restored);
  start.clock_ms = clock_ms;
  start.next_offset = static_cast<std::int64_t>(snapshot_at);
  auto slice = make(FilterType::kTimer, false, store->get(), std::move(start));
  ASSERT_NE(slice, nullptr);
  const auto rest = run(*slice, events, snapshot_at, events.size());
  got.insert(got.end(), rest.begin(), rest.end());
  const Score s = score(got, truth);
  EXPECT_EQ(s.false_positives, 0u);
  EXPECT_EQ(s.false_negatives, 0u);
}

/// A filter whose answers are scripted per fingerprint: "duplicate" for the
/// first `lies` tests of a fingerprint, then the truth of an exact set.
class ScriptedFilter final : public filter::SlidingFilter {
 public:
  explicit ScriptedFilter(std::map<std::uint64_t, int> lies) : lies_(std::move(lies)) {
    config_.type = FilterType::kTimer;
    config_.ticks_per_window = kTicks;
  }
  FilterType type() const noexcept override { return FilterType::kTimer; }
  const filter::FilterConfig& config() const noexcept override { return config_; }
  Decision test_and_insert(const Fingerprint& fp, Tick now) override {
    if (auto it = lies_.find(fp.lo); it != lies_.end() && it->second > 0) {
      --it->second;
      return Decision::kDuplicate;
    }
    auto it = last_.find(fp.lo);
    if (it != last_.end() && now - it->second <= kTicks) return Decision::kDuplicate;
    last_[fp.lo] = now;
    return Decision::kDistinct;
  }
  // The cells an earlier lie rested on expired: the filter forgot it.
  void insert(const Fingerprint& fp, Tick now) override { inserted_.emplace_back(fp.lo, now); }
  void advance(Tick) override {}
  filter::FilterStats stats() const override { return {}; }
  std::string serialize() const override { return {}; }
  std::vector<std::pair<std::uint64_t, Tick>> inserted_;

 private:
  filter::FilterConfig config_;
  std::map<std::uint64_t, int> lies_;
  std::map<std::uint64_t, Tick> last_;
};

TEST(Confirmer, ACopyAfterAPreventedFalsePositiveInTheSameBatchIsADuplicate) {
  for (const bool refresh : {false, true}) {
    TempDir dir;
    auto store = state::ConfirmStore::open(dir.file("confirm"));
    ASSERT_TRUE(store);
    auto attached = (*store)->attach({"in", 0}, kScale, std::nullopt);
    ASSERT_TRUE(attached);
    auto counters = std::make_shared<PartitionCounters>();
    Confirmer confirmer(std::move(*attached), kTicks, refresh, counters);
    // X is new, but the filter calls its first copy a duplicate (a false
    // positive) and, its cells having expired by then, calls the second one
    // new: only the store knows the first was delivered.
    ScriptedFilter f(std::map<std::uint64_t, int>{{7, 1}});
    const std::vector<Fingerprint> fps{{7, 0}, {8, 0}, {7, 0}, {7, 0}};
    const std::vector<Tick> ticks{100, 101, 103, 112};
    std::vector<Decision> out(fps.size());
    for (std::size_t i = 0; i < fps.size(); ++i) out[i] = f.test_and_insert(fps[i], ticks[i]);
    ASSERT_EQ(out[0], Decision::kDuplicate);
    ASSERT_EQ(out[2], Decision::kDistinct);
    ASSERT_TRUE(
        confirmer.settle(f, fps, ticks, std::vector<std::int64_t>{10, 11, 12, 13}, {}, out));
    EXPECT_EQ(out[0], Decision::kDistinct) << "a prevented false positive";
    EXPECT_EQ(out[1], Decision::kDistinct);
    EXPECT_EQ(out[2], Decision::kDuplicate) << "delivered two ticks before, in this batch";
    // 12 ticks after the first delivery: expired under keep_first; under
    // refresh the copy at 103 renewed it (112 - 103 <= 10).
    EXPECT_EQ(out[3], refresh ? Decision::kDuplicate : Decision::kDistinct);
    // keep_first: the filter learned X at 103 (it called it new), so it
    // calls the copy at 112 a duplicate: a second prevented false positive.
    EXPECT_EQ(counters->confirm.read().prevented, refresh ? 1u : 2u);
    if (!refresh) {
      // keep_first: the filter learns each delivery it missed, at its clock.
      ASSERT_EQ(f.inserted_.size(), 2u);
      EXPECT_EQ(f.inserted_[0], (std::pair<std::uint64_t, Tick>{7, 112}));
    }
  }
}

}  // namespace
}  // namespace kdedup::pipeline
