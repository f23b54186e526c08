// Memory follows load (DESIGN.md): the shared MemoryBudget's contract, an
// idle filter at its floor whatever the capacity hint, growth and shrink
// (fold) of the timer filter with the load, restore-then-shrink (timer and
// compact), and every filter type under a budget smaller than the load
// needs: within it (plus the floors), no false negative, false positives
// within what the filter reports, and back at the target fpp once the load
// falls. (The compact filter's own growth and shrink: compact_filter_test.)

#include "kdedup/filter/memory_budget.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "figures.h"
#include "kdedup/common/bytes.h"
#include "kdedup/filter/aging_filter.h"
#include "kdedup/filter/compact_filter.h"
#include "kdedup/filter/config_codec.h"
#include "kdedup/filter/exact_filter.h"
#include "kdedup/filter/timer_filter.h"
#include "streams.h"

namespace kdedup::filter {
namespace {

using testing::closes_tick;
using testing::Event;
using testing::generate_stream;
using testing::identity_fingerprint;
using testing::run_against_oracle;
using testing::StreamSpec;

std::shared_ptr<MemoryBudget> budget_of(std::uint64_t max_bytes, double fpp = 0.01,
                                        std::vector<MemoryBudget::Change>* changes = nullptr) {
  MemoryBudget::Options o;
  o.max_bytes = max_bytes;
  o.fpp = fpp;
  if (changes != nullptr) o.on_change = [changes](const auto& c) { changes->push_back(c); };
  return std::make_shared<MemoryBudget>(std::move(o));
}

FilterConfig config_of(FilterType type, std::uint64_t capacity, std::uint8_t bits = 8,
                       double fpp = 0.01, std::uint64_t min_bytes = 64 * 1024) {
  FilterConfig c;
  c.type = type;
  c.timer_bits = bits;
  c.capacity = capacity;
  c.fpp = fpp;
  c.min_bytes = min_bytes;
  return *normalize(c);
}

std::unique_ptr<SlidingFilter> make(const FilterConfig& c) {
  auto f = make_filter(c);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  return f ? std::move(*f) : nullptr;
}

using testing::presized_bytes;

// --- MemoryBudget -------------------------------------------------------------

TEST(MemoryBudget, WithoutALimitCountsAndNeverRefuses) {
  auto b = budget_of(0);
  EXPECT_TRUE(b->try_reserve(1ULL << 40));
  b->charge(100);
  EXPECT_EQ(b->used(), (1ULL << 40) + 100);
  b->release(1ULL << 40);
  b->release(100);
  EXPECT_EQ(b->used(), 0U);
  EXPECT_EQ(b->level(), 0U);
  EXPECT_EQ(b->max_level(), 0U);
  EXPECT_EQ(b->effective_fpp(), 0.01);
  MemoryDemand d(b);
  EXPECT_EQ(d.levels(), 0U);  // nothing to publish without a limit
}

TEST(MemoryBudget, ReservationsStopAtTheLimit) {
  auto b = budget_of(1000);
  EXPECT_TRUE(b->try_reserve(600));
  EXPECT_FALSE(b->try_reserve(500));
  EXPECT_EQ(b->used(), 600U);  // a refusal reserves nothing
  // Part of what is asked for: half of what is free, at least `least`.
  EXPECT_EQ(b->reserve_up_to(100, 900), 200U);
  EXPECT_EQ(b->used(), 800U);
  EXPECT_EQ(b->reserve_up_to(150, 900), 150U);
  EXPECT_EQ(b->reserve_up_to(100, 900), 0U);
  EXPECT_TRUE(b->try_reserve(50));  // exactly at the limit
  EXPECT_EQ(b->used(), 1000U);
  b->charge(10);  // a floor: past the limit
  EXPECT_EQ(b->used(), 1010U);
  EXPECT_EQ(b->level(), 0U);  // refusals alone do not move the level
}

TEST(MemoryBudget, TheLevelFollowsThePublishedDemand) {
  std::vector<MemoryBudget::Change> changes;
  auto b = budget_of(1000, 0.01, &changes);
  EXPECT_EQ(b->max_level(), 5U);  // 0.01 * 2^5 = 0.32 >= kMaxEffectiveFpp
  {
    MemoryDemand d(b);
    std::uint64_t seen = 0;  // the voter's refusal count (one voter here)
    ASSERT_EQ(d.levels(), 6U);
    // Needs 2000 bytes at the target, 30% less per level.
    std::vector<std::uint64_t> need{2000, 1400, 980, 686, 480, 336};
    d.publish(need);
    EXPECT_EQ(b->demand(0), 2000U);
    b->settle(MemoryBudget::kHold, seen);  // a filter that has not run long enough at the level
    EXPECT_EQ(b->level(), 0U);
    // Up at once to the lowest level that fits: 686 <= 0.85 * 1000.
    b->settle(0, seen);
    EXPECT_EQ(b->level(), 3U);
    b->settle(0, seen);  // the level moved past what this caller saw: nothing
    EXPECT_EQ(b->level(), 3U);
    b->settle(3, seen);
    EXPECT_EQ(b->level(), 3U);  // level 2 needs 980: above 0.75 * 1000, stays
    EXPECT_DOUBLE_EQ(b->fpp_scale(), 8.0);
    EXPECT_DOUBLE_EQ(b->effective_fpp(), 0.08);
    // The load falls: back one step per round, down to the target.
    d.publish(std::vector<std::uint64_t>{700, 490, 343, 240, 168, 117});
    b->settle(3, seen);
    b->settle(2, seen);
    EXPECT_EQ(b->level(), 1U);
    b->settle(1, seen);  // level 0 needs 700 <= 750
    EXPECT_EQ(b->level(), 0U);
  }
  EXPECT_EQ(b->demand(0), 0U);    // withdrawn with the filter
  ASSERT_EQ(changes.size(), 4U);  // 0 -> 3, then one step down at a time
  EXPECT_EQ(changes[0].previous, 0U);
  EXPECT_EQ(changes[0].level, 3U);
  EXPECT_EQ(changes[0].max_bytes, 1000U);
  EXPECT_EQ(changes.back().level, 0U);
}

TEST(MemoryBudget, ADemandNoLevelMeetsIsReportedOncePerSpell) {
  // At the top level the fpp cannot rise further: a demand still past
  // max_bytes (floors that alone do not fit) is reported once, and again
  // only after it fitted in between.
  std::vector<MemoryBudget::Change> changes;
  auto b = budget_of(1000, 0.01, &changes);
  MemoryDemand d(b);
  std::uint64_t seen = 0;
  const std::vector<std::uint64_t> floors(6, 1600);
  d.publish(floors);
  b->settle(0, seen);
  ASSERT_EQ(b->level(), 5U);
  ASSERT_EQ(changes.size(), 1U);
  EXPECT_FALSE(changes[0].unmet);
  b->settle(5, seen);
  b->settle(5, seen);
  ASSERT_EQ(changes.size(), 2U);
  EXPECT_TRUE(changes[1].unmet);
  EXPECT_EQ(changes[1].level, 5U);
  EXPECT_EQ(changes[1].previous, 5U);
  EXPECT_EQ(changes[1].demand, 1600U);
  EXPECT_EQ(changes[1].filters, 1U);
  d.publish(std::vector<std::uint64_t>{1600, 1400, 1200, 1000, 950, 900});  // fits at 5
  b->settle(5, seen);
  EXPECT_EQ(changes.size(), 2U);
  d.publish(floors);
  b->settle(5, seen);
  ASSERT_EQ(changes.size(), 3U);
  EXPECT_TRUE(changes[2].unmet);
}

TEST(MemoryBudget, RefusalsKeepTheLevelUp) {
  // A saturated filter inserts little and under-reports its need: while
  // reservations are refused the level does not fall.
  // Each voter judges by the refusals since its own previous vote: one
  // that votes more often (a worker's wall-clock vote, once a second) does
  // not hide a refusal from the others.
  auto b = budget_of(1000);
  MemoryDemand d(b);
  std::uint64_t seen = 0, often = 0;
  d.publish(std::vector<std::uint64_t>{2000, 1000, 500, 250, 125, 60});
  b->settle(0, seen);
  b->settle(1, seen);
  ASSERT_EQ(b->level(), 2U);
  ASSERT_TRUE(b->try_reserve(1000));
  EXPECT_FALSE(b->try_reserve(1));
  d.publish(std::vector<std::uint64_t>{100, 50, 25, 12, 6, 3});
  b->settle(MemoryBudget::kHold, often);  // sees the refusal, does not vote
  b->settle(2, seen);
  EXPECT_EQ(b->level(), 2U);
  b->settle(2, seen);  // no refusal since its last round
  EXPECT_EQ(b->level(), 1U);
  b->settle(1, often);  // nor since the other's
  EXPECT_EQ(b->level(), 0U);
}

TEST(MemoryBudget, FiltersThatHaveNotPublishedCountAsNeedingWhatTheAskerNeeds) {
  // Three filters share a budget; one has published. Asked by it, the
  // expected demand counts the two silent ones at its own need, and drops
  // to the published total once they have spoken or gone.
  auto b = budget_of(1000);
  MemoryDemand first(b);
  auto second = std::make_unique<MemoryDemand>(b);
  MemoryDemand third(b);
  first.publish(std::vector<std::uint64_t>{600, 300});
  EXPECT_EQ(b->demand(0), 600U);
  EXPECT_EQ(b->expected_demand(600), 1800U);
  third.publish(std::vector<std::uint64_t>{100, 50});
  EXPECT_EQ(b->expected_demand(600), 1300U);
  second.reset();
  EXPECT_EQ(b->expected_demand(600), 700U);
  MemoryDemand moved(std::move(third));
  EXPECT_EQ(b->expected_demand(600), 700U);  // moving does not count twice
}

TEST(MemoryBudget, ChargesReleaseThemselves) {
  auto b = budget_of(1000);
  {
    ASSERT_TRUE(b->try_reserve(400));
    MemoryCharge c(b, 400);
    MemoryCharge moved(std::move(c));
    EXPECT_EQ(c.bytes(), 0U);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(moved.bytes(), 400U);
    moved.resize(100);
    EXPECT_EQ(b->used(), 100U);
    moved.resize(2000);  // grows past the limit: charged
    EXPECT_EQ(b->used(), 2000U);
    MemoryCharge other;
    other = std::move(moved);
    EXPECT_EQ(b->used(), 2000U);
  }
  EXPECT_EQ(b->used(), 0U);
}

TEST(MemoryBudget, ConcurrentReservationsNeverPassTheLimit) {
  auto b = budget_of(1 << 20);
  std::atomic<std::uint64_t> peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::uint64_t> held;
      MemoryDemand d(b);
      std::uint64_t refusals_seen = 0;
      for (int i = 0; i < 20000; ++i) {
        const std::uint64_t n = 1 + static_cast<std::uint64_t>((i * 7919 + t) % 4096);
        if (b->try_reserve(n)) held.push_back(n);
        if (i % 100 == 0) {
          d.publish(std::vector<std::uint64_t>(d.levels(), static_cast<std::uint64_t>(i) * 64));
          b->settle(b->level(), refusals_seen);
        }
        std::uint64_t seen = b->used();
        std::uint64_t prev = peak.load();
        while (seen > prev && !peak.compare_exchange_weak(prev, seen)) {
        }
        if (held.size() > 64) {
          b->release(held.front());
          held.erase(held.begin());
        }
      }
      for (std::uint64_t n : held) b->release(n);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(b->used(), 0U);
  EXPECT_EQ(b->demand(0), 0U);
  EXPECT_LE(peak.load(), 1U << 20);
}

TEST(MemoryBudget, EffectiveFppIsCapped) {
  EXPECT_EQ(effective_fpp(0.01, 1.0), 0.01);
  EXPECT_EQ(effective_fpp(0.01, 4.0), 0.04);
  EXPECT_EQ(effective_fpp(0.01, 1024.0), kMaxEffectiveFpp);
  EXPECT_EQ(effective_fpp(0.4, 8.0), 0.4);  // never below the configured target
}

// --- the floor ------------------------------------------------------------------

TEST(MemoryFollowsLoad, AnIdleFilterHoldsTheFloorWhateverTheHint) {
  for (FilterType type : {FilterType::kTimer, FilterType::kAging, FilterType::kCompact}) {
    for (std::uint8_t bits : {4, 8, 16}) {
      if (type != FilterType::kTimer && bits != 8) continue;
      auto f = make(config_of(type, 1'000'000, bits));
      ASSERT_TRUE(f);
      const FilterConfig& c = f->config();
      // The floor plus the filter's fixed bookkeeping.
      EXPECT_LE(f->stats().bytes, c.min_bytes + 16 * 1024) << to_string(type) << int(bits);
      // A hint below the floor starts a timer or aging filter below it; a
      // compact filter starts at the floor whatever the hint (a smaller first
      // table holds most of the fpp budget while its successor fills).
      auto small = make(config_of(type, 100, bits));
      if (type == FilterType::kCompact) {
        EXPECT_EQ(small->stats().bytes, f->stats().bytes);
      } else {
        EXPECT_LT(small->stats().bytes, f->stats().bytes) << to_string(type) << int(bits);
      }
    }
  }
}

// --- grow and shrink --------------------------------------------------------------

// The filter types (and timer widths) that grow and shrink by parts.
struct Kind {
  const char* name;
  FilterType type;
  std::uint8_t bits;
};
constexpr Kind kGrowingKinds[] = {{"timer-4", FilterType::kTimer, 4},
                                  {"timer-8", FilterType::kTimer, 8},
                                  {"timer-16", FilterType::kTimer, 16},
                                  {"compact", FilterType::kCompact, 8}};

// `base` distinct ids per tick for two windows, 5x that for two, `base`
// again for three: all distinct, so every arrival is a new identity.
std::vector<Event> burst_stream(std::uint32_t window, double base, std::uint64_t seed) {
  StreamSpec spec;
  spec.domain = 1ULL << 40;
  spec.base_rate = base;
  spec.ticks = 6 * (window + 1);
  spec.burst_factor = 5;
  spec.seed = seed;
  auto events = generate_stream(spec);
  // A seventh window at the base rate: two windows after the burst.
  StreamSpec tail = spec;
  tail.ticks = window + 1;
  tail.burst_factor = 1;
  tail.first_tick = spec.ticks;
  tail.seed = seed + 1;
  for (const Event& e : generate_stream(tail)) events.push_back(e);
  return events;
}

/// Identities delivered within the last `window` ticks, for events fed in
/// tick order, and the most it held at a tick's close from the end of the
/// first window on.
struct InWindowCount {
  explicit InWindowCount(std::uint32_t w) : window(w), delivered(w + 1, 0) {}
  /// An event of `tick` was decided (`delivered`: the filter let it
  /// through). When it is the last of its tick (`closes`), the tick closes:
  /// `at_close()` runs, from the end of the first window on, with the
  /// filter as it stands before the next tick's first event, which may free
  /// or fold a part.
  template <class AtClose>
  void observe(Tick tick, bool delivered_now, bool closes, AtClose at_close) {
    for (; clock < tick; ++clock) {
      std::uint64_t& slot = delivered[(clock + 1) % (window + 1)];
      count -= slot;
      slot = 0;
    }
    if (delivered_now) {
      ++delivered[clock % (window + 1)];
      ++count;
    }
    if (closes && clock > window) {
      most = std::max(most, count);
      at_close();
    }
  }

