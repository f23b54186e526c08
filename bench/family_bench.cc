// The filter family side by side: timer (4/8/16-bit timers), aging (seed 002),
// compact (lines of fingerprints with tick tags) and exact, on the same generated
// streams in one run. Prints markdown tables; asserts nothing.
//
// 1. Streams (seed 000 §7): identities drawn uniformly or Zipf(alpha = 1)
//    from a domain sized for a chosen duplicate share, at a steady rate and
//    with 2x / 5x bursts in the middle third. Time is generated at 4096 fine
//    ticks per window and mapped onto each filter's own tick (its
//    ticks_per_window), so every filter sees the same events and the same
//    window. For each filter and stream:
//    - ops/s: one thread, test_and_insert_batch in chunks of 256, timed
//      alone (no oracle);
//    - bytes at the end of the stream (steady: the last third runs at the
//      base rate) and bits per in-window element (bytes * 8 / identities the
//      filter delivered in the last window), and at the peak (section 3's
//      measure: the largest bytes over the largest in-window count, from the
//      end of the first window on);
//    - the false-positive rate against the exact oracle (seed 000
//      Definition 4), split into never-delivered identities ("new") and
//      identities whose last delivery left the window ("expired": the edge
//      of the window), the rate over every identity not delivered within
//      the last 1.1 windows ("beyond 1.1 W": new ones and those well past
//      the edge), and false negatives, which must be 0.
// 2. The compact filter on the same streams (steady, 2x and 5x bursts) at
//    fpp 0.1, 0.01 and 0.001, each started with a capacity hint 10x too
//    small, right, and 100x too large:
//    bits per in-window id at the end of the stream (memory follows load),
//    tables, FP rates as above.
// 3. seed 002 Table 2: bits per element of the aging filter at error rates
//    0.1 .. 1e-5 on a stream of distinct identities (seed 002 §7.2), started
//    10x under-dimensioned, measured at every tick of the last window (min -
//    max, like the paper's ranges), next to the (k, l) model, the paper's
//    range, the false-positive rate on identities never inserted (§7.3), and
//    the 8-bit timer filter at the same target. The compact filter runs the
//    same in-window identities at its own default tick (W = 10), started
//    from its floor with the hint 10x too small and, in a second run, 100x
//    too large (memory follows load: the hint only caps the first table
//    below the floor); beside its bits per id and FP on absent ids, the FP
//    on just-expired ids (delivered W + 1 ticks before the query, so past
//    the window) for aging and compact. Then the compact filter alone on
//    the same stream at finer ticks (W = 10 .. 253: 4- to 8-bit tags), at
//    fpp 1% and 0.1%: the cost of a finer window edge.
//
// 3. Capacity mis-set (memory follows load, DESIGN.md): every filter type on
//    a steady and a 5x burst stream of (almost) distinct identities, with
//    the capacity hint 100x too large, 10x too large and 10x too small.
//    Bits per in-window id (bytes * 8 / identities the filter delivered in
//    the last window), from the end of the first window on:
//    - at the peak: the largest bytes of the run over the largest in-window
//      count of the run (memory at its peak against the load at its peak);
//    - worst moment: the largest ratio at any tick (after a burst the window
//      empties faster than sub-filters can be freed);
//    - at the end of the run (the last two windows run at the base rate);
//    each next to the pre-sized figure of that filter and fpp (timer: a
//    filter sized for the window, 512 / lambda bits; aging: the (k, l)
//    model; compact: a table sized for the window at its target load;
//    exact: its own steady state), and the FP rate against the
//    oracle and FN. Targets: end <= 1.5x, peak <= 2x, FP <= 1.2x fpp, FN 0.
//
// 4. Memory budget: four partitions' filters sharing a MemoryBudget smaller
//    than they need at the target (1.3x, 2x, 4x, and 1.1x for compact, whose
//    entry shrinks from about 17.7 bits at fpp 0.1% to 9.1 at fpp 0.25, so
//    it has less to trade; fpp 0.1%, 50k distinct ids per window each, six
//    windows, the partitions interleaved tick by tick as workers run them):
//    the level the budget ends at and its effective fpp, the largest
//    estimate any partition reported in the last three windows, the
//    false-positive rate each partition measured against its oracle over
//    the last three windows (worst and mean), FN, and the largest
//    reservation against the budget.
//
// Usage: family_bench [--scale X] [--skip-streams] [--skip-compact] [--skip-table2]
//                     [--skip-misset] [--skip-budget] [--compact-bursts F,F,...]
//                     [--compact-seeds N] [--timer-scales S,S,...] [--short-bursts]
//   --scale multiplies every stream's rate (default 1: ~200k events per
//   window at the base rate, ~1M in-window identities in Table 2, ~100k
//   in-window identities at the base rate of the mis-set streams).
//   --compact-bursts: the burst factors of the compact table's streams
//   (default 1,2,5; 1 is the steady stream).
//   --compact-seeds N: after the compact table, the same streams drawn with
//   N seeds (hint 1x): per stream and fpp the spread of the bits at the end,
//   the most tables, the highest peak (section 3's measure), and which seeds
//   ended on two tables or over 1.5x the pre-sized figure (whether a table
//   folds or fills a tick early turns on the fingerprints).
//   --timer-scales S,S,...: last, section 1's streams drawn at each scale
//   (events and identities alike), every timer width: the peak bits per
//   in-window id against the pre-sized figure for the most the window held
//   (whether an expansion leaves room enough turns on a few percent, which
//   one scale can hide).
//   --short-bursts: last, a burst of new identities shorter than the window
//   on an established stream (about 96k new identities a window, then 100k
//   more within 1 tick, W / 16, W / 4, W / 2 or W ticks, from the fourth
//   window on), and a step in the rate of new identities (2x to 40x)
//   sustained for two windows, every growing filter at its own ticks: the
//   peak bits per in-window id against the pre-sized figure for the most
//   the window held.

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kdedup/filter/aging_filter.h"
#include "kdedup/filter/compact_filter.h"
#include "kdedup/filter/exact_filter.h"
#include "kdedup/filter/memory_budget.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/filter/timer_filter.h"

// The deterministic stream generators and oracle runner shared with the
// filter tests (library kdedup::streams, see bench/CMakeLists.txt).
#include "streams.h"