  std::uint32_t window;
  std::vector<std::uint64_t> delivered;  // per tick of the last window
  Tick clock = 0;
  std::uint64_t count = 0, most = 0;
};

/// A filter's run against the oracle, read at each tick's close from the
/// end of the first window on.
struct LoadRun {
  testing::OracleCounts counts;
  std::uint64_t peak = 0;        // bytes
  double worst_estimate = 0;     // stats().fpp_estimate
  std::uint64_t expansions = 0;  // ticks at which a lone sub-filter grew
  std::uint64_t most = 0;        // identities delivered within the window
};

LoadRun run_load(SlidingFilter& f, const std::vector<Event>& events,
                 const std::function<void()>& at_close = {}) {
  LoadRun run;
  InWindowCount in_window(f.config().ticks_per_window);
  std::uint64_t before = 0;
  run.counts =
      run_against_oracle(f, events, 1, [&](std::size_t i, const Event& e, Decision d, bool) {
        in_window.observe(e.tick, d == Decision::kDistinct, closes_tick(events, i), [&] {
          const auto st = f.stats();
          run.peak = std::max(run.peak, st.bytes);
          run.worst_estimate = std::max(run.worst_estimate, st.fpp_estimate);
          run.expansions += st.subfilters == 1 && st.bytes > before ? 1 : 0;
          before = st.bytes;
          if (at_close) at_close();
        });
      });
  run.most = in_window.most;
  return run;
}

// Distinct ids at phases[i].first a window for phases[i].second windows, one
// phase after the other (seed `seed` + i), all distinct; and the index of
// each phase's first event.
std::pair<std::vector<Event>, std::vector<std::size_t>> phased_stream(
    std::uint32_t window, const std::vector<std::pair<double, std::uint64_t>>& phases,
    std::uint64_t seed) {
  std::vector<Event> events;
  std::vector<std::size_t> starts;
  Tick at = 0;
  for (const auto& [ids, windows] : phases) {
    StreamSpec spec;
    spec.domain = 1ULL << 40;
    spec.base_rate = ids / (window + 1);
    spec.first_tick = at;
    spec.ticks = windows * (window + 1);
    spec.seed = seed + starts.size();
    starts.push_back(events.size());
    for (const Event& e : generate_stream(spec)) events.push_back(e);
    at += spec.ticks;
  }
  return {std::move(events), std::move(starts)};
}

// A step sustained for two windows (family_bench --short-bursts): `base`
// new identities a window for three windows, `factor` times that for two,
// then `base` again for two.
std::vector<Event> step_stream(std::uint32_t window, double base, double factor) {
  return phased_stream(window, {{base, 3}, {factor * base, 2}, {base, 2}}, 7).first;
}

// `first` distinct ids a window for two windows, then `then` for four; and
// the index of the first event at the second rate.
std::pair<std::vector<Event>, std::size_t> two_rate_stream(std::uint32_t window, double first,
                                                           double then, std::uint64_t seed) {
  auto [events, starts] = phased_stream(window, {{first, 2}, {then, 4}}, seed);
  return {std::move(events), starts[1]};
}

// Where the first sub-filter's line count lies in the payload of a timer
// filter's state (its hash range follows from format 2 on, then its
// expansion record in format 3).
std::size_t first_lines_at(const FilterConfig& c) {
  std::string config_bytes;
  ByteWriter w(config_bytes);
  write_config(w, c);
  return config_bytes.size() + 4 + 3 * 8 + 4;
}

// The first sub-filter's expansion count in the payload of a timer filter's
// state of format 3 or 4 (after its line count and hash range).
std::uint32_t first_expansions(const FilterConfig& c, std::string_view payload) {
  std::uint32_t n = 0;
  std::memcpy(&n, payload.data() + first_lines_at(c) + 16, 4);
  return n;
}

// family_bench's "uniform 5x burst" on filter ticks: `domain` draws a
// window from a domain of as many identities for six windows, 5x as often
// in the middle third.
StreamSpec repeats_burst(std::uint32_t window, std::uint64_t domain) {
  StreamSpec spec;
  spec.domain = domain;
  spec.base_rate = static_cast<double>(domain) / (window + 1);
  spec.ticks = 6 * (window + 1);
  spec.burst_factor = 5;
  spec.seed = 7;
  return spec;
}

// `spec` drawn for six windows at family_bench's fine ticks (its burst, if
// any, in the middle third), laid on a filter's `window` ticks.
std::vector<Event> fine_stream_on_ticks(StreamSpec spec, std::uint32_t window) {
  spec.ticks = 6 * testing::kFineTicksPerWindow;
  auto events = generate_stream(spec);
  testing::lay_on_ticks(events, window);
  return events;
}

// Runs `events` through a filter of config `c` (run_load()): no false
// negative, the estimate within the target, false positives within 1.2x of
// it, memory at its peak within `bound` x (issue 14's 2x unless given) the
// pre-sized figure for the most the window held, and the batch path alike.
// Returns the run.
LoadRun expect_burst_held(const FilterConfig& c, const std::vector<Event>& events,
                          double bound = 2.0) {
  auto f = make(c);
  const LoadRun run = run_load(*f, events);
  EXPECT_EQ(run.counts.false_negatives, 0U);
  EXPECT_LE(run.worst_estimate, c.fpp);
  EXPECT_LE(run.counts.fp_rate(), 1.2 * c.fpp);
  const double most = static_cast<double>(presized_bytes(c, run.most));
  EXPECT_LE(static_cast<double>(run.peak), bound * most)
      << static_cast<double>(run.peak) / most << "x";
  auto batch = make(c);
  auto seq = run_against_oracle(*batch, events, 128);
  EXPECT_EQ(seq.false_positives, run.counts.false_positives);
  EXPECT_EQ(batch->serialize(), f->serialize());
  return run;
}

// A run_against_oracle callback (one event at a time) that calls `at(tick)`
// as every tick of `events` closes: after its last event, before the next
// tick's first, which may free or fold a part.
template <class Fn>
auto at_each_close(const std::vector<Event>& events, Fn at) {
  return [at, &events](std::size_t i, const Event& e, Decision, bool) mutable {
    if (closes_tick(events, i)) at(e.tick);
  };
}

TEST(MemoryFollowsLoad, BytesPeakIsTheMostHeldAtAnyTicksClose) {
  // A step to 3x for two windows, then back: parts are added and freed.
  // stats().bytes_peak is the most stats().bytes read after any tick's last
  // element (before the next tick's first frees or folds a part), whatever
  // the chunks the batch path takes, and at least what is held now.
  for (const auto& [type, bits] : {std::pair{FilterType::kTimer, std::uint8_t{4}},
                                   std::pair{FilterType::kTimer, std::uint8_t{8}},
                                   std::pair{FilterType::kCompact, std::uint8_t{8}},
                                   std::pair{FilterType::kAging, std::uint8_t{8}},
                                   std::pair{FilterType::kExact, std::uint8_t{8}}}) {
    SCOPED_TRACE(std::string(to_string(type)) + " " + std::to_string(bits));
    const FilterConfig c = config_of(type, 1'000'000, bits, 0.01, 4 * 1024);
    const std::uint32_t window = c.ticks_per_window;
    const auto events =
        testing::short_burst_stream(window, 8'000, 2 * 2 * 8'000, 2 * (std::uint64_t{window} + 1));
    auto one = make(c);
    std::uint64_t most = 0;
    run_against_oracle(*one, events, 1, at_each_close(events, [&](Tick) {
      most = std::max(most, one->stats().bytes);
    }));
    EXPECT_EQ(one->stats().bytes_peak, most);
    EXPECT_GT(most, 2 * one->stats().bytes) << "the step must have grown the filter";
    for (const std::size_t chunk : {std::size_t{7}, std::size_t{4096}}) {
      auto batch = make(c);
      run_against_oracle(*batch, events, chunk);
      EXPECT_EQ(batch->stats().bytes_peak, most) << chunk;
    }
  }
}

TEST(MemoryFollowsLoad, TimerGrowsUnderABurstAndFoldsBackAfterIt) {
  KDEDUP_FIGURES_TEST();
  for (std::uint8_t bits : {4, 8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);  // 100x too large
    const std::uint32_t window = c.ticks_per_window;
    const double base = 20'000.0 / (window + 1);  // 20k ids per window
    const auto events = burst_stream(window, base, 3 + bits);
    auto f = make(c);
    auto batch = make(c);
    auto& timer = dynamic_cast<TimerFilter&>(*f);
    FilterConfig sized = c;
    sized.capacity = 20'000;
    const double presized =
        static_cast<double>((*TimerFilter::create_presized(sized))->stats().bytes);
    std::uint64_t peak = 0;
    double worst_estimate = 0;
    auto counts = run_against_oracle(*f, events, 1, at_each_close(events, [&](Tick) {
      peak = std::max(peak, f->stats().bytes);
      worst_estimate = std::max(worst_estimate, f->stats().fpp_estimate);
    }));
    EXPECT_EQ(counts.false_negatives, 0U);
    EXPECT_LE(counts.fp_rate(), 1.2 * c.fpp);
    EXPECT_LE(worst_estimate, c.fpp);
    EXPECT_LE(timer.fpp_budget_used(), c.fpp);
    // It grew for the burst (5x the ids) and is back within 1.5x of the
    // pre-sized figure two windows after it.
    EXPECT_GT(static_cast<double>(peak), 3 * presized);
    EXPECT_LE(static_cast<double>(peak), 2 * 5 * presized);
    EXPECT_LE(static_cast<double>(f->stats().bytes), 1.5 * presized);
    EXPECT_EQ(f->stats().subfilters, 1U);
    // The batch path folds at the same ticks: same decisions, same bytes.
    auto seq = run_against_oracle(*batch, events, 128);
    EXPECT_EQ(seq.false_positives, counts.false_positives);
    EXPECT_EQ(batch->serialize(), f->serialize());
  }
}

TEST(MemoryFollowsLoad, ASteepBurstOfNewIdentitiesExpandsOnceForItsOwnRate) {
  // family_bench's capacity mis-set "5x burst" on an 8-bit filter: 98,304
  // new identities a window, drawn at 4096 fine ticks a window and laid on
  // the filter's 192, 5x as many in the middle third. The active expands a
  // few ticks into the climb, while it has room left, by the factor the
  // climb's own rate (its last two ticks) asks for over a window: once, to
  // within 1.25x of the pre-sized figure for the most the window held
  // (1.09x). Sized by the last W / 8 ticks' rate, which still held the
  // ticks before the climb, it expanded by 3 and then again (1.63x);
  // expanding only when about to fill, by 5 (1.36x).
  KDEDUP_FIGURES_TEST();
  const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, 8);
  StreamSpec spec;
  spec.domain = 1ULL << 40;
  spec.base_rate = 24;
  spec.burst_factor = 5;
  spec.seed = 17;
  const auto events = fine_stream_on_ticks(spec, c.ticks_per_window);
  auto f = make(c);
  const LoadRun run = run_load(*f, events);
  EXPECT_EQ(run.counts.false_negatives, 0U);
  EXPECT_LE(run.counts.fp_rate(), 1.2 * c.fpp);
  EXPECT_EQ(run.expansions, 1U);
  const double most = static_cast<double>(presized_bytes(c, run.most));
  EXPECT_LE(static_cast<double>(run.peak), 1.25 * most)
      << static_cast<double>(run.peak) / most << "x";
}

TEST(MemoryFollowsLoad, AFoldKeepsEveryLiveEntry) {
  // An oversized sub-filter (a pre-sized filter 50x too large) that holds a
  // few thousand ids folds once the window has turned over: every id still
  // inside the window stays a duplicate, through the fold and until it
  // expires.
  FilterConfig c = config_of(FilterType::kTimer, 500'000, 8);
  auto made = TimerFilter::create_presized(c);
  ASSERT_TRUE(made);
  TimerFilter& f = **made;
  const std::uint64_t before = f.stats().bytes;
  const std::uint32_t window = c.ticks_per_window;
  std::uint64_t id = 0;
  std::vector<std::pair<std::uint64_t, Tick>> inserted;
  for (Tick t = 1; t <= 3 * window; ++t) {
    for (int i = 0; i < 50; ++i, ++id) {
      if (f.test_and_insert(identity_fingerprint(id, 5), t) == Decision::kDistinct) {
        inserted.emplace_back(id, t);
      }
    }
    if (t % 7 == 0) {
      // Everything delivered within the window is still there.
      for (const auto& [old, at] : inserted) {
        if (t - at <= window) {
          ASSERT_EQ(f.test_and_insert(identity_fingerprint(old, 5), t), Decision::kDuplicate)
              << "id " << old << " from tick " << at << " lost at tick " << t;
        }
      }
    }
  }
  EXPECT_LT(f.stats().bytes, before / 10) << "the oversized sub-filter did not fold";
  EXPECT_LE(f.fpp_budget_used(), c.fpp);
}

TEST(MemoryFollowsLoad, ARateFallingByLessThanHalfShrinksInPlace) {
  // Two windows at 20k ids a window, then four at 14k: a fall by 30%, where
  // no fold by an integer factor fits. The active merges line pairs down to
  // the lower rate in place: no second sub-filter (memory never above what
  // it held when the rate fell), back within 1.5x of the pre-sized figure
  // (1.42-1.47x; it kept the sub-filter sized for 20k before, 1.9x), no
  // false negative, false positives within the target; the batch path
  // shrinks at the same ticks, and a snapshot of the shrunk filter restores
  // to the same decisions.
  KDEDUP_FIGURES_TEST();
  for (std::uint8_t bits : {4, 8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    const std::uint32_t window = c.ticks_per_window;
    auto [all, fall_at] = two_rate_stream(window, 20'000, 14'000, 31 + bits);
    const Tick fall = 2 * (window + 1);
    // The last eighth is held back for the restore.
    const std::size_t rest = all.size() - (all.size() - fall_at) / 8;
    const std::vector<Event> events(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(rest));
    auto f = make(c);
    auto batch = make(c);
    std::uint64_t at_fall = 0, after_fall = 0;
    double worst_estimate = 0;
    auto counts = run_against_oracle(*f, events, 1, at_each_close(events, [&](Tick tick) {
      const std::uint64_t bytes = f->stats().bytes;
      if (tick <= fall) at_fall = bytes;
      if (tick > fall) after_fall = std::max(after_fall, bytes);
      // The first window's probes leave within it.
      if (tick > window + 1) {
        worst_estimate = std::max(worst_estimate, f->stats().fpp_estimate);
      }
    }));
    EXPECT_EQ(counts.false_negatives, 0U);
    EXPECT_LE(counts.fp_rate(), 1.2 * c.fpp);
    EXPECT_LE(worst_estimate, c.fpp);
    EXPECT_LE(after_fall, at_fall);
    const double presized = static_cast<double>(presized_bytes(c, 14'000));
    EXPECT_LE(static_cast<double>(f->stats().bytes), 1.5 * presized);
    EXPECT_EQ(f->stats().subfilters, 1U);
    EXPECT_LT(static_cast<double>(f->stats().bytes), 0.85 * static_cast<double>(at_fall));
    auto seq = run_against_oracle(*batch, events, 128);
    EXPECT_EQ(seq.false_positives, counts.false_positives);
    const std::string state = f->serialize();
    EXPECT_EQ(batch->serialize(), state);
    auto restored = restore_filter(state);
    ASSERT_TRUE(restored) << restored.error().message;
    EXPECT_EQ((*restored)->serialize(), state);
    // Its state holds each sub-filter's hash range after its line count
    // (format 2 on; 4 with the growth state), and a hash range outside
    // lines .. 2 x lines is refused.
    auto env = open_envelope(state, "test");
    ASSERT_TRUE(env);
    EXPECT_EQ(env->version, 4);
    const std::size_t lines_at = first_lines_at(f->config());
    std::uint64_t lines = 0, span = 0;
    std::memcpy(&lines, env->payload.data() + lines_at, 8);
    std::memcpy(&span, env->payload.data() + lines_at + 8, 8);
    EXPECT_GT(span, lines);
    EXPECT_LE(span, 2 * lines);
    for (const std::uint64_t bad : {lines - 1, 2 * lines + 1}) {
      std::string p(env->payload);
      std::memcpy(p.data() + lines_at + 8, &bad, 8);
      auto r = restore_filter(seal_envelope(env->kind, env->version, p));
      ASSERT_FALSE(r);
      EXPECT_NE(r.error().message.find("hash range"), std::string::npos) << r.error().message;
    }
    for (std::size_t i = rest; i < all.size(); ++i) {
      ASSERT_EQ((*restored)->test_and_insert(all[i].fp, all[i].tick),
                f->test_and_insert(all[i].fp, all[i].tick))
          << "event " << i;
    }
    EXPECT_EQ((*restored)->serialize(), f->serialize());
  }
}

// What a run of the growth-in-place tests saw, from the end of the first
// window's sub-filters on.
struct GrowthRun {
  std::uint64_t peak = 0;
  std::uint32_t most_subs = 0;
  double worst_estimate = 0;
  std::string state;  // a state taken with an expansion's copies alive
  std::size_t state_at = 0;

  void count_subfilters_and_estimate(const FilterStats& st) {
    most_subs = std::max(most_subs, st.subfilters);
    worst_estimate = std::max(worst_estimate, st.fpp_estimate);
  }
};

// What both growth-in-place tests ask of a run of `f` on `events`: no false
// negative, false positives and the estimate within the target, one
// sub-filter throughout, a peak within 2x and an end within 1.5x of the
// pre-sized figure for `ids` a window, and the batch path alike.
void expect_grew_in_place(const FilterConfig& c, const SlidingFilter& f,
                          const testing::OracleCounts& counts, const GrowthRun& run,
                          const std::vector<Event>& events, std::uint64_t ids) {
  EXPECT_EQ(counts.false_negatives, 0U);
  EXPECT_LE(counts.fp_rate(), 1.2 * c.fpp);
  EXPECT_LE(run.worst_estimate, c.fpp);
  EXPECT_EQ(run.most_subs, 1U);
  const double presized = static_cast<double>(presized_bytes(c, ids));
  EXPECT_LE(static_cast<double>(run.peak), 2.0 * presized);
  EXPECT_LE(static_cast<double>(f.stats().bytes), 1.5 * presized);
  auto batch = make(c);
  auto seq = run_against_oracle(*batch, events, 128);
  EXPECT_EQ(seq.false_positives, counts.false_positives);
  EXPECT_EQ(batch->serialize(), f.serialize());
}

// A state taken after event `at` restores to itself, equals a replay of the
// events up to it, and decides the rest as the replay does.
void expect_state_replays(const FilterConfig& c, const std::string& state, std::size_t at,
                          const std::vector<Event>& events) {
  auto restored = restore_filter(state);
  ASSERT_TRUE(restored) << restored.error().message;
  EXPECT_EQ((*restored)->serialize(), state);
  auto again = make(c);
  for (std::size_t i = 0; i <= at; ++i) {
    (void)again->test_and_insert(events[i].fp, events[i].tick);
  }
  EXPECT_EQ(again->serialize(), state);
  for (std::size_t i = at + 1; i < events.size(); ++i) {
    ASSERT_EQ((*restored)->test_and_insert(events[i].fp, events[i].tick),
              again->test_and_insert(events[i].fp, events[i].tick))
        << "event " << i;
  }
}

TEST(MemoryFollowsLoad, ALoadClimbingAfterTheFirstWindowExpandsTheActiveInPlace) {
  // Two windows at 20k new ids a window, then four at 40k: once the window
  // has turned over, the active about to fill is copied into twice its lines
  // (every line into the two that replace it) instead of being sealed
  // beside a new sub-filter. One sub-filter at every tick after the first
  // window, a peak within 2x of the pre-sized figure for 40k (1.31-1.34x;
  // the seal path held the full active and a successor sized for the new
  // rate together: 2.06x, 4-bit), no false negative, false positives and
  // the estimate within the target; the batch path expands at the same
  // ticks; a snapshot taken while the copies are alive holds them (format
  // 3 on), restores to the same decisions, and its expansion record is
  // validated.
  KDEDUP_FIGURES_TEST();
  for (std::uint8_t bits : {4, 8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    const std::uint32_t window = c.ticks_per_window;
    const auto events = two_rate_stream(window, 20'000, 40'000, 41 + bits).first;
    auto f = make(c);
    GrowthRun run;
    std::uint64_t before = 0;
    auto counts =
        run_against_oracle(*f, events, 1, [&](std::size_t i, const Event& e, Decision, bool) {
          if (i > 0 && events[i - 1].tick == e.tick) return;
          const auto st = f->stats();
          if (e.tick > 2 * (window + 1)) {
            run.peak = std::max(run.peak, st.bytes);
            run.count_subfilters_and_estimate(st);
            if (run.state.empty() && st.subfilters == 1 && st.bytes > before + before / 2) {
              run.state = f->serialize();
              run.state_at = i;
            }
          }
          before = st.bytes;
        });
    expect_grew_in_place(c, *f, counts, run, events, 40'000);

    ASSERT_FALSE(run.state.empty()) << "the active never expanded";
    auto env = open_envelope(run.state, "test");
    ASSERT_TRUE(env);
    EXPECT_EQ(env->version, 4);
    expect_state_replays(c, run.state, run.state_at, events);
    // The record after the hash range: a count, then tick and factor each.
    const std::size_t count_at = first_lines_at(f->config()) + 8 + 8;
    std::uint32_t n = 0, factor = 0;
    std::memcpy(&n, env->payload.data() + count_at, 4);
    ASSERT_EQ(n, 1U);
    std::memcpy(&factor, env->payload.data() + count_at + 4 + 8, 4);
    EXPECT_GE(factor, 2U);
    const auto refused = [&](std::size_t at, const void* bytes, std::size_t size,
                             const std::string& why) {
      std::string p(env->payload);
      std::memcpy(p.data() + at, bytes, size);
      auto r = restore_filter(seal_envelope(env->kind, env->version, p));
      ASSERT_FALSE(r) << why;
      EXPECT_NE(r.error().message.find(why), std::string::npos) << r.error().message;
    };
    const std::uint32_t one = 1, many = 5;
    refused(count_at, &many, 4, "expansion count");
    refused(count_at + 4 + 8, &one, 4, "below 2");
    const std::uint32_t huge = 1U << 30;
    refused(count_at + 4 + 8, &huge, 4, "do not divide");
    const Tick late = events.back().tick + 1000;
    refused(count_at + 4, &late, 8, "after the clock");
  }
}

TEST(MemoryFollowsLoad, AShrunkActiveExpandsInPlaceWhenTheRateClimbsBack) {
  // Two windows at 20k new ids a window, two at 14k (the active shrinks in
  // place, by merging line pairs), then three at 21k: the shrunk active
  // grows in place too, keeping its shape (three times its lines over three
  // times its hash range), where it was sealed beside a new sub-filter
  // before. One sub-filter from the second window on, a peak within 2x of
  // the pre-sized figure for 21k (1.89-1.96x; the seal path held two:
  // 2.39-2.40x) and an end within 1.5x (1.25-1.27x), no false negative,
  // false positives and the estimate within the target, the batch path
  // alike; a snapshot taken while the copies are alive (format 3 on, a hash
  // range wider than the lines) restores to the same decisions, and one
  // whose range before the expansion was odd is refused.
  KDEDUP_FIGURES_TEST();
  for (std::uint8_t bits : {4, 8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    const std::uint32_t window = c.ticks_per_window;
    const auto events =
        phased_stream(window, {{20'000, 2}, {14'000, 2}, {21'000, 3}}, 51 + bits).first;
    const Tick climb = 4 * (window + 1);
    auto f = make(c);
    GrowthRun run;  // the state: the first of a shrunk sub-filter with copies alive
    auto counts =
        run_against_oracle(*f, events, 1, [&](std::size_t i, const Event& e, Decision, bool) {
          if (i > 0 && events[i - 1].tick == e.tick) return;
          const auto st = f->stats();
          // The first window's sealed sub-filters have left.
          if (e.tick > 2 * (window + 1)) run.count_subfilters_and_estimate(st);
          if (e.tick < climb) return;
          run.peak = std::max(run.peak, st.bytes);
          if (run.state.empty()) {
            std::string now = f->serialize();
            if (auto env = open_envelope(now, "test"); env && first_expansions(c, env->payload)) {
              run.state = std::move(now);
              run.state_at = i;
            }
          }
        });
    expect_grew_in_place(c, *f, counts, run, events, 21'000);

    ASSERT_FALSE(run.state.empty()) << "the shrunk active never expanded";
    auto env = open_envelope(run.state, "test");
    ASSERT_TRUE(env);
    const std::size_t lines_at = first_lines_at(f->config());
    std::uint64_t lines = 0, span = 0;
    std::memcpy(&lines, env->payload.data() + lines_at, 8);
    std::memcpy(&span, env->payload.data() + lines_at + 8, 8);
    EXPECT_GT(span, lines) << "expanded, but not shrunk";
    expect_state_replays(c, run.state, run.state_at, events);
    // The expansion record follows the hash range: a count, then the tick
    // and factor of each. A hash range whose part before the expansion is
    // odd (within lines .. 2 x lines) is refused: the copies would not lie
    // where a query looks.
    const std::size_t count_at = lines_at + 16;
    std::uint32_t n = 0, factor = 0;
    std::memcpy(&n, env->payload.data() + count_at, 4);
    ASSERT_EQ(n, 1U);
    std::memcpy(&factor, env->payload.data() + count_at + 4 + 8, 4);
    const std::uint64_t before = lines / factor;
    const std::uint64_t odd = factor * (before % 2 == 1 ? before + 2 : before + 1);
    std::string p(env->payload);
    std::memcpy(p.data() + lines_at + 8, &odd, 8);
    auto r = restore_filter(
        seal_envelope(static_cast<std::uint16_t>(FilterType::kTimer), env->version, p));
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("hash range was odd"), std::string::npos) << r.error().message;
  }
}

TEST(MemoryFollowsLoad, ASubFilterSizedInTheFirstWindowShrinksOnceTheRateIsKnown) {
  // Identities drawn Zipf(1) from a domain ten times a window's draws: the
  // rate of new identities falls through the stream's first window as the
  // popular ones recur, and the sub-filter sized from its first ticks is
  // too large for what the window comes to hold. Once the stream has lived
  // a window it shrinks in place to what it will hold when its own first
  // entries leave, while the first window's sealed sub-filters still
  // drain: memory at its peak (from the end of the first window on) within
  // 2x of the pre-sized figure for the window's peak load (4-bit 1.94x,
  // 16-bit 1.91x; it kept its size until it had lived a window before:
  // 2.04x and 2.31x; the 8-bit filter folds in time either way, 1.22x), no
  // false negative, the estimate within the target, and false
  // positives on first queries within it (on a skewed stream one false
  // positive on a popular identity repeats at each of its arrivals).
  KDEDUP_FIGURES_TEST();
  for (std::uint8_t bits : {4, 8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    const std::uint32_t window = c.ticks_per_window;
    StreamSpec spec;
    spec.distribution = testing::Distribution::kZipf;
    spec.base_rate = 60'000.0 / (window + 1);
    spec.domain = 600'000;
    spec.ticks = 4 * (window + 1);
    spec.seed = 61 + bits;
    const auto events = generate_stream(spec);
    auto f = make(c);
    std::uint64_t peak = 0;
    InWindowCount in_window(window);
    double worst_estimate = 0;
    std::unordered_set<Fingerprint, FingerprintHash> asked;
    std::uint64_t first_queries = 0, first_fp = 0;
    auto counts = run_against_oracle(
        *f, events, 1, [&](std::size_t i, const Event& e, Decision d, bool in_oracle_window) {
          in_window.observe(e.tick, d == Decision::kDistinct, closes_tick(events, i), [&] {
            const auto st = f->stats();
            peak = std::max(peak, st.bytes);
            worst_estimate = std::max(worst_estimate, st.fpp_estimate);
          });
          // The first query of each absence (from the window's edge or never
          // delivered).
          if (!in_oracle_window && asked.insert(e.fp).second) {
            ++first_queries;
            first_fp += d == Decision::kDuplicate ? 1 : 0;
          }
          if (d == Decision::kDistinct) asked.erase(e.fp);
        });
    EXPECT_EQ(counts.false_negatives, 0U);
    EXPECT_LE(worst_estimate, c.fpp);
    EXPECT_LE(static_cast<double>(first_fp), 1.2 * c.fpp * static_cast<double>(first_queries));
    const double presized = static_cast<double>(presized_bytes(c, in_window.most));
    EXPECT_LE(static_cast<double>(peak), 2.0 * presized)
        << static_cast<double>(peak) / presized << "x at the peak";
    auto batch = make(c);
    auto seq = run_against_oracle(*batch, events, 128);
    EXPECT_EQ(seq.false_positives, counts.false_positives);
    EXPECT_EQ(batch->serialize(), f->serialize());
  }
}

// family_bench's "zipf1 steady" stream on filter ticks: 196,608 draws a
// window, Zipf(1) from a domain ten times that, for `windows` windows.
std::vector<Event> zipf_steady(std::uint32_t window, std::uint64_t windows) {
  StreamSpec spec;
  spec.distribution = testing::Distribution::kZipf;
  spec.base_rate = 196'608.0 / (window + 1);
  spec.domain = 1'966'080;
  spec.ticks = windows * (window + 1);
  spec.seed = 7;
  return generate_stream(spec);
}

TEST(MemoryFollowsLoad, ASealedSubFilterFoldsAsItDrains) {
  // The first window's sealed sub-filters take no insertions and drain
  // beside the active; each folds, or shrinks in place, to what its live
  // entries need at their share of the target, as long as the active keeps
  // the room the rate asks of it until they have drained (4-bit: 2 such
  // steps, 8-bit 3, 16-bit 4; they kept their size until they left
  // before). No false negative, the estimate within the target at every
  // event, the batch path alike, and a snapshot taken just after a sealed
  // one folded restores to the same decisions.
  for (std::uint8_t bits : {4, 8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    const auto events = zipf_steady(c.ticks_per_window, 2);
    auto f = make(c);
    const auto& timer = dynamic_cast<const TimerFilter&>(*f);
    std::vector<std::uint64_t> before = timer.subfilter_bytes();
    std::uint64_t drain_folds = 0;
    double worst_estimate = 0;
    std::string state;  // the first taken after a sealed one folded
    std::size_t state_at = 0;
    auto counts =
        run_against_oracle(*f, events, 1, [&](std::size_t i, const Event&, Decision, bool) {
          const std::vector<std::uint64_t> now = timer.subfilter_bytes();
          // The same sub-filters (new ones join at the back, expired ones
          // leave), the oldest sealed one smaller.
          if (now.size() >= 2 && now.size() == before.size() && now.front() < before.front()) {
            ++drain_folds;
            if (state.empty()) {
              state = f->serialize();
              state_at = i;
            }
          }
          before = now;
          worst_estimate = std::max(worst_estimate, f->stats().fpp_estimate);
        });
    EXPECT_GE(drain_folds, 2U);
    EXPECT_EQ(counts.false_negatives, 0U);
    EXPECT_LE(worst_estimate, c.fpp);
    // A snapshot of the folded sealed sub-filter beside the active restores
    // to the same decisions.
    ASSERT_FALSE(state.empty());
    expect_state_replays(c, state, state_at, events);
    auto batch = make(c);
    auto seq = run_against_oracle(*batch, events, 128);
    EXPECT_EQ(seq.false_positives, counts.false_positives);
    EXPECT_EQ(batch->serialize(), f->serialize());
  }
}

TEST(MemoryFollowsLoad, AStreamsStartEchoingEveryWindowDoesNotExpandASteadyFilter) {
  // The same stream, steady, on a 4-bit filter (a tick is a ninth of the
  // window). Every identity of the stream's first tick is new; they leave
  // together a window later, the popular ones come straight back, and so
  // every ninth tick inserts about a quarter more than the others. The
  // expansion rule read the rate over the last tick alone: after the
  // settled shrink (10% over what the window holds) one such tick asked
  // for more than a window's room, and the steady filter doubled in place
  // (2.65x the pre-sized figure to the end). The rate is now read over at
  // least two ticks: at most 1.5x once the first window's probes have
  // left (1.32x) and at the end, one sub-filter at the end, no false
  // negative.
  KDEDUP_FIGURES_TEST();
  const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, 4);
  const std::uint32_t window = c.ticks_per_window;
  const auto events = zipf_steady(window, 4);
  auto f = make(c);
  std::uint64_t peak = 0, echoes = 0;
  InWindowCount in_window(window);
  auto counts =
      run_against_oracle(*f, events, 1, [&](std::size_t i, const Event& e, Decision d, bool) {
        in_window.observe(e.tick, d == Decision::kDistinct, closes_tick(events, i), [&] {
          const std::uint64_t bytes = f->stats().bytes;
          peak = std::max(peak, bytes);
          // Once the first window's probes have left: the echoes alone.
          if (e.tick > 2 * (window + 1)) echoes = std::max(echoes, bytes);
        });
      });
  EXPECT_EQ(counts.false_negatives, 0U);
  const auto st = f->stats();
  EXPECT_EQ(st.subfilters, 1U);
  const double most = static_cast<double>(presized_bytes(c, in_window.most));
  const double end = static_cast<double>(presized_bytes(c, in_window.count));
  // No expansion on the echoes (one by 2 holds 2.6x); the peak of the whole
  // run is the first window's probe, held to the close of the tick in which
  // its first entries leave (2.17x: the first window's miss of issue 14's
  // peak target, docs/performance.md "The peak sampled as each tick
  // closes"), bounded here against a regression.
  EXPECT_LE(static_cast<double>(echoes), 1.5 * most) << static_cast<double>(echoes) / most << "x";
  EXPECT_LE(static_cast<double>(peak), 2.5 * most) << static_cast<double>(peak) / most << "x";
  EXPECT_LE(static_cast<double>(st.bytes), 1.5 * end) << static_cast<double>(st.bytes) / end << "x";
}

TEST(MemoryFollowsLoad, ABurstOfRepeatsExpandsTheActiveForWhatTheDomainHolds) {
  // family_bench's "uniform 5x burst" on filter ticks: 196,608 draws a
  // window from a domain of as many identities, 5x as often in the middle
  // third. New identities arrive fast at the burst's start (those outside
  // the window) and fewer as the domain fills: the window holds at most
  // the domain, which the share of repeats among the queries gives. The
  // active expands for that, early on the steep climb, where it expanded
  // by 4 for the first ticks' rate over a whole window; and it does not
  // shrink on the dip before the echo (the burst's first identities leave
  // together a window later and come straight back), where it shrank and
  // then expanded again. Memory at its peak (from the end of the first
  // window on) within 2x of the pre-sized figure for the most the window
  // held (8-bit 1.45x, 16-bit 1.49x; 2.89x and 3.54x before), no false
  // negative, the estimate within the target, false positives within 1.2x
  // of it, and the batch path alike.
  KDEDUP_FIGURES_TEST();
  for (std::uint8_t bits : {8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    expect_burst_held(c, generate_stream(repeats_burst(c.ticks_per_window, 196'608)));
  }
}

TEST(MemoryFollowsLoad, ABurstOfRepeatsExpandsOnceAtEveryScale) {
  // family_bench's "uniform 5x burst" at a fifth, half and 0.7 of its size
  // (a window of 39k to 138k draws from a domain of as many identities):
  // the same stream, scaled. The burst's first expansion by 2 leaves room
  // for the rest of it only once the copied entries leave and the domain
  // fills, and the rule that reads the rate as holding over the next W / 8
  // ticks expanded the active by 2 again a few ticks later, at most of
  // these scales (2.77x-2.86x; family_bench's own scale held by a few
  // percent of room, 1.46x). The window's schedule followed tick by tick
  // (schedule_factor()) holds it: one expansion, memory at its peak within
  // 2x of the pre-sized figure for the most the window held (1.39x-1.43x),
  // no false negative, the estimate within the target, false positives
  // within 1.2x of it, and the batch path alike.
  KDEDUP_FIGURES_TEST();
  for (const auto& [bits, scale] :
       {std::pair<std::uint8_t, double>{8, 0.2}, {8, 0.5}, {16, 0.2}, {16, 0.7}}) {
    SCOPED_TRACE(std::to_string(bits) + "-bit, scale " + std::to_string(scale));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    StreamSpec spec;
    spec.base_rate = 48 * scale;
    spec.domain = static_cast<std::uint64_t>(spec.base_rate * testing::kFineTicksPerWindow);
    spec.burst_factor = 5;
    spec.seed = 7;
    EXPECT_EQ(expect_burst_held(c, fine_stream_on_ticks(spec, c.ticks_per_window)).expansions, 1U);
  }
}

TEST(MemoryFollowsLoad, AYoungSubFilterShrinksInTheTickTheStreamHasLivedAWindow) {
  // family_bench's "zipf1 steady" at a tenth of its size, 16-bit timers:
  // the first window's new identities come fewer as the popular ones
  // recur, and the sub-filter sized from the rate of its first few hundred
  // ticks is twice what the window reaches. shrink_young() cuts it once the
  // stream has lived a window, but the test that waits for a settled rate
  // before any fold or shrink (what the active holds within 5% of what the
  // rate brings) held it back a few hundred ticks, beside the first
  // window's probe: 2.24x at the peak. Now the peak is within 2x of the
  // pre-sized figure for the most the window held (1.76x), no false
  // negative, the estimate within the target, the batch path alike.
  KDEDUP_FIGURES_TEST();
  const FilterConfig c = config_of(FilterType::kTimer, 19'660, 16);
  StreamSpec spec;
  spec.distribution = testing::Distribution::kZipf;
  spec.base_rate = 4.8;
  spec.domain = static_cast<std::uint64_t>(10 * spec.base_rate * testing::kFineTicksPerWindow);
  spec.seed = 7;
  expect_burst_held(c, fine_stream_on_ticks(spec, c.ticks_per_window));
}

TEST(MemoryFollowsLoad, AStepToSeveralTimesTheLoadExpandsTheActiveRatherThanSealingIt) {
  // family_bench's "A step sustained for two windows" (--short-bursts):
  // 96k new identities a window for three windows, then 6x or 10x that for
  // two, then 96k again. The expansion is worth it when it holds less than
  // the seal path's rate-sized successor; that successor was capped at 4x
  // what the window held, so the check turned down the expansion the step
  // needed, and the seal added, beside the full active, a sub-filter that
  // filled within the window and was sealed in its turn (8-bit 2.24x and
  // 2.09x, 16-bit 2.27x; the 16-bit 10x step sealed without expanding,
  // 1.98x). Judged against what the rate needs, the active expands: peak
  // within 2x of the pre-sized figure for the most the window held
  // (1.12x-1.23x), no false negative, the estimate within the target,
  // false positives within 1.2x of it, the batch path alike.
  KDEDUP_FIGURES_TEST();
  for (const auto& [bits, factor] :
       {std::pair<std::uint8_t, double>{8, 6}, {8, 10}, {16, 6}, {16, 10}}) {
    SCOPED_TRACE(std::to_string(bits) + "-bit, " + std::to_string(factor) + "x");
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    const auto events = step_stream(c.ticks_per_window, 96'000, factor);
    EXPECT_GE(expect_burst_held(c, events).expansions, 1U);
  }
}

TEST(MemoryFollowsLoad, AStepToFortyTimesTheLoadSizesItsThirdSubFilterFromTheRate) {
  // A step to 40x the load for two windows (24k new identities a window,
  // then 960k): the rate outruns kMaxGrowthStep x the window, so the
  // active is sealed beside a sub-filter 4x the window, which fills within
  // W / 8 ticks and was sealed beside another 4x, and that one beside one
  // sized from the rate: three seals, 2.1x the pre-sized figure for the
  // most the window held. The second one fills within W / 8 ticks of being
  // added: the rate that filled it has lasted its whole life, and its
  // successor is sized from it (seal_target(): 1.55x and 1.58x at 8 and 16
  // bits; 1.45x and 1.49x once the second one holds at most kSealStep x
  // the window). Peak within 2x, no false negative, the estimate within
  // the target, false positives within 1.2x of it, the batch path alike.
  KDEDUP_FIGURES_TEST();
  for (std::uint8_t bits : {8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    expect_burst_held(c, step_stream(c.ticks_per_window, 24'000, 40));
  }
}

TEST(MemoryFollowsLoad, ABurstWithinATickSealsBesideASubFilterSizedForTheWindowNotTheBurst) {
  // family_bench's "A burst shorter than the window" (--short-bursts): 96k
  // new identities a window, and from the fourth window on 100k more
  // within one tick. The active fills within the burst and is sealed; its
  // successor was sized for the burst's rate over a whole window, capped at
  // kMaxGrowthStep (4) x what the window held: 3.56x (8 bits) and 3.69x
  // (16) the pre-sized figure for the most the window held. Past the first
  // window it holds at most kSealStep x the window (a step that lasts
  // fills it within the growth horizon, and its successor is sized from
  // the rate: the 40x step above). Peak within 2x (1.76x and 1.82x), no
  // false negative, the estimate within the target, false positives within
  // 1.2x of it, the batch path alike.
  KDEDUP_FIGURES_TEST();
  for (std::uint8_t bits : {8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    expect_burst_held(c, testing::short_burst_stream(c.ticks_per_window, 96'000, 100'000, 1));
  }
}

TEST(MemoryFollowsLoad, TheAgingFilterDoesNotTakeABurstWithinATickForAWindowAtItsRate) {
  // The same burst through the aging filter (192 ticks a window). This
  // tick's insertions so far are a lower bound on the rate, and each slice
  // of the burst's tick was sized for that rate over a generation: the
  // tick's last slices for millions of identities (5.45x the pre-sized
  // figure for the most the window held). Past the first window, a
  // generation sized from the tick in progress holds at most kSurgeStep
  // (4) x the window's share of one: 1.48x with slices sized for
  // kRunHeadroom more generations (1.43x at ln 2). No false negative, the
  // estimate within the target, false positives within 1.2x of it, the
  // batch path alike.
  KDEDUP_FIGURES_TEST();
  const FilterConfig c = config_of(FilterType::kAging, 1'000'000);
  expect_burst_held(c, testing::short_burst_stream(c.ticks_per_window, 96'000, 100'000, 1), 1.5);
}

TEST(MemoryFollowsLoad, TheCompactFilterSizesATableAddedInASurgeFromWhatItsPredecessorTook) {
  // The same burst through the compact filter (10 ticks a window). The
  // active fills within the burst's tick, and so does the table added for
  // it; the third was sized for the tick so far over a whole window (1M
  // identities where the window holds 196k): 8.63x the pre-sized figure
  // for the most the window held. Now at most kMaxGrowthStep (4) x what
  // the second took: 3.62x. Steps that last are sized from their whole
  // ticks once seen: 6x and 40x within 2x (1.50x and 1.50x; the
  // 6x step read 2.03x when its rate-sized table, at one remainder bit
  // finer than the target needs, was replaced for a 2.7% saving). No false
  // negative, the estimate within the target, false positives within 1.2x
  // of it, the batch path alike.
  KDEDUP_FIGURES_TEST();
  const FilterConfig c = config_of(FilterType::kCompact, 1'000'000);
  expect_burst_held(c, testing::short_burst_stream(c.ticks_per_window, 96'000, 100'000, 1), 4.0);
  for (double factor : {6.0, 40.0}) {
    SCOPED_TRACE(factor);
    expect_burst_held(c, step_stream(c.ticks_per_window, 96'000, factor));
  }
}

TEST(MemoryFollowsLoad, TheAgingFilterHoldsItsTargetAlongARisingRate) {
  // While the rate rises, each generation (sized from the recent ticks'
  // rate, eq. 6) lasts less than (W + 2) / l ticks and the window holds
  // more than l of them: each one more is a run of k slices a query may
  // match. Sized at ln 2 the estimate passed the target along every rise
  // of family_bench --short-bursts (1.09x-1.35x), and so did the false
  // positives after a burst within a tick: 1.26% over the quarter window
  // from its tick. Slices are now sized for kRunHeadroom x l more
  // generations: the estimate within the target all along
  // (expect_burst_held), and so are those false positives (0.92%); the
  // peak within 2x.
  KDEDUP_FIGURES_TEST();
  const FilterConfig c = config_of(FilterType::kAging, 1'000'000);
  const std::uint32_t window = c.ticks_per_window;
  {
    SCOPED_TRACE("100k more within a tick");
    const auto events = testing::short_burst_stream(window, 96'000, 100'000, 1);
    const Tick burst = 3 * (window + 1);
    auto f = make(c);
    std::uint64_t fresh = 0, dropped = 0;
    (void)run_against_oracle(
        *f, events, 1, [&](std::size_t, const Event& e, Decision d, bool delivered) {
          if (e.tick < burst || e.tick >= burst + (window + 1) / 4 || delivered) return;
          ++fresh;
          dropped += d == Decision::kDuplicate ? 1 : 0;
        });
    EXPECT_GT(fresh, 100'000U);
    EXPECT_LE(static_cast<double>(dropped), c.fpp * static_cast<double>(fresh))
        << dropped << " of " << fresh;
  }
  for (const std::uint64_t ticks : {window / 16, window / 4, window + 1}) {
    SCOPED_TRACE("100k more over " + std::to_string(ticks) + " ticks");
    expect_burst_held(c, testing::short_burst_stream(window, 96'000, 100'000, ticks));
  }
  for (const double factor : {5.0, 40.0}) {
    SCOPED_TRACE(std::to_string(factor) + "x step");
    expect_burst_held(c, step_stream(window, 24'000, factor));
  }
}

TEST(MemoryFollowsLoad, AGentleClimbExpandsTheActiveWhileRoomIsLeft) {
  // family_bench's burst over a whole window (--short-bursts): 96k new
  // identities a window, and from the fourth window on 100k more spread
  // over a window, about twice the rate. Short of a steep climb, the
  // active expanded once its room would last fewer than kExpandAhead (2)
  // ticks: at 16 bits (4,096 ticks) with 69 identities of room left, the
  // copies alone had to keep up with twice the rate of what leaves, and
  // the factor was 3 for a need of 2.01 (2.01x the pre-sized figure for
  // the most the window held). It now expands once its room would last
  // fewer than kGentleAheadShare x the growth horizon's ticks, by 2:
  // within 1.5x at both widths (8 bits 1.32x either way, 16 bits 1.34x),
  // one expansion, no false negative, the estimate within the target,
  // false positives within 1.2x of it, the batch path alike.
  KDEDUP_FIGURES_TEST();
  for (std::uint8_t bits : {8, 16}) {
    SCOPED_TRACE(int(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, bits);
    const std::uint32_t window = c.ticks_per_window;
    const auto events = testing::short_burst_stream(window, 96'000, 100'000, window + 1);
    EXPECT_EQ(expect_burst_held(c, events, 1.5).expansions, 1U);
  }
}

TEST(MemoryFollowsLoad, ATenfoldStepOnAFourBitFilterExpandsItsSuccessorOnce) {
  // The same 10x step on a 4-bit filter (a tick is an eighth of the
  // window): the step fills the active within its first tick and seals it,
  // and the successor is sized from that part of the tick (50,000 lines).
  // It expanded by 2 for what the rate over the last ticks needs, by 2
  // again three ticks later, and was then sealed beside a third sub-filter
  // (3.81x). The factor now takes what the window's schedule needs as well
  // where no domain caps the window: once, by 3, and the peak is within 2x
  // of the pre-sized figure for the most the window held (1.95x), no false
  // negative, the estimate within the target, false positives within 1.2x
  // of it, the batch path alike.
  KDEDUP_FIGURES_TEST();
  const FilterConfig c = config_of(FilterType::kTimer, 1'000'000, 4);
  const auto events = step_stream(c.ticks_per_window, 96'000, 10);
  auto f = make(c);
  auto& timer = dynamic_cast<TimerFilter&>(*f);
  std::vector<std::uint64_t> before;
  std::uint64_t grown = 0;  // ticks at which the newest sub-filter grew
  run_load(*f, events, [&] {
    const std::vector<std::uint64_t> now = timer.subfilter_bytes();
    grown += now.size() == before.size() && now.back() > before.back() ? 1 : 0;
    before = now;
  });
  EXPECT_EQ(grown, 1U);
  expect_burst_held(c, events);
}

TEST(MemoryFollowsLoad, ASealedSubFilterFoldsInTheTickTheActiveExpands) {
  // family_bench's "zipf1 5x burst" on a 4-bit filter (a tick is an eighth
  // of the window): the step seals the active within a tick, and the
  // rate-sized successor expands in place by 2 a few ticks later, while the
  // sealed one still drains beside it. The sealed one's fold waits for room
  // in the active (its guard); the expansion gives it that room, and the
  // fold now follows in the same tick rather than the next one, when the
  // filter held both at full size (the run's peak). Peak within 2x of the
  // pre-sized figure for the most the window held (1.94x; 2.07x before),
  // no false negative, the estimate within the target, the batch path
  // alike.
  KDEDUP_FIGURES_TEST();
  const FilterConfig c = config_of(FilterType::kTimer, 196'608, 4);
  StreamSpec spec;
  spec.distribution = testing::Distribution::kZipf;
  spec.domain = 10 * 48 * testing::kFineTicksPerWindow;
  spec.base_rate = 48;
  spec.burst_factor = 5;
  spec.seed = 7;
  const auto events = fine_stream_on_ticks(spec, c.ticks_per_window);
  auto f = make(c);
  auto& timer = dynamic_cast<TimerFilter&>(*f);
  std::vector<std::uint64_t> before;
  std::uint64_t expansions_beside_sealed = 0, folded_with_them = 0;
  // At each tick's close from the first window's end on (expansions wait
  // for the window to turn over).
  const LoadRun run = run_load(*f, events, [&] {
    const std::vector<std::uint64_t> now = timer.subfilter_bytes();
    if (now.size() == 2 && before.size() == 2 && now.back() > before.back()) {
      ++expansions_beside_sealed;
      folded_with_them += now.front() < before.front() ? 1 : 0;
    }
    before = now;
  });
  EXPECT_GE(expansions_beside_sealed, 1U);
  EXPECT_EQ(folded_with_them, expansions_beside_sealed);
  EXPECT_EQ(run.counts.false_negatives, 0U);
  EXPECT_LE(run.worst_estimate, c.fpp);
  const double most = static_cast<double>(presized_bytes(c, run.most));
  EXPECT_LE(static_cast<double>(run.peak), 2.0 * most)
      << static_cast<double>(run.peak) / most << "x";
  auto batch = make(c);
  run_against_oracle(*batch, events, 128);
  EXPECT_EQ(batch->serialize(), f->serialize());
}

TEST(MemoryFollowsLoad, ARestoredOversizedFilterShrinks) {
  // A snapshot taken at the peak of a burst, restored and fed the base rate
  // again: the restored filter shrinks as the original would, to within
  // 1.5x of the pre-sized figure two windows later, and keeps every identity
  // it delivered (before and after the snapshot) for the whole window.
  for (const Kind& kind : kGrowingKinds) {
    SCOPED_TRACE(kind.name);
    const FilterConfig c = config_of(kind.type, 1'000'000, kind.bits);
    const std::uint32_t window = c.ticks_per_window;
    // Ids per window whose pre-sized filter is well above the 64 KiB floor.
    const std::uint64_t ids = kind.type == FilterType::kCompact ? 100'000 : 20'000;
    const double base = static_cast<double>(ids) / (window + 1);
    const auto events = burst_stream(window, base, 11 + kind.bits);
    const Tick burst_end = 4 * (window + 1);  // the burst is the middle third of six windows
    auto original = make(c);
    std::vector<std::pair<Fingerprint, Tick>> delivered;
    std::size_t i = 0;
    for (; i < events.size() && events[i].tick < burst_end; ++i) {
      if (original->test_and_insert(events[i].fp, events[i].tick) == Decision::kDistinct) {
        delivered.emplace_back(events[i].fp, events[i].tick);
      }
    }
    const std::uint64_t peak = original->stats().bytes;
    auto restored = restore_filter(original->serialize());
    ASSERT_TRUE(restored) << restored.error().message;
    SlidingFilter& f = **restored;
    EXPECT_EQ(f.stats().bytes, peak);  // still inside the burst's window: nothing to shrink
    for (; i < events.size(); ++i) {
      if (f.test_and_insert(events[i].fp, events[i].tick) == Decision::kDistinct) {
        delivered.emplace_back(events[i].fp, events[i].tick);
      }
    }
    const Tick now = events.back().tick;
    for (const auto& [fp, at] : delivered) {
      if (now - at <= window) {
        ASSERT_EQ(f.test_and_insert(fp, now), Decision::kDuplicate);
      }
    }
    const std::uint64_t presized = presized_bytes(c, ids);
    EXPECT_LT(f.stats().bytes, peak / 3);
    EXPECT_LE(static_cast<double>(f.stats().bytes), 1.5 * static_cast<double>(presized));
    EXPECT_LE(f.stats().fpp_estimate, c.fpp);
  }
}

TEST(MemoryFollowsLoad, AFilterRestoredAnywhereAlongABurstDecidesAndGrowsAsOneNeverRestored) {
  // A restart must not change what the filter does next. Each growing
  // filter is snapshotted and restored at every eighth of a window (every
  // tick at 4 bits) along family_bench's uniform 5x burst of repeats, a
  // Zipf 5x burst and a 5x burst of new identities, beside one never
  // restored: each decision and each state in between is the same. Before
  // the timer filter's growth state was serialized (timer state format 4),
  // a restore at the burst's start expanded for its first ticks' rate (8-bit
  // peak 2.89x the pre-sized figure, 1.45x unrestored) and one in the echo
  // shrank and expanded again (2.36x). The compact and aging filters keep
  // their rates in their states too (the compact filter's tick counts, the
  // aging filter's slices). Every filter also along a burst of new
  // identities within a tick, and the timer filter along a 40x step: there
  // a timer seal's successor holds at most kSealStep x the window and the
  // next one is sized from the rate (seal_target()), and an aging
  // generation sized from the tick in progress at most kSurgeStep x its
  // share; besides every eighth of a window, a restore every 25,000 events
  // lands within the tick of a burst.
  constexpr Kind kinds[] = {{"timer-4", FilterType::kTimer, 4},
                            {"timer-8", FilterType::kTimer, 8},
                            {"timer-16", FilterType::kTimer, 16},
                            {"compact", FilterType::kCompact, 8},
                            {"aging", FilterType::kAging, 8}};
  for (const Kind& kind : kinds) {
    const FilterConfig c = config_of(kind.type, 1'000'000, kind.bits);
    const std::uint32_t window = c.ticks_per_window;
    const StreamSpec spec = repeats_burst(window, 49'152);
    StreamSpec zipf = spec;
    zipf.distribution = testing::Distribution::kZipf;
    std::vector<std::pair<const char*, std::vector<Event>>> streams = {
        {"uniform", generate_stream(spec)},
        {"zipf", generate_stream(zipf)},
        {"new identities", burst_stream(window, 20'000.0 / (window + 1), 3)}};
    streams.emplace_back("burst within a tick",
                         testing::short_burst_stream(window, 96'000, 100'000, 1));
    if (kind.type == FilterType::kTimer)
      streams.emplace_back("40x step", step_stream(window, 24'000, 40));
    for (const auto& [name, events] : streams) {
      SCOPED_TRACE(std::string(kind.name) + ", " + name);
      auto never = make(c);
      auto restored = make(c);
      const Tick every = std::max<Tick>(1, (window + 1) / 8);
      Tick next = every;
      std::uint64_t restores = 0, resized = 0, bytes = 0;
      for (std::size_t i = 0; i < events.size(); ++i) {
        const Event& e = events[i];
        const bool eighth = e.tick >= next;
        if (eighth || i % 25'000 == 24'999) {
          if (eighth) next = e.tick + every;
          const std::string state = restored->serialize();
          ASSERT_EQ(state, never->serialize())
              << "before event " << i << " (tick " << e.tick << ")";
          auto again = restore_filter(state);
          ASSERT_TRUE(again) << again.error().message;
          restored = std::move(*again);
          ++restores;
          // Resized since the last restore, after the first window.
          resized += e.tick > window + 1 && never->stats().bytes != bytes ? 1 : 0;
          bytes = never->stats().bytes;
        }
        ASSERT_EQ(restored->test_and_insert(e.fp, e.tick), never->test_and_insert(e.fp, e.tick))
            << "event " << i << " (tick " << e.tick << ")";
      }
      EXPECT_EQ(restored->serialize(), never->serialize());
      EXPECT_GE(restores, 40U);
      EXPECT_GE(resized, 2U) << "the burst must grow the filter and its end shrink it";
    }
  }
}

TEST(MemoryFollowsLoad, AQuietFilterAndItsSnapshotHoldTheFloor) {
  // A pre-sized 30 MiB filter (what a capacity-sized filter of an older
  // version held) whose content has all expired (a partition that went
  // quiet) is back at its floor, and so is a filter restored from its
  // snapshot. (A snapshot taken before that tick shrinks at the same tick
  // of its own clock: restore() runs the same check.)
  for (FilterType type : {FilterType::kTimer, FilterType::kCompact}) {
    SCOPED_TRACE(to_string(type));
    FilterConfig c = config_of(type, 5'000'000, 8);
    std::unique_ptr<SlidingFilter> f;
    if (type == FilterType::kTimer) {
      f = std::move(*TimerFilter::create_presized(c));
    } else {
      f = std::move(*CompactFilter::create_presized(c));
    }
    ASSERT_GT(f->stats().bytes, 4 * c.min_bytes);
    for (std::uint64_t id = 0; id < 1000; ++id) {
      (void)f->test_and_insert(identity_fingerprint(id, 7), 10);
    }
    for (Tick t = 11; t < 10 + 2 * c.ticks_per_window; ++t) f->advance(t);
    EXPECT_LE(f->stats().bytes, c.min_bytes + 16 * 1024);
    auto restored = restore_filter(f->serialize());
    ASSERT_TRUE(restored);
    EXPECT_LE((*restored)->stats().bytes, c.min_bytes + 16 * 1024);
  }
}

// --- under a budget ---------------------------------------------------------------

struct BudgetRun {
  testing::OracleCounts counts;
  double worst_estimate = 0;     // largest estimate reported during the load
  std::uint64_t worst_used = 0;  // largest reservation
  std::uint32_t worst_level = 0;
};

// Two filters sharing `budget`, fed the same stream with other identities,
// interleaved tick by tick as two partitions' workers run side by side, each
// next to its exact oracle; the budget and the estimates are read at every
// tick.
BudgetRun run_two(FilterType type, std::uint8_t bits, const std::shared_ptr<MemoryBudget>& budget,
                  const std::vector<Event>& events, double fpp = 0.01) {
  const FilterConfig c = config_of(type, 1'000, bits, fpp, 4096);
  std::unique_ptr<SlidingFilter> filters[2] = {make(c), make(c)};
  FilterConfig oc;
  oc.type = FilterType::kExact;
  oc.ticks_per_window = c.ticks_per_window;
  ExactFilter oracles[2] = {ExactFilter(oc), ExactFilter(oc)};
  for (auto& f : filters) f->set_memory_budget(budget);
  BudgetRun r;
  std::size_t i = 0;
  while (i < events.size()) {
    std::size_t end = i;
    while (end < events.size() && events[end].tick == events[i].tick) ++end;
    for (int p = 0; p < 2; ++p) {
      for (std::size_t j = i; j < end; ++j) {
        Fingerprint fp = events[j].fp;
        fp.lo ^= static_cast<std::uint64_t>(p) * 0x5555;
        const bool delivered = oracles[p].contains(fp, events[j].tick);
        const Decision d = filters[p]->test_and_insert(fp, events[j].tick);
        ++r.counts.events;
        if (d == Decision::kDistinct) {
          oracles[p].insert(fp, events[j].tick);
          ++(delivered ? r.counts.false_negatives : r.counts.true_negatives);
        } else {
          ++(delivered ? r.counts.true_positives : r.counts.false_positives);
        }
      }
      r.worst_estimate = std::max(r.worst_estimate, filters[p]->stats().fpp_estimate);
    }
    r.worst_used = std::max(r.worst_used, budget->used());
    r.worst_level = std::max(r.worst_level, budget->level());
    i = end;
  }
  return r;
}

// Three windows of `per_window` distinct identities a window, uniformly.
std::vector<Event> three_windows(std::uint32_t window, double per_window, std::uint64_t seed) {
  StreamSpec spec;
  spec.domain = 1ULL << 40;
  spec.base_rate = per_window / (window + 1);
  spec.ticks = 3 * (window + 1);
  spec.seed = seed;
  return generate_stream(spec);
}

TEST(MemoryBudgetFilters, AllTypesStayWithinTheBudgetWithoutFalseNegatives) {
  for (FilterType type : {FilterType::kTimer, FilterType::kAging, FilterType::kCompact}) {
    for (std::uint8_t bits : {4, 8, 16}) {
      if (type != FilterType::kTimer && bits != 8) continue;
      SCOPED_TRACE(std::string(to_string(type)) + " " + std::to_string(bits));
      const FilterConfig c = config_of(type, 1'000, bits, 0.01, 4096);
      const std::uint32_t window = c.ticks_per_window;
      // 30k ids per window per filter: a pre-sized pair needs about
      // 2 x 30k x (15..235 bits) / 8; the budget is half of that.
      const std::uint64_t need = 2 * presized_bytes(c, 30'000);
      const std::uint64_t limit = need / 2;
      auto budget = budget_of(limit, c.fpp);
      const BudgetRun r = run_two(type, bits, budget, three_windows(window, 30'000, 41));
      EXPECT_EQ(r.counts.false_negatives, 0U);
      // Within the budget, plus each filter's floor (charged past it).
      EXPECT_LE(r.worst_used, limit + 2 * c.min_bytes);
      EXPECT_GE(r.worst_level, 1U) << "the budget was never short";
      // The filters report the fpp they run at: what was observed is within it.
      EXPECT_GT(r.worst_estimate, c.fpp);
      EXPECT_LE(r.counts.fp_rate(), 1.2 * r.worst_estimate);
    }
  }
}

TEST(MemoryBudgetFilters, ACompactTableGrantedLessThanItAskedTakesAllOfIt) {
  // family_bench's budget table: four compact filters at fpp 0.1%, 50k new
  // identities a window each, under a budget a tenth short of what they
  // need at the target, for six windows. A table the budget grants less
  // than it asked for takes every line it was granted: rounded down to a
  // multiple of 16 lines it filled sooner, and over the last three windows
  // the worst partition dropped 6% of its new identities at an effective
  // target of 1.6% (the worst estimate 14%).
  constexpr int kPartitions = 4;
  constexpr std::uint64_t kPerWindow = 50'000;
  const FilterConfig c = config_of(FilterType::kCompact, 1'000, 8, 0.001, 4096);
  const std::uint32_t window = c.ticks_per_window;
  const double need = kPartitions * static_cast<double>(presized_bytes(c, kPerWindow));
  auto budget = budget_of(static_cast<std::uint64_t>(need / 1.1), c.fpp);
  FilterConfig oc;
  oc.type = FilterType::kExact;
  oc.ticks_per_window = window;
  std::vector<std::unique_ptr<SlidingFilter>> filters;
  std::vector<ExactFilter> oracles;
  for (int p = 0; p < kPartitions; ++p) {
    filters.push_back(make(c));
    filters.back()->set_memory_budget(budget);
    oracles.emplace_back(oc);
  }
  std::vector<testing::OracleCounts> scored(kPartitions);
  std::uint64_t false_negatives = 0, id = 0;
  double worst_estimate = 0;
  for (Tick t = 0; t < 6 * (window + 1); ++t) {
    for (int p = 0; p < kPartitions; ++p) {
      for (std::uint64_t i = 0; i < kPerWindow / (window + 1); ++i) {
        const Fingerprint fp = identity_fingerprint(id++, 31 + p);
        const bool delivered = oracles[p].contains(fp, t);
        const Decision d = filters[p]->test_and_insert(fp, t);
        if (d == Decision::kDistinct) {
          oracles[p].insert(fp, t);
          false_negatives += delivered ? 1 : 0;
        }
        if (t >= 3 * (window + 1) && !delivered) {
          ++(d == Decision::kDistinct ? scored[p].true_negatives : scored[p].false_positives);
        }
      }
      if (t >= 3 * (window + 1)) {
        worst_estimate = std::max(worst_estimate, filters[p]->stats().fpp_estimate);
      }
    }
  }
  EXPECT_EQ(false_negatives, 0U);
  const double effective = budget->effective_fpp();
  ASSERT_GT(effective, c.fpp) << "the budget was never short";
  EXPECT_LE(worst_estimate, effective);
  for (int p = 0; p < kPartitions; ++p) {
    EXPECT_LE(scored[p].fp_rate(), effective) << "partition " << p;
  }
}

TEST(MemoryBudgetFilters, ALoadRisingThroughTheWindowStaysWithinTheRaisedTarget) {
  // Two partitions with 8-bit timers, a batch of 2,500 new identities each
  // every 10 ticks for 12 batches (60k in 120 of the window's 192 ticks),
  // against a budget of 2/3 of what they need at fpp 0.1%; partition 0's
  // worker takes each batch a tick before partition 1's, so it sizes its
  // sub-filters before the other's demand is known. The level must rise with
  // the load, the first filter give back what it took beyond its share, and
  // a refused filter reject rather than saturate: what both drop stays
  // within the raised target. (With the level one step per 1/8 window and
  // the active overfilled without bound: 48% of new identities dropped, the
  // effective target 1.6%.)
  const FilterConfig c = config_of(FilterType::kTimer, 1'000, 8, 0.001, 4096);
  const std::uint64_t limit = presized_bytes(c, 60'000) * 2 / 3;
  auto budget = budget_of(limit, c.fpp);
  std::unique_ptr<SlidingFilter> filters[2] = {make(c), make(c)};
  for (auto& f : filters) f->set_memory_budget(budget);
  FilterConfig oc;
  oc.type = FilterType::kExact;
  oc.ticks_per_window = c.ticks_per_window;
  ExactFilter oracles[2] = {ExactFilter(oc), ExactFilter(oc)};
  testing::OracleCounts counts;
  double worst_effective = c.fpp;
  std::uint64_t worst_used = 0;
  std::uint64_t id = 0;
  for (Tick t = 0; t < 130; ++t) {
    for (int p = 0; p < 2; ++p) {
      const bool batch = t % 10 == static_cast<Tick>(p) && t / 10 < 12;
      for (int i = 0; batch && i < 2'750; ++i) {
        // One in ten a resend of the batch's first identities.
        const std::uint64_t at = i < 2'500 ? id++ : id - 2'500 + (i - 2'500) * 10;
        const Fingerprint fp = identity_fingerprint(at, 29);
        const bool delivered = oracles[p].contains(fp, t);
        const Decision d = filters[p]->test_and_insert(fp, t);
        if (d == Decision::kDistinct) {
          oracles[p].insert(fp, t);
          ++(delivered ? counts.false_negatives : counts.true_negatives);
        } else {
          ++(delivered ? counts.true_positives : counts.false_positives);
        }
      }
      filters[p]->advance(t);
    }
    worst_effective = std::max(worst_effective, budget->effective_fpp());
    worst_used = std::max(worst_used, budget->used());
  }
  EXPECT_EQ(counts.false_negatives, 0U);
  EXPECT_LE(worst_used, limit + 2 * c.min_bytes);
  EXPECT_GT(worst_effective, c.fpp) << "the budget was never short";
  EXPECT_LE(counts.fp_rate(), worst_effective)
      << counts.false_positives << " false positives, effective fpp up to " << worst_effective;
}

TEST(MemoryBudgetFilters, ASaturatedTimerFilterReportsWhatItDrops) {
  // 8x short of what the load needs at fpp 0.1%: the timer filters saturate
  // (most new identities are judged duplicates). Insertions are then no
  // longer independent of the cells (only an identity with an empty cell is
  // inserted), the model's count understates the fill, and the estimate is
  // read from the cells: it must still cover what was observed.
  for (std::uint8_t bits : {4, 8, 16}) {
    SCOPED_TRACE("timer " + std::to_string(bits));
    const FilterConfig c = config_of(FilterType::kTimer, 1'000, bits, 0.001, 4096);
    const std::uint32_t window = c.ticks_per_window;
    const std::uint64_t limit = 2 * presized_bytes(c, 30'000) / 8;
    auto budget = budget_of(limit, c.fpp);
    const BudgetRun r =
        run_two(FilterType::kTimer, bits, budget, three_windows(window, 30'000, 43), c.fpp);
    EXPECT_EQ(r.counts.false_negatives, 0U);
    EXPECT_GT(r.counts.fp_rate(), 0.25) << "the filters did not saturate";
    EXPECT_LE(r.counts.fp_rate(), r.worst_estimate);
  }
}

TEST(MemoryBudgetFilters, ACompactFilterThatCannotGrowNarrowsThenRejectsNeverForgets) {
  // A budget that holds the floor and little more, and a window's worth of
  // new identities far beyond it: the compact filter narrows its table in
  // place, then judges the identities it has no room for duplicates. It
  // never holds more than the budget and its floor, forgets no identity it
  // delivered, and its estimate covers the false positives it made.
  const FilterConfig c = config_of(FilterType::kCompact, 1'000, 8, 0.01, 4096);
  auto budget = budget_of(3 * c.min_bytes, c.fpp);
  auto f = make(c);
  f->set_memory_budget(budget);
  auto& compact = dynamic_cast<CompactFilter&>(*f);
  FilterConfig oc;
  oc.type = FilterType::kExact;
  oc.ticks_per_window = c.ticks_per_window;
  ExactFilter oracle(oc);
  std::uint64_t fp = 0, fresh = 0, fn = 0, most = 0;
  unsigned narrowest = compact.fingerprint_bits();
  double worst_estimate = 0;
  for (std::uint64_t id = 0; id < 40'000; ++id) {
    const Tick t = id / 8'000;
    const Fingerprint x = identity_fingerprint(id, 17);
    const bool delivered = oracle.contains(x, t);
    const Decision d = f->test_and_insert(x, t);
    if (d == Decision::kDistinct) {
      oracle.insert(x, t);
      fn += delivered ? 1 : 0;
    } else if (!delivered) {
      ++fp;
    }
    fresh += delivered ? 0 : 1;
    most = std::max(most, budget->used());
    narrowest = std::min(narrowest, compact.table_fingerprint_bits().back());
    if (id % 1'000 == 999) worst_estimate = std::max(worst_estimate, f->stats().fpp_estimate);
  }
  EXPECT_EQ(fn, 0U);
  EXPECT_LE(most, budget->max_bytes() + c.min_bytes);
  EXPECT_LT(narrowest, compact.fingerprint_bits());  // narrowed in place
  EXPECT_GT(compact.rejected_in_window(), 0U);       // then out of room
  const double fp_rate = static_cast<double>(fp) / static_cast<double>(fresh);
  EXPECT_GT(fp_rate, c.fpp);
  EXPECT_LE(fp_rate, 1.2 * worst_estimate);
}

TEST(MemoryBudgetFilters, TheTargetReturnsWhenTheLoadFalls) {
  for (FilterType type : {FilterType::kTimer, FilterType::kAging, FilterType::kCompact}) {
    SCOPED_TRACE(to_string(type));
    const FilterConfig c = config_of(type, 1'000, 8, 0.01, 4096);
    const std::uint32_t window = c.ticks_per_window;
    const std::uint64_t need = presized_bytes(c, 40'000);
    auto budget = budget_of(need / 2, c.fpp);
    auto f = make(c);
    f->set_memory_budget(budget);
    // Two windows at the rate that needs 2x the budget, then four at a 20th.
    // (The level during the first two: an aging filter refused its slices
    // inserts less, publishes less demand, and the level may fall before
    // the load does.)
    std::uint64_t id = 0;
    Tick t = 0;
    std::uint32_t highest = 0;
    for (; t < 2 * (window + 1); ++t) {
      for (int i = 0; i < static_cast<int>(40'000 / (window + 1)); ++i) {
        (void)f->test_and_insert(identity_fingerprint(id++, 8), t);
      }
      highest = std::max(highest, budget->level());
    }
    EXPECT_GE(highest, 1U);
    for (; t < 6 * (window + 1); ++t) {
      for (int i = 0; i < static_cast<int>(2'000 / (window + 1)) + 1; ++i) {
        (void)f->test_and_insert(identity_fingerprint(id++, 8), t);
      }
    }
    EXPECT_EQ(budget->level(), 0U);
    EXPECT_LE(f->stats().fpp_estimate, c.fpp);
    EXPECT_LT(budget->used(), budget->max_bytes());
  }
}

TEST(MemoryBudgetFilters, AQuietFilterStopsHoldingTheLevelUp) {
  // Two partitions under a load that needs twice the budget; then one goes
  // quiet (no record: its event-time clock stands still) and the other gets
  // a trickle. The quiet one's demand still says what its window needs at
  // the target, which keeps the level up for the other one for as long as
  // it stays quiet; once told it is quiet (the pipeline does after a while
  // of wall time), it asks for no more than it holds, and the level falls.
  for (FilterType type : {FilterType::kTimer, FilterType::kAging, FilterType::kCompact}) {
    SCOPED_TRACE(to_string(type));
    const FilterConfig c = config_of(type, 1'000, 8, 0.01, 4096);
    const std::uint32_t window = c.ticks_per_window;
    auto budget = budget_of(presized_bytes(c, 40'000), c.fpp);
    auto quiet = make(c), busy = make(c);
    quiet->set_memory_budget(budget);
    busy->set_memory_budget(budget);
    std::uint64_t id = 0;
    Tick t = 0;
    std::uint32_t highest = 0;  // (the aging filter's level may fall first: the test above)
    for (; t < 2 * (window + 1); ++t) {
      for (auto* f : {quiet.get(), busy.get()}) {
        for (int i = 0; i < static_cast<int>(40'000 / (window + 1)); ++i) {
          (void)f->test_and_insert(identity_fingerprint(id++, 8), t);
        }
      }
      highest = std::max(highest, budget->level());
    }
    ASSERT_GE(highest, 1U);
    auto trickle = [&](Tick until) {
      for (; t < until; ++t) {
        for (int i = 0; i < static_cast<int>(2'000 / (window + 1)) + 1; ++i) {
          (void)busy->test_and_insert(identity_fingerprint(id++, 8), t);
        }
      }
    };
    trickle(6 * (window + 1));
    // (The aging filter's demand follows its last tick's insertions, which
    // fit this budget by themselves here: only the fall is checked for it.)
    if (type != FilterType::kAging) {
      EXPECT_GE(budget->level(), 1U) << "the quiet filter's demand no longer holds the level up";
    }
    const std::uint64_t stale = budget->demand(0);
    quiet->quiet();
    if (type != FilterType::kAging) {
      EXPECT_LT(budget->demand(0), stale);
    }
    trickle(10 * (window + 1));
    EXPECT_EQ(budget->level(), 0U);
    EXPECT_LE(busy->stats().fpp_estimate, c.fpp);
  }
}

TEST(MemoryBudgetFilters, ReleasedWhenTheFilterGoes) {
  auto budget = budget_of(0);
  for (FilterType type :
       {FilterType::kTimer, FilterType::kAging, FilterType::kExact, FilterType::kCompact}) {
    {
      auto f = make(config_of(type, 1'000));
      f->set_memory_budget(budget);
      EXPECT_GT(budget->used(), 0U) << to_string(type);
      for (std::uint64_t id = 0; id < 50'000; ++id) {
        (void)f->test_and_insert(identity_fingerprint(id, 9), id / 500);
      }
      // What is charged is the filter state it reports (less bookkeeping).
      EXPECT_LE(budget->used(), f->stats().bytes) << to_string(type);
      EXPECT_GE(budget->used(), f->stats().bytes / 2) << to_string(type);
    }
    EXPECT_EQ(budget->used(), 0U) << to_string(type);
  }
}

TEST(MemoryBudgetFilters, TheExactFilterIsCountedButNeverLimited) {
  auto budget = budget_of(64 * 1024);
  auto f = make(config_of(FilterType::kExact, 1'000));
  f->set_memory_budget(budget);
  for (std::uint64_t id = 0; id < 20'000; ++id) {
    ASSERT_EQ(f->test_and_insert(identity_fingerprint(id, 10), 1 + id / 1000), Decision::kDistinct);
  }
  EXPECT_GT(budget->used(), budget->max_bytes());
  for (std::uint64_t id = 19'000; id < 20'000; ++id) {
    ASSERT_EQ(f->test_and_insert(identity_fingerprint(id, 10), 20), Decision::kDuplicate);
  }
}

}  // namespace
}  // namespace kdedup::filter