namespace {

using kdedup::filter::AgingFilter;
using kdedup::filter::AgingShape;
using kdedup::filter::CompactFilter;
using kdedup::filter::Decision;
using kdedup::filter::FilterConfig;
using kdedup::filter::FilterStats;
using kdedup::filter::FilterType;
using kdedup::filter::Fingerprint;
using kdedup::filter::FingerprintHash;
using kdedup::filter::SlidingFilter;
using kdedup::filter::Tick;
using kdedup::testing::closes_tick;
using kdedup::testing::Distribution;
using kdedup::testing::Event;
using kdedup::testing::StreamSpec;
using Clock = std::chrono::steady_clock;

constexpr Tick kFineTicks = kdedup::testing::kFineTicksPerWindow;
constexpr std::size_t kBatch = 256;

struct Contender {
  const char* name;
  FilterConfig config;
};

FilterConfig config_of(FilterType type, double fpp, std::uint64_t capacity, std::uint8_t bits = 8) {
  FilterConfig c;
  c.type = type;
  c.fpp = fpp;
  c.capacity = capacity;
  c.timer_bits = bits;
  auto n = kdedup::filter::normalize(c);
  if (!n) {
    std::fprintf(stderr, "bad config: %s\n", n.error().message.c_str());
    std::exit(1);
  }
  return *n;
}

std::unique_ptr<SlidingFilter> build(const FilterConfig& c) {
  auto f = kdedup::filter::make_filter(c);
  if (!f) {
    std::fprintf(stderr, "cannot build %s filter: %s\n", kdedup::filter::to_string(c.type),
                 f.error().message.c_str());
    std::exit(1);
  }
  return std::move(*f);
}

// The events of a fine-tick stream on a filter's own tick scale.
std::vector<Event> on_ticks(const std::vector<Event>& fine, std::uint32_t window) {
  std::vector<Event> out(fine);
  kdedup::testing::lay_on_ticks(out, window);
  return out;
}

// Memory against the load, tick by tick from the end of the first window
// on (section 3's measures): the peak (the largest bytes of the run over its
// largest in-window count) and the worst moment (the largest ratio at one
// tick), where the in-window count is the identities the filter delivered
// in the last window. Sampled as each tick closes: what the filter holds
// between a tick's last event and the next tick's first.
class LoadTrack {
 public:
  LoadTrack(Tick window, Tick start)
      : window_(window), per_tick_(window + 1, 0), clock_(start), start_(start) {}

  /// An event of tick `tick` was decided: the ticks before it have ended.
  void observe(Tick tick, bool delivered) {
    while (clock_ < tick) {
      ++clock_;
      std::uint64_t& slot = per_tick_[clock_ % (window_ + 1)];
      in_window_ -= slot;
      slot = 0;
    }
    if (delivered) {
      ++per_tick_[clock_ % (window_ + 1)];
      ++in_window_;
    }
  }
  /// The filter as the current tick closes (after its last event, before
  /// the next tick's first: run_against_oracle() with tick_chunks).
  void sample(const SlidingFilter& f) {
    if (clock_ - start_ <= window_ || in_window_ == 0) return;  // the first window fills
    const FilterStats st = f.stats();
    const std::uint64_t bytes = st.bytes;
    worst_estimate_ = std::max(worst_estimate_, st.fpp_estimate);
    peak_bytes_ = std::max(peak_bytes_, bytes);
    peak_in_window_ = std::max(peak_in_window_, in_window_);
    worst_bits_ =
        std::max(worst_bits_, 8.0 * static_cast<double>(bytes) / static_cast<double>(in_window_));
  }
  [[nodiscard]] double peak_bits() const {
    return peak_in_window_ == 0
               ? 0.0
               : 8.0 * static_cast<double>(peak_bytes_) / static_cast<double>(peak_in_window_);
  }
  [[nodiscard]] double worst_bits() const { return worst_bits_; }
  /// The filter's own fpp estimate at its highest (stats().fpp_estimate).
  [[nodiscard]] double worst_estimate() const { return worst_estimate_; }
  [[nodiscard]] std::uint64_t peak_bytes() const { return peak_bytes_; }
  [[nodiscard]] std::uint64_t peak_in_window() const { return peak_in_window_; }
  [[nodiscard]] std::uint64_t in_window() const { return in_window_; }

 private:
  Tick window_;
  std::vector<std::uint64_t> per_tick_;  // deliveries per tick of the last window
  Tick clock_, start_;
  std::uint64_t in_window_ = 0, peak_in_window_ = 0, peak_bytes_ = 0;
  double worst_bits_ = 0;
  double worst_estimate_ = 0;
};

struct StreamResult {
  double ops_per_s = 0;
  std::uint64_t bytes = 0;
  double bits_per_element = 0;
  double duplicate_share = 0;
  double fp_rate = 0;
  double fp_new = 0;
  double fp_expired = 0;
  double fp_beyond = 0;        // not delivered within the last 1.1 windows, per event
  double fp_beyond_first = 0;  // the same, per identity (first query of each absence)
  std::uint64_t false_negatives = 0;
  std::uint32_t subfilters = 0;
  double peak_bits = 0;              // LoadTrack
  std::uint64_t peak_in_window = 0;  // the most the window held (LoadTrack)
  double worst_estimate = 0;         // the filter's estimate at its highest (LoadTrack)
};

StreamResult run_stream(const FilterConfig& config, const std::vector<Event>& events,
                        bool timed = true) {
  StreamResult r;
  std::vector<Fingerprint> fps(events.size());
  std::vector<Tick> ticks(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    fps[i] = events[i].fp;
    ticks[i] = events[i].tick;
  }
  if (timed) {  // Throughput, the filter alone.
    auto f = build(config);
    std::vector<Decision> out(kBatch);
    const auto start = Clock::now();
    for (std::size_t i = 0; i < events.size(); i += kBatch) {
      const std::size_t n = std::min(kBatch, events.size() - i);
      f->test_and_insert_batch(std::span(fps).subspan(i, n), std::span(ticks).subspan(i, n),
                               std::span(out).subspan(0, n));
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    r.ops_per_s = static_cast<double>(events.size()) / seconds;
  }
  // Accuracy against the oracle, on a fresh filter fed the same batches.
  auto f = build(config);
  std::unordered_map<Fingerprint, Tick, FingerprintHash> delivered;  // last delivery
  std::uint64_t new_events = 0, new_fp = 0, expired_events = 0, expired_fp = 0;
  std::uint64_t beyond_events = 0, beyond_fp = 0, beyond_first = 0, beyond_first_fp = 0;
  std::unordered_set<Fingerprint, FingerprintHash> asked;  // queried since the last delivery
  const double beyond = 1.1 * static_cast<double>(config.ticks_per_window);
  LoadTrack load(config.ticks_per_window, events.front().tick);
  auto observe = [&](std::size_t i, const Event& e, Decision d, bool in_window) {
    const bool duplicate = d == Decision::kDuplicate;
    load.observe(e.tick, !duplicate);
    if (closes_tick(events, i)) load.sample(*f);
    if (!in_window) {
      auto last = delivered.find(e.fp);
      if (last == delivered.end()) {
        ++new_events;
        new_fp += duplicate ? 1 : 0;
      } else {
        ++expired_events;
        expired_fp += duplicate ? 1 : 0;
      }
      if (last == delivered.end() || static_cast<double>(e.tick - last->second) > beyond) {
        ++beyond_events;
        beyond_fp += duplicate ? 1 : 0;
        if (asked.insert(e.fp).second) {
          ++beyond_first;
          beyond_first_fp += duplicate ? 1 : 0;
        }
      }
    }
    if (!duplicate) {
      delivered[e.fp] = e.tick;
      asked.erase(e.fp);
    }
  };
  const auto counts = kdedup::testing::run_against_oracle(*f, events, kBatch, observe, true);
  r.peak_bits = load.peak_bits();
  r.peak_in_window = load.peak_in_window();
  r.worst_estimate = load.worst_estimate();
  const FilterStats st = f->stats();
  r.bytes = st.bytes;
  r.subfilters = st.subfilters;
  r.bits_per_element = static_cast<double>(st.bytes) * 8.0 / static_cast<double>(load.in_window());
  r.duplicate_share =
      static_cast<double>(counts.true_positives) / static_cast<double>(counts.events);
  r.fp_rate = counts.fp_rate();
  r.fp_new = new_events ? static_cast<double>(new_fp) / static_cast<double>(new_events) : 0;
  r.fp_expired =
      expired_events ? static_cast<double>(expired_fp) / static_cast<double>(expired_events) : 0;
  r.fp_beyond =
      beyond_events ? static_cast<double>(beyond_fp) / static_cast<double>(beyond_events) : 0;
  r.fp_beyond_first =
      beyond_first ? static_cast<double>(beyond_first_fp) / static_cast<double>(beyond_first) : 0;
  r.false_negatives = counts.false_negatives;
  return r;
}

// The streams of sections 1 and 2, at 4096 fine ticks per window.
StreamSpec stream_spec(Distribution dist, double burst, double scale) {
  StreamSpec spec;
  spec.distribution = dist;
  const auto per_window = static_cast<std::uint64_t>(48 * scale * kFineTicks);
  // Uniform: about one draw per identity per window; Zipf: a long tail.
  spec.domain = dist == Distribution::kUniform ? per_window : 10 * per_window;
  spec.base_rate = 48 * scale;  // per fine tick: ~200k events per window
  spec.ticks = 6 * kFineTicks;
  spec.burst_factor = burst;
  spec.seed = 7;
  return spec;
}

std::string stream_name(Distribution dist, double burst) {
  char factor[32];
  std::snprintf(factor, sizeof factor, "%gx burst", burst);
  return std::string(dist == Distribution::kUniform ? "uniform" : "zipf1") + " " +
         (burst == 1.0 ? "steady" : factor);
}

void streams_section(double scale) {
  const double fpp = 0.01;
  const double base_rate = 48 * scale;  // per fine tick: ~200k events per window
  const auto per_window = static_cast<std::uint64_t>(base_rate * kFineTicks);
  const Contender contenders[] = {
      {"timer-4", config_of(FilterType::kTimer, fpp, per_window, 4)},
      {"timer-8", config_of(FilterType::kTimer, fpp, per_window, 8)},
      {"timer-16", config_of(FilterType::kTimer, fpp, per_window, 16)},
      {"aging", config_of(FilterType::kAging, fpp, per_window)},
      {"compact", config_of(FilterType::kCompact, fpp, per_window)},
      {"exact", config_of(FilterType::kExact, fpp, per_window)},
  };
  std::printf("## Streams: fpp target %g, %" PRIu64
              " events per window at the base rate, 6 windows, batch %zu\n\n",
              fpp, per_window, kBatch);
  std::printf(
      "| stream | filter | W ticks | dup share | Mops/s | MiB at end | sub-filters | "
      "bits/in-window id | peak bits/id | FP rate | FP new ids | FP expired ids | FP beyond 1.1 W, "
      "per event | per identity | FN |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (Distribution dist : {Distribution::kUniform, Distribution::kZipf}) {
    for (double burst : {1.0, 2.0, 5.0}) {
      const auto fine = kdedup::testing::generate_stream(stream_spec(dist, burst, scale));
      for (const Contender& c : contenders) {
        const auto events = on_ticks(fine, c.config.ticks_per_window);
        const StreamResult r = run_stream(c.config, events);
        std::printf(
            "| %s | %s | %u | %.2f | %.2f | %.2f | %u | %.1f | %.1f | %.2e | %.2e | %.2e | %.2e | "
            "%.2e | %" PRIu64 " |\n",
            stream_name(dist, burst).c_str(), c.name, c.config.ticks_per_window, r.duplicate_share,
            r.ops_per_s / 1e6, static_cast<double>(r.bytes) / (1 << 20), r.subfilters,
            r.bits_per_element, r.peak_bits, r.fp_rate, r.fp_new, r.fp_expired, r.fp_beyond,
            r.fp_beyond_first, r.false_negatives);
        std::fflush(stdout);
      }
    }
  }
  std::printf("\n");
}

void compact_section(double scale, const std::vector<double>& bursts) {
  const auto per_window = static_cast<std::uint64_t>(48 * scale * kFineTicks);
  std::printf("## The compact filter at three targets and three capacity hints (%" PRIu64
              " events per window at the base rate, 6 windows)\n\n",
              per_window);
  std::printf(
      "| stream | fpp | capacity hint | f bits | tables at end | bits/in-window id | FP rate | "
      "FP expired ids | FP beyond 1.1 W, per event | per identity | per identity / fpp | FN |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (Distribution dist : {Distribution::kUniform, Distribution::kZipf}) {
    for (double burst : bursts) {
      const auto fine = kdedup::testing::generate_stream(stream_spec(dist, burst, scale));
      for (double fpp : {0.1, 0.01, 0.001}) {
        for (double hint : {0.1, 1.0, 100.0}) {
          const auto capacity = static_cast<std::uint64_t>(hint * static_cast<double>(per_window));
          const FilterConfig c = config_of(FilterType::kCompact, fpp, capacity);
          const auto events = on_ticks(fine, c.ticks_per_window);
          const StreamResult r = run_stream(c, events, false);
          std::printf(
              "| %s | %g | %gx | %u | %u | %.1f | %.2e | %.2e | %.2e | %.2e | %.2f | %" PRIu64
              " |\n",
              stream_name(dist, burst).c_str(), fpp, hint,
              kdedup::filter::compact_fingerprint_bits(fpp), r.subfilters, r.bits_per_element,
              r.fp_rate, r.fp_expired, r.fp_beyond, r.fp_beyond_first, r.fp_beyond_first / fpp,
              r.false_negatives);
          std::fflush(stdout);
        }
      }
    }
  }
  std::printf("\n");
}

// Bits per in-window id at each tick of the last of four windows, for a
// filter fed `per_tick` distinct ids per tick; with probes of ids never
// inserted and of ids delivered W + 1 ticks before (just past the window)
// when the filter can answer without inserting (`contains`).
struct Table2Run {
  double lo = 1e300, hi = 0, last = 0;
  std::uint64_t asked = 0, positives = 0;
  std::uint64_t expired_asked = 0, expired_positives = 0;
  std::uint32_t subfilters = 0;
};

template <class Contains>
Table2Run table2_run(SlidingFilter& f, std::uint32_t window, std::uint64_t per_tick,
                     std::uint64_t queries, std::uint64_t seed, const Contains& contains) {
  Table2Run r;
  const Tick total = 4 * static_cast<Tick>(window + 1);
  std::vector<Fingerprint> fps(per_tick);
  std::vector<Tick> ticks(per_tick);
  std::vector<Decision> out(per_tick);
  std::vector<std::uint64_t> delivered;  // per tick: the in-window ids are the ones delivered
  std::uint64_t id = 0;
  for (Tick t = 0; t < total; ++t) {
    for (std::uint64_t j = 0; j < per_tick; ++j) {
      fps[j] = kdedup::testing::identity_fingerprint(id++, seed);
      ticks[j] = t;
    }
    f.test_and_insert_batch(fps, ticks, out);
    delivered.push_back(
        static_cast<std::uint64_t>(std::count(out.begin(), out.end(), Decision::kDistinct)));
    if (t + window + 1 < total) continue;  // measure over the last window
    std::uint64_t in_window = 0;
    for (std::size_t j = delivered.size() - (window + 1); j < delivered.size(); ++j) {
      in_window += delivered[j];
    }
    const double bits = static_cast<double>(f.stats().bytes) * 8.0 / static_cast<double>(in_window);
    r.lo = std::min(r.lo, bits);
    r.hi = std::max(r.hi, bits);
    r.last = bits;
    const std::uint64_t per = queries / (window + 1) + 1;
    for (std::uint64_t q = 0; q < per; ++q, ++r.asked) {
      r.positives += contains(kdedup::testing::identity_fingerprint(r.asked, 0xab5e), t) ? 1 : 0;
    }
    // Ids of tick t - W - 1, the first tick past the window.
    const std::uint64_t first = (t - window - 1) * per_tick;
    for (std::uint64_t q = 0; q < std::min(per, per_tick); ++q, ++r.expired_asked) {
      const std::uint64_t gone = first + (q * 7919) % per_tick;
      r.expired_positives += contains(kdedup::testing::identity_fingerprint(gone, seed), t) ? 1 : 0;
    }
  }
  r.subfilters = f.stats().subfilters;
  return r;
}

void table2_section(double scale) {
  const double rates[] = {0.1, 0.01, 0.001, 1e-4, 1e-5};
  const char* paper[] = {"10-13", "19-24", "26-35", "32-45", "41-56"};
  const std::uint32_t window = 192;  // the aging default ticks_per_window
  const auto per_tick = static_cast<std::uint64_t>(5'200 * scale);
  const std::uint64_t in_window = per_tick * (window + 1);
  const std::uint32_t compact_window = config_of(FilterType::kCompact, 0.01, 1).ticks_per_window;
  const std::uint64_t compact_per_tick = in_window / (compact_window + 1);
  std::printf("## seed 002 Table 2: bits per delivered in-window id, %" PRIu64
              " distinct ids per window, W = %u ticks (compact: W = %u)\n\n",
              in_window, window, compact_window);
  std::printf(
      "| error rate | (k, l) | model bits/id | aging bits/id (min-max, last window) | "
      "paper range | aging FP on absent ids | aging FP on just-expired ids | slices | "
      "timer-8 bits/id | compact bits/id (min-max) | compact bits/id, hint 100x (min-max) | "
      "compact FP on absent ids | compact FP on just-expired ids | compact tables |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < 5; ++i) {
    const double e = rates[i];
    FilterConfig ac = config_of(FilterType::kAging, e, in_window / 10);
    ac.ticks_per_window = window;
    FilterConfig tc = config_of(FilterType::kTimer, e, in_window, 8);
    tc.ticks_per_window = window;
    AgingFilter aging(ac);
    auto timer = build(tc);
    auto compact = build(config_of(FilterType::kCompact, e, in_window / 10));
    auto compact_large = build(config_of(FilterType::kCompact, e, in_window * 100));
    const AgingShape shape = aging.shape();
    const std::uint64_t queries =
        std::min<std::uint64_t>(4'000'000, static_cast<std::uint64_t>(200.0 / e * scale) + 1);
    const Table2Run a =
        table2_run(aging, window, per_tick, queries, 2,
                   [&](const Fingerprint& x, Tick t) { return aging.contains(x, t); });
    const Table2Run t =
        table2_run(*timer, window, per_tick, 0, 2, [](const Fingerprint&, Tick) { return false; });
    auto& cf = dynamic_cast<CompactFilter&>(*compact);
    const Table2Run c =
        table2_run(*compact, compact_window, compact_per_tick, queries, 2,
                   [&](const Fingerprint& x, Tick when) { return cf.contains(x, when); });
    const Table2Run cl = table2_run(*compact_large, compact_window, compact_per_tick, 0, 2,
                                    [](const Fingerprint&, Tick) { return false; });
    auto rate = [](std::uint64_t hits, std::uint64_t asked) {
      return asked ? static_cast<double>(hits) / static_cast<double>(asked) : 0.0;
    };
    std::printf("| %g | (%u, %u) | %.1f | %.1f - %.1f | %s | %.2e (%" PRIu64 "/%" PRIu64
                ") | %.2e | %u | %.1f | %.1f - %.1f | %.1f - %.1f | %.2e (%" PRIu64 "/%" PRIu64
                ") | %.2e | %u |\n",
                e, shape.k, shape.l, shape.bits_per_element(), a.lo, a.hi, paper[i],
                rate(a.positives, a.asked), a.positives, a.asked,
                rate(a.expired_positives, a.expired_asked), a.subfilters, t.last, c.lo, c.hi, cl.lo,
                cl.hi, rate(c.positives, c.asked), c.positives, c.asked,
                rate(c.expired_positives, c.expired_asked), c.subfilters);
    std::fflush(stdout);
  }
  std::printf("\n");
}

// The compact filter's cost of finer ticks: the Table 2 stream (about 1 M
// distinct ids per window) at ticks_per_window 10 (the default), 13 (the
// most with 4-bit tags) and the most each wider tag allows, at fpp 1% and
// 0.1%, started from the floor.
void compact_ticks_section(double scale) {
  const std::uint64_t in_window = static_cast<std::uint64_t>(5'200 * scale) * 193;
  std::printf("## The compact filter at finer ticks: bits per delivered in-window id, %" PRIu64
              " distinct ids per window, from the floor\n\n",
              in_window);
  std::printf(
      "| ticks per window | tag bits | window edge (one tick) | fpp | f bits | bits/id (min-max, "
      "last window) | FP on absent ids | FP on just-expired ids | tables |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (std::uint32_t window : {10U, 13U, 29U, 61U, 125U, 253U}) {
    for (double fpp : {0.01, 0.001}) {
      FilterConfig c = config_of(FilterType::kCompact, fpp, in_window / 10);
      c.ticks_per_window = window;
      auto f = build(c);
      auto& cf = dynamic_cast<CompactFilter&>(*f);
      const std::uint64_t per_tick = in_window / (window + 1);
      const std::uint64_t queries = static_cast<std::uint64_t>(200.0 / fpp * scale) + 1;
      const Table2Run r =
          table2_run(*f, window, per_tick, queries, 3,
                     [&](const Fingerprint& x, Tick t) { return cf.contains(x, t); });
      auto rate = [](std::uint64_t hits, std::uint64_t asked) {
        return asked ? static_cast<double>(hits) / static_cast<double>(asked) : 0.0;
      };
      std::printf("| %u | %u | %.1f%% | %g | %u | %.1f - %.1f | %.2e | %.2e | %u |\n", window,
                  cf.tag_bits(), 100.0 / window, fpp, cf.fingerprint_bits(), r.lo, r.hi,
                  rate(r.positives, r.asked), rate(r.expired_positives, r.expired_asked),
                  r.subfilters);
      std::fflush(stdout);
    }
  }
  std::printf("\n");
}

struct MissetResult {
  double peak_bits = 0;   // peak bytes * 8 / peak in-window ids
  double worst_bits = 0;  // max over ticks of bytes * 8 / in-window ids
  double end_bits = 0;
  double fp_rate = 0;
  std::uint64_t false_negatives = 0;
  std::uint64_t peak_bytes = 0;
};

MissetResult run_misset(const FilterConfig& config, const std::vector<Event>& events) {
  auto f = build(config);
  LoadTrack load(config.ticks_per_window, events.front().tick);
  auto observe = [&](std::size_t i, const Event& e, Decision d, bool) {
    load.observe(e.tick, d == Decision::kDistinct);
    if (closes_tick(events, i)) load.sample(*f);
  };
  const auto counts = kdedup::testing::run_against_oracle(*f, events, kBatch, observe, true);
  MissetResult r;
  r.peak_bytes = load.peak_bytes();
  r.peak_bits = load.peak_bits();
  r.worst_bits = load.worst_bits();
  r.end_bits = 8.0 * static_cast<double>(f->stats().bytes) / static_cast<double>(load.in_window());
  r.fp_rate = counts.fp_rate();
  r.false_negatives = counts.false_negatives;
  return r;
}

// Bits per in-window id of a filter sized for exactly `per_window` ids.
double presized_bits(const FilterConfig& c, const std::vector<Event>& steady,
                     std::uint64_t per_window) {
  if (c.type == FilterType::kExact) return run_misset(c, steady).end_bits;
  return 8.0 * static_cast<double>(kdedup::testing::presized_bytes(c, per_window)) /
         static_cast<double>(per_window);
}

// The compact table's streams drawn with `seeds` seeds (7, 8, ...: the
// events and the identities' fingerprints), hint 1x: whether a table can
// fold or fills a tick early turns on the fingerprints, so one seed's row
// can hide another's second table. Per stream and fpp: the most tables at
// the end, the fewest and most bits per in-window id against the
// pre-sized figure, the most false positives per identity beyond 1.1
// windows against the target, false negatives over every seed, and the
// seeds that ended on two tables or over 1.5x the pre-sized figure.
void compact_seeds_section(double scale, const std::vector<double>& bursts, int seeds) {
  const auto per_window = static_cast<std::uint64_t>(48 * scale * kFineTicks);
  std::printf("## The compact filter over %d stream seeds (%" PRIu64
              " events per window at the base rate, 6 windows, hint 1x)\n\n",
              seeds, per_window);
  std::printf(
      "| stream | fpp | most tables at end | bits/in-window id, min - max | pre-sized | most / "
      "pre-sized | most peak bits/id (x) | most FP per identity / fpp | FN | seeds on two tables "
      "or over 1.5x |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const double fpps[] = {0.1, 0.01, 0.001};
  FilterConfig configs[3];
  double presized[3];
  for (int f = 0; f < 3; ++f) {
    configs[f] = config_of(FilterType::kCompact, fpps[f], per_window);
    presized[f] = presized_bits(configs[f], {}, per_window);
  }
  for (Distribution dist : {Distribution::kUniform, Distribution::kZipf}) {
    for (double burst : bursts) {
      struct Spread {
        std::uint32_t tables = 0;
        double least = 1e300, most = 0, peak = 0, fp = 0;
        std::uint64_t false_negatives = 0;
        std::string over;  // seeds that end on more than one table or over 1.5x
        int overs = 0;
      };
      Spread spread[3];
      for (int k = 0; k < seeds; ++k) {
        StreamSpec spec = stream_spec(dist, burst, scale);
        spec.seed = 7 + static_cast<std::uint64_t>(k);
        const auto fine = kdedup::testing::generate_stream(spec);
        for (int f = 0; f < 3; ++f) {
          const FilterConfig& c = configs[f];
          const StreamResult r = run_stream(c, on_ticks(fine, c.ticks_per_window), false);
          Spread& x = spread[f];
          x.tables = std::max(x.tables, r.subfilters);
          x.least = std::min(x.least, r.bits_per_element);
          x.most = std::max(x.most, r.bits_per_element);
          x.peak = std::max(x.peak, r.peak_bits);
          x.fp = std::max(x.fp, r.fp_beyond_first / fpps[f]);
          x.false_negatives += r.false_negatives;
          if (r.subfilters > 1 || r.bits_per_element > 1.5 * presized[f]) {
            x.over += (x.over.empty() ? "" : ", ") + std::to_string(spec.seed);
            ++x.overs;
          }
        }
      }
      for (int f = 0; f < 3; ++f) {
        const Spread& x = spread[f];
        std::printf("| %s | %g | %u | %.1f - %.1f | %.1f | %.2f | %.1f (%.2f) | %.2f | %" PRIu64
                    " | %s |\n",
                    stream_name(dist, burst).c_str(), fpps[f], x.tables, x.least, x.most,
                    presized[f], x.most / presized[f], x.peak, x.peak / presized[f], x.fp,
                    x.false_negatives,
                    x.overs == 0       ? "-"
                    : x.overs == seeds ? "all"
                                       : x.over.c_str());
        std::fflush(stdout);
      }
    }
  }
  std::printf("\n");
}

void misset_section(double scale) {
  const double fpp = 0.01;
  const double base_rate = 24 * scale;  // per fine tick: ~100k ids per window
  const auto per_window = static_cast<std::uint64_t>(base_rate * kFineTicks);
  struct Kind {
    const char* name;
    FilterType type;
    std::uint8_t bits;
  };
  const Kind kinds[] = {{"timer-4", FilterType::kTimer, 4},   {"timer-8", FilterType::kTimer, 8},
                        {"timer-16", FilterType::kTimer, 16}, {"aging", FilterType::kAging, 8},
                        {"compact", FilterType::kCompact, 8}, {"exact", FilterType::kExact, 8}};
  struct Hint {
    const char* name;
    double factor;
  };
  const Hint hints[] = {{"100x too large", 100}, {"10x too large", 10}, {"10x too small", 0.1}};
  std::printf("## Capacity mis-set: fpp target %g, %" PRIu64
              " distinct ids per window at the base rate, 6 windows, batch %zu\n\n",
              fpp, per_window, kBatch);
  std::printf(
      "| stream | filter | hint | pre-sized bits/id | peak bits/id (x) | worst moment (x) | "
      "end bits/id (x) | peak MiB | FP rate (x fpp) | FN |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (double burst : {1.0, 5.0}) {
    StreamSpec spec;
    spec.distribution = Distribution::kUniform;
    spec.domain = 1ULL << 40;  // every draw a new identity
    spec.base_rate = base_rate;
    spec.ticks = 6 * kFineTicks;
    spec.burst_factor = burst;
    spec.seed = 17;
    const auto fine = kdedup::testing::generate_stream(spec);
    StreamSpec steady_spec = spec;
    steady_spec.burst_factor = 1.0;
    const auto steady_fine = kdedup::testing::generate_stream(steady_spec);
    for (const Kind& kind : kinds) {
      const FilterConfig base = config_of(kind.type, fpp, per_window, kind.bits);
      const auto events = on_ticks(fine, base.ticks_per_window);
      const double presized =
          presized_bits(base, on_ticks(steady_fine, base.ticks_per_window), per_window);
      for (const Hint& hint : hints) {
        const auto capacity =
            std::max<std::uint64_t>(1, static_cast<std::uint64_t>(per_window * hint.factor));
        const FilterConfig c = config_of(kind.type, fpp, capacity, kind.bits);
        const MissetResult r = run_misset(c, events);
        std::printf(
            "| %s | %s | %s | %.1f | %.1f (%.2f) | %.1f (%.2f) | %.1f (%.2f) | %.2f | "
            "%.2e (%.2f) | %" PRIu64 " |\n",
            burst == 1.0 ? "steady" : "5x burst", kind.name, hint.name, presized, r.peak_bits,
            r.peak_bits / presized, r.worst_bits, r.worst_bits / presized, r.end_bits,
            r.end_bits / presized, static_cast<double>(r.peak_bytes) / (1 << 20), r.fp_rate,
            r.fp_rate / fpp, r.false_negatives);
        std::fflush(stdout);
      }
    }
  }
  std::printf("\n");
}

void budget_section(double scale) {
  const double fpp = 0.001;
  constexpr int kPartitions = 4;
  const auto per_window = static_cast<std::uint64_t>(50'000 * scale);
  std::printf("## Memory budget: %d partitions, fpp target %g, %" PRIu64
              " distinct ids per window each, 6 windows\n\n",
              kPartitions, fpp, per_window);
  std::printf(
      "| filter | budget / need at target | level | effective fpp | worst estimate | "
      "FP rate, worst partition | FP rate, mean | FN | most reserved / budget |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  struct Kind {
    const char* name;
    FilterType type;
    std::uint8_t bits;
  };
  for (const Kind& kind :
       {Kind{"timer-4", FilterType::kTimer, 4}, Kind{"timer-8", FilterType::kTimer, 8},
        Kind{"timer-16", FilterType::kTimer, 16}, Kind{"aging", FilterType::kAging, 8},
        Kind{"compact", FilterType::kCompact, 8}}) {
    for (double over : {1.1, 1.3, 2.0, 4.0}) {
      if (over == 1.1 && kind.type != FilterType::kCompact) continue;
      FilterConfig c = config_of(kind.type, fpp, 1'000, kind.bits);
      c.min_bytes = 4096;
      const Tick window = c.ticks_per_window;
      const auto need_one = static_cast<double>(kdedup::testing::presized_bytes(c, per_window));
      kdedup::filter::MemoryBudget::Options o;
      o.max_bytes = static_cast<std::uint64_t>(kPartitions * need_one / over);
      o.fpp = fpp;
      auto budget = std::make_shared<kdedup::filter::MemoryBudget>(o);
      std::vector<std::unique_ptr<SlidingFilter>> filters;
      std::vector<std::unique_ptr<kdedup::filter::ExactFilter>> oracles;
      FilterConfig oc = config_of(FilterType::kExact, fpp, 1'000);
      oc.ticks_per_window = c.ticks_per_window;
      for (int p = 0; p < kPartitions; ++p) {
        filters.push_back(build(c));
        filters.back()->set_memory_budget(budget);
        oracles.push_back(std::make_unique<kdedup::filter::ExactFilter>(oc));
      }
      std::vector<std::uint64_t> fp(kPartitions, 0), fresh(kPartitions, 0);
      std::uint64_t fn = 0, id = 0, most = 0;
      double worst_estimate = 0;  // over the scored windows, any partition
      const double per_tick = static_cast<double>(per_window) / static_cast<double>(window + 1);
      double carry = 0;
      for (Tick t = 0; t < 6 * (window + 1); ++t) {
        carry += per_tick;
        const auto n = static_cast<std::uint64_t>(carry);
        carry -= static_cast<double>(n);
        const bool scored = t >= 3 * (window + 1);
        for (int p = 0; p < kPartitions; ++p) {
          for (std::uint64_t i = 0; i < n; ++i) {
            const Fingerprint f = kdedup::testing::identity_fingerprint(id++, 31 + p);
            const bool delivered = oracles[p]->contains(f, t);
            const Decision d = filters[p]->test_and_insert(f, t);
            if (d == Decision::kDistinct) {
              oracles[p]->insert(f, t);
              fn += delivered ? 1 : 0;
            }
            if (scored && !delivered) {
              ++fresh[p];
              fp[p] += d == Decision::kDuplicate ? 1 : 0;
            }
          }
        }
        most = std::max(most, budget->used());
        if (scored) {
          for (const auto& f : filters) {
            worst_estimate = std::max(worst_estimate, f->stats().fpp_estimate);
          }
        }
      }
      double worst_fp = 0, mean_fp = 0;
      for (int p = 0; p < kPartitions; ++p) {
        const double rate = static_cast<double>(fp[p]) / static_cast<double>(fresh[p]);
        worst_fp = std::max(worst_fp, rate);
        mean_fp += rate / kPartitions;
      }
      std::printf("| %s | 1 / %.1f | %u | %g | %.4f | %.4f | %.4f | %" PRIu64 " | %.2f |\n",
                  kind.name, over, budget->level(), budget->effective_fpp(), worst_estimate,
                  worst_fp, mean_fp, fn,
                  static_cast<double>(most) / static_cast<double>(budget->max_bytes()));
      std::fflush(stdout);
    }
  }
  std::printf("\n");
}

// The streams of section 1, drawn at other scales (events and identities
// alike): per timer width, the peak bits per in-window id (section 3's
// measure) against the pre-sized figure for the most the window held, at
// each scale; false negatives over every run.
void timer_scales_section(const std::vector<double>& scales) {
  std::printf("## The timer filter's peak by scale (fpp 1%%, x the pre-sized figure)\n\n");
  std::printf("| stream | filter |");
  for (double s : scales) std::printf(" scale %g |", s);
  std::printf(" FN |\n|---|---|");
  for (std::size_t i = 0; i <= scales.size(); ++i) std::printf("---|");
  std::printf("\n");
  const std::uint8_t widths[] = {4, 8, 16};
  for (Distribution dist : {Distribution::kUniform, Distribution::kZipf}) {
    for (double burst : {1.0, 2.0, 5.0}) {
      std::vector<std::string> rows(std::size(widths));
      std::vector<std::uint64_t> false_negatives(std::size(widths), 0);
      for (double scale : scales) {
        const auto fine = kdedup::testing::generate_stream(stream_spec(dist, burst, scale));
        const auto per_window = static_cast<std::uint64_t>(48 * scale * kFineTicks);
        for (std::size_t w = 0; w < std::size(widths); ++w) {
          const FilterConfig c = config_of(FilterType::kTimer, 0.01, per_window, widths[w]);
          const StreamResult r = run_stream(c, on_ticks(fine, c.ticks_per_window), false);
          const double presized =
              presized_bits(c, {}, std::max<std::uint64_t>(1, r.peak_in_window));
          char cell[48];
          std::snprintf(cell, sizeof cell, " %.1f (%.2f) |", r.peak_bits, r.peak_bits / presized);
          rows[w] += cell;
          false_negatives[w] += r.false_negatives;
        }
      }
      for (std::size_t w = 0; w < std::size(widths); ++w) {
        std::printf("| %s | timer-%u |%s %" PRIu64 " |\n", stream_name(dist, burst).c_str(),
                    widths[w], rows[w].c_str(), false_negatives[w]);
      }
      std::fflush(stdout);
    }
  }
  std::printf("\n");
}

// The header of a table with a column per stream, then FN.
void stream_columns_header(const std::vector<std::string>& headers) {
  std::printf("| filter | W |");
  for (const std::string& h : headers) std::printf(" %s |", h.c_str());
  std::printf(" FN |\n|---|---|");
  for (std::size_t i = 0; i <= headers.size(); ++i) std::printf("---|");
  std::printf("\n");
}

// A table of the contenders' peaks (x the pre-sized figure for the most
// the window held) on one stream per column: `events(window, column)` for
// a filter of `window` ticks, the columns headed by `headers`. Then, from
// the same runs, the worst of the filter's own estimate from the first
// window's end on and the false-positive rate over the run, both x the
// target.
template <class Events>
void peak_table(const std::vector<Contender>& contenders, const std::vector<double>& columns,
                const std::vector<std::string>& headers, Events events) {
  stream_columns_header(headers);
  std::vector<std::string> accuracy;
  for (const Contender& c : contenders) {
    const std::uint32_t window = c.config.ticks_per_window;
    std::uint64_t false_negatives = 0;
    std::string row = "| " + std::string(c.name) + " | " + std::to_string(window) + " |";
    std::printf("| %s | %u |", c.name, window);
    for (double column : columns) {
      const StreamResult r = run_stream(c.config, events(window, column), false);
      const double presized =
          presized_bits(c.config, {}, std::max<std::uint64_t>(1, r.peak_in_window));
      std::printf(" %.1f (%.2f) |", r.peak_bits, r.peak_bits / presized);
      char cell[48];
      std::snprintf(cell, sizeof cell, " %.2f / %.2f |", r.worst_estimate / c.config.fpp,
                    r.fp_rate / c.config.fpp);
      row += cell;
      false_negatives += r.false_negatives;
      std::fflush(stdout);
    }
    std::printf(" %" PRIu64 " |\n", false_negatives);
    accuracy.push_back(row + " " + std::to_string(false_negatives) + " |");
  }
  std::printf("\nThe same runs: the worst estimate / the false-positive rate, x the target\n\n");
  stream_columns_header(headers);
  for (const std::string& row : accuracy) std::printf("%s\n", row.c_str());
  std::printf("\n");
}

void short_bursts_section() {
  const std::vector<Contender> contenders = {
      {"timer-4", config_of(FilterType::kTimer, 0.01, 1'000'000, 4)},
      {"timer-8", config_of(FilterType::kTimer, 0.01, 1'000'000, 8)},
      {"timer-16", config_of(FilterType::kTimer, 0.01, 1'000'000, 16)},
      {"aging", config_of(FilterType::kAging, 0.01, 1'000'000)},
      {"compact", config_of(FilterType::kCompact, 0.01, 1'000'000)},
  };
  std::printf(
      "## A burst shorter than the window (fpp 1%%, 96k new ids a window, then 100k more; x the "
      "pre-sized figure for the most the window held)\n\n");
  // The burst's length as a share of the window (0: within one tick).
  peak_table(contenders, {0.0, 1.0 / 16, 0.25, 0.5, 1.0},
             {"within 1 tick", "over 1/16 W", "over 1/4 W", "over 1/2 W", "over W"},
             [](std::uint32_t window, double share) {
               const auto ticks = std::max<std::uint64_t>(
                   1, static_cast<std::uint64_t>(share * static_cast<double>(window + 1)));
               return kdedup::testing::short_burst_stream(window, 96'000, 100'000, ticks);
             });
  std::printf(
      "## A step sustained for two windows (fpp 1%%, 96k new ids a window, then the factor "
      "times that; x the pre-sized figure for the most the window held)\n\n");
  peak_table(contenders, {2, 3, 5, 6, 10, 20, 40}, {"2x", "3x", "5x", "6x", "10x", "20x", "40x"},
             [](std::uint32_t window, double factor) {
               return kdedup::testing::short_burst_stream(window, 96'000, (factor - 1) * 2 * 96'000,
                                                          2 * (std::uint64_t{window} + 1));
             });
}

// A list of factors "F,F,..." each at least `least` into `out`; false when
// `arg` is not one.
bool parse_factors(const char* arg, double least, std::vector<double>& out) {
  out.clear();
  for (const char* at = arg;;) {
    char* end = nullptr;
    const double f = std::strtod(at, &end);
    if (end == at || !(f >= least) || (*end != ',' && *end != '\0')) return false;
    out.push_back(f);
    if (*end == '\0') return true;
    at = end + 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  double scale = 1.0;
  bool streams = true, compact = true, table2 = true, misset = true, budget = true;
  std::vector<double> bursts = {1.0, 2.0, 5.0};
  int seeds = 0;
  std::vector<double> timer_scales;
  bool short_bursts = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--scale") == 0 && i + 1 < argc) {
      scale = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--compact-bursts") == 0 && i + 1 < argc) {
      if (!parse_factors(argv[++i], 1.0, bursts)) {
        std::fprintf(stderr,
                     "--compact-bursts: '%s' is not a list of factors >= 1, such as 1,2,5\n",
                     argv[i]);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--timer-scales") == 0 && i + 1 < argc) {
      if (!parse_factors(argv[++i], 0.01, timer_scales) || timer_scales.size() > 16) {
        std::fprintf(stderr,
                     "--timer-scales: '%s' is not a list of up to 16 scales >= 0.01, such as "
                     "0.2,0.5,1\n",
                     argv[i]);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--compact-seeds") == 0 && i + 1 < argc) {
      seeds = std::atoi(argv[++i]);
      if (seeds < 1 || seeds > 1000) {
        std::fprintf(stderr, "--compact-seeds: '%s' is not a count of seeds from 1 to 1000\n",
                     argv[i]);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--skip-streams") == 0) {
      streams = false;
    } else if (std::strcmp(argv[i], "--skip-compact") == 0) {
      compact = false;
    } else if (std::strcmp(argv[i], "--skip-table2") == 0) {
      table2 = false;
    } else if (std::strcmp(argv[i], "--skip-misset") == 0) {
      misset = false;
    } else if (std::strcmp(argv[i], "--skip-budget") == 0) {
      budget = false;
    } else if (std::strcmp(argv[i], "--short-bursts") == 0) {
      short_bursts = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--scale X] [--skip-streams] [--skip-compact] [--skip-table2] "
                   "[--skip-misset] [--skip-budget] [--compact-bursts F,F,...] "
                   "[--compact-seeds N] [--timer-scales S,S,...] [--short-bursts]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!(scale > 0)) {
    std::fprintf(stderr, "--scale must be positive\n");
    return 2;
  }
  if (table2) table2_section(scale);
  if (table2 && compact) compact_ticks_section(scale);
  if (streams) streams_section(scale);
  if (compact) compact_section(scale, bursts);
  if (compact && seeds > 0) compact_seeds_section(scale, bursts, seeds);
  if (misset) misset_section(scale);
  if (budget) budget_section(scale);
  if (!timer_scales.empty()) timer_scales_section(timer_scales);
  if (short_bursts) short_bursts_section();
  return 0;
}
