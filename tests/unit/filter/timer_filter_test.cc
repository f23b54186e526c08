// Timer filter (seed 000 §4–5) against the exact oracle: no false negatives
// inside the window, false-positive rate under target in steady state and
// bursts, exact expiry, wrap-around without aliasing, clock jumps, batch ==
// sequential, serialization, equal timers and dynamic sizing.

#include "kdedup/filter/timer_filter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>

#include <cstring>

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"
#include "kdedup/filter/simd.h"
#include "kdedup/filter/sizing.h"
#include "streams.h"
#include "timer_state.h"

namespace kdedup::filter {
namespace {

using testing::Distribution;
using testing::Event;
using testing::generate_stream;
using testing::identity_fingerprint;
using testing::run_against_oracle;
using testing::StreamSpec;

FilterConfig timer_config(std::uint8_t bits, std::uint32_t window, std::uint64_t capacity,
                          double fpp = 0.01) {
  FilterConfig c;
  c.type = FilterType::kTimer;
  c.timer_bits = bits;
  c.ticks_per_window = window;
  c.capacity = capacity;
  c.fpp = fpp;
  c.min_bytes = 4096;
  return c;
}

std::unique_ptr<SlidingFilter> make(const FilterConfig& c) {
  auto f = make_filter(c);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  return f ? std::move(*f) : nullptr;
}

TimerFilter& as_timer(SlidingFilter& f) { return dynamic_cast<TimerFilter&>(f); }

// --- sizing -----------------------------------------------------------------

TEST(TimerSizing, ModelIsMonotoneAndInvertible) {
  auto model = sizing::BlockedModel::get(64, 5);
  double prev = 0;
  for (double lambda = 0.1; lambda < 40; lambda += 0.37) {
    const double p = model->fpp(lambda);
    EXPECT_GE(p, prev);
    prev = p;
  }
  for (double target : {0.1, 0.01, 0.001, 1e-5}) {
    const double lambda = model->lambda_for(target);
    EXPECT_LE(model->fpp(lambda), target * 1.0001);
    EXPECT_GT(model->fpp(lambda * 1.01), target);
  }
}

TEST(TimerSizing, DirectInverseEqualsTheBisection) {
  // lambda_for() solves the interpolated curve directly; it must give the
  // bisection's answer (to a relative 1e-9) and never exceed the target.
  for (auto [cells, k] :
       {std::pair{64U, 5U}, std::pair{64U, 1U}, std::pair{128U, 7U}, std::pair{32U, 3U}}) {
    auto model = sizing::BlockedModel::get(cells, k);
    const double top = model->fpp(1e9);
    for (double target = 1e-9; target < top; target *= 1.07) {
      const double direct = model->lambda_for(target);
      const double reference = model->bisect(target, model->lambda_for(top));
      EXPECT_LE(model->fpp(direct), target) << cells << "/" << k << " at " << target;
      EXPECT_NEAR(direct, reference, 1e-9 * std::max(1.0, reference))
          << cells << "/" << k << " at " << target;
    }
    EXPECT_EQ(model->lambda_for(0.0), 0.0);
    EXPECT_EQ(model->lambda_for(top), model->lambda_for(1.0));
  }
}

TEST(TimerSizing, BlockedLayoutMeetsMemoryTargets) {
  // At 1% (budget share 0.9): <= 100 bits/element with 8-bit timers, <= 50 with 4-bit.
  const double target = TimerFilter::kBudgetShare * 0.01;
  const auto l8 = sizing::choose_layout(64, target, 10);
  const auto l4 = sizing::choose_layout(128, target, 9);
  EXPECT_LE(l8.cells_per_element(64) * 8, 100.0);
  EXPECT_LE(l4.cells_per_element(128) * 4, 50.0);
  // A blocked filter needs more cells than the classic bound 1.44 log2(1/p).
  EXPECT_GT(l8.cells_per_element(64), 1.44 * std::log2(1 / target));
}

// --- configuration ------------------------------------------------------------

TEST(TimerConfig, DefaultsAndMarginChecks) {
  for (std::uint8_t bits : {4, 8, 16}) {
    FilterConfig c = timer_config(bits, 0, 1000);
    auto n = normalize(c);
    ASSERT_TRUE(n) << n.error().message;
    EXPECT_LE(n->ticks_per_window, max_timer_ticks_per_window(bits));
    EXPECT_TRUE(make_filter(*n));
  }
  auto too_wide = normalize(timer_config(4, 13, 1000));
  ASSERT_FALSE(too_wide);
  EXPECT_NE(too_wide.error().message.find("ticks_per_window 13 is too large for 4-bit"),
            std::string::npos)
      << too_wide.error().message;
  EXPECT_TRUE(normalize(timer_config(4, 12, 1000)));
  EXPECT_FALSE(normalize(timer_config(8, 253, 1000)));
  EXPECT_TRUE(normalize(timer_config(8, 252, 1000)));

  FilterConfig eq = timer_config(8, 100, 1000);
  eq.equal_timers = 15;
  auto bad = make_filter(eq);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("equal_timers"), std::string::npos);
}

// --- correctness against the oracle ---------------------------------------------

struct StreamCase {
  std::uint8_t bits;
  std::uint32_t window;
  double base_rate;
  double burst;
  Distribution distribution;
  std::uint64_t domain;
  std::uint64_t ticks;
};

std::string name_of(const StreamCase& s) {
  return std::to_string(s.bits) + "-bit W=" + std::to_string(s.window) +
         (s.distribution == Distribution::kZipf ? " zipf" : " uniform") +
         " burst=" + std::to_string(s.burst);
}

// Zero false negatives and measured FP rate <= fpp, for steady streams and
// 2x / 5x bursts (seed 000 §7), uniform and Zipf(1), 8- and 16-bit timers.
TEST(TimerFilter, NoFalseNegativesAndFpRateUnderTarget) {
  const double fpp = 0.01;
  std::vector<StreamCase> cases;
  for (double burst : {1.0, 2.0, 5.0}) {
    cases.push_back({8, 200, 60, burst, Distribution::kUniform, 200'000, 600});
    cases.push_back({8, 100, 100, burst, Distribution::kZipf, 100'000, 400});
    cases.push_back({16, 1000, 12, burst, Distribution::kUniform, 200'000, 3000});
  }
  cases.push_back({16, 500, 20, 5.0, Distribution::kZipf, 50'000, 1500});
  std::uint64_t seed = 11;
  for (const StreamCase& sc : cases) {
    StreamSpec spec;
    spec.distribution = sc.distribution;
    spec.domain = sc.domain;
    spec.base_rate = sc.base_rate;
    spec.ticks = sc.ticks;
    spec.burst_factor = sc.burst;
    spec.seed = ++seed;
    spec.first_tick = 1'000'000;
    auto events = generate_stream(spec);
    // Pre-sized for the base rate; bursts must be absorbed by growth.
    const auto capacity = static_cast<std::uint64_t>(sc.base_rate * (sc.window + 1));
    auto f = make(timer_config(sc.bits, sc.window, capacity, fpp));
    double worst_estimate = 0;
    auto counts =
        run_against_oracle(*f, events, 1, [&](std::size_t i, const Event&, Decision, bool) {
          if (i % 512 == 0) worst_estimate = std::max(worst_estimate, f->stats().fpp_estimate);
        });
    SCOPED_TRACE(name_of(sc));
    EXPECT_EQ(counts.false_negatives, 0U);
    EXPECT_GT(counts.true_negatives, 10'000U);
    // On a Zipf stream one false positive on a popular identity repeats at
    // each of its arrivals until the cells that caused it expire (it is
    // never delivered, so every arrival counts as new): the per-event rate
    // scatters around the target from seed to seed (0.5-2.9% on the 16-bit
    // case over twelve seeds, with every identity's first query at
    // 0.36-0.60%). The per-query probability, which the estimate keeps
    // under the target, is the rate of first queries.
    if (sc.distribution == Distribution::kZipf) {
      EXPECT_LE(counts.first_query_fp_rate(), fpp);
    } else {
      EXPECT_LE(counts.fp_rate(), fpp);
    }
    EXPECT_LE(worst_estimate, fpp);
    if (sc.burst == 1.0 && sc.distribution == Distribution::kUniform) {
      // The filter is loaded: its false positives are real, not zero.
      EXPECT_GT(counts.fp_rate(), fpp / 20);
    }
  }
}

// 4- and 8-bit clocks wrap every 15 / 255 ticks: over thousands of windows no
// old entry may come back (aliasing would show as a burst of false positives).
TEST(TimerFilter, ClockWrapOverThousandsOfWindows) {
  for (std::uint8_t bits : {4, 8}) {
    const std::uint32_t window = bits == 4 ? 8 : 192;
    StreamSpec spec;
    spec.domain = 3000;
    spec.base_rate = bits == 4 ? 20 : 2;
    spec.ticks = window * 3000ULL;
    spec.seed = bits;
    auto events = generate_stream(spec);
    auto f =
        make(timer_config(bits, window, static_cast<std::uint64_t>(spec.base_rate * (window + 1))));
    auto counts = run_against_oracle(*f, events);
    SCOPED_TRACE(static_cast<int>(bits));
    EXPECT_EQ(counts.false_negatives, 0U);
    EXPECT_LE(counts.fp_rate(), 0.01);
    EXPECT_GT(counts.true_positives, 1000U);
  }
}

// Each age from W + 1 to 3M is probed exactly once on an otherwise busy filter:
// every one must read as expired, none may alias back to alive.
TEST(TimerFilter, NoAliasingAtAnyAge) {
  for (std::uint8_t bits : {4, 8}) {
    const std::uint32_t window = bits == 4 ? 8 : 192;
    const std::uint32_t m = (1U << bits) - 1;
    FilterConfig c = timer_config(bits, window, 50'000);
    c.min_bytes = 1 << 20;  // stays roomy after shrinking: false positives ~1e-12
    auto f = make(c);
    const Tick start = 7'777;
    const std::uint32_t probes = 3 * m;
    for (std::uint32_t j = 0; j < probes; ++j) {
      ASSERT_EQ(f->test_and_insert(identity_fingerprint(j, 99), start), Decision::kDistinct);
    }
    std::uint64_t filler = 0;
    for (Tick t = start + 1; t <= start + window + probes; ++t) {
      for (int n = 0; n < 3; ++n) (void)f->test_and_insert(identity_fingerprint(filler++, 5), t);
      const Tick age = t - start;
      if (age > window) {
        EXPECT_EQ(f->test_and_insert(identity_fingerprint(age - window - 1, 99), t),
                  Decision::kDistinct)
            << "bits " << int(bits) << " age " << age;
      }
    }
  }
}

TEST(TimerFilter, ExpiryAtTheWindowEdgeWithinOneTick) {
  for (std::uint8_t bits : {4, 8, 16}) {
    const std::uint32_t window = bits == 4 ? 8 : bits == 8 ? 100 : 1000;
    FilterConfig c = timer_config(bits, window, 10'000);
    c.min_bytes = 1 << 20;  // stays roomy after shrinking: false positives ~1e-12
    auto f = make(c);
    const Tick t0 = 123'456;
    for (std::uint64_t id = 0; id < 200; ++id) {
      ASSERT_EQ(f->test_and_insert(identity_fingerprint(id, 1), t0), Decision::kDistinct);
    }
    // Alive through now - t == W (re-tests are duplicates and do not refresh).
    for (Tick at : {t0 + window / 2, t0 + window}) {
      for (std::uint64_t id = 0; id < 100; ++id) {
        EXPECT_EQ(f->test_and_insert(identity_fingerprint(id, 1), at), Decision::kDuplicate);
      }
    }
    // Expired at now - t == W + 1.
    for (std::uint64_t id = 0; id < 200; ++id) {
      EXPECT_EQ(f->test_and_insert(identity_fingerprint(id, 1), t0 + window + 1),
                Decision::kDistinct)
          << int(bits) << " " << id;
    }
  }
}

TEST(TimerFilter, BigClockJumps) {
  for (std::uint8_t bits : {4, 8, 16}) {
    const std::uint32_t window = bits == 4 ? 8 : bits == 8 ? 192 : 4096;
    const std::uint64_t m = (1ULL << bits) - 1;
    auto f = make(timer_config(bits, window, 1000));
    Tick t = 5;
    for (Tick jump : {Tick{window}, Tick{window + 1}, Tick{m}, Tick{2 * m}, Tick{m - 1},
                      Tick{1'000'000'007}, Tick{window / 2}, Tick{m + 1}}) {
      for (std::uint64_t id = 0; id < 50; ++id)
        (void)f->test_and_insert(identity_fingerprint(id, 3), t);
      const bool alive = jump <= window;
      t += jump;
      f->advance(t);
      for (std::uint64_t id = 0; id < 50; ++id) {
        EXPECT_EQ(f->test_and_insert(identity_fingerprint(id, 3), t),
                  alive ? Decision::kDuplicate : Decision::kDistinct)
            << "bits " << int(bits) << " jump " << jump;
      }
      t += window + 1;  // let everything expire before the next round
    }
  }
}

// Random gaps between ticks, including gaps longer than the window and many
// multiples of the wrap period, against the oracle.
TEST(TimerFilter, RandomJumpsAgainstOracle) {
  for (std::uint8_t bits : {4, 8, 16}) {
    const std::uint32_t window = bits == 4 ? 8 : bits == 8 ? 192 : 4096;
    std::mt19937_64 rng(bits);
    std::vector<Event> events;
    Tick t = 0;
    for (int i = 0; i < 60'000; ++i) {
      const auto r = rng() % 1000;
      if (r < 5) {
        t += rng() % (3 * window);
      } else if (r < 7) {
        t += rng() % 100'000;
      } else if (r < 200) {
        t += 1;
      }
      events.push_back({identity_fingerprint(rng() % 2000, 17), t});
    }
    auto f = make(timer_config(bits, window, 2000));
    auto counts = run_against_oracle(*f, events);
    SCOPED_TRACE(int(bits));
    EXPECT_EQ(counts.false_negatives, 0U);
    EXPECT_LE(counts.fp_rate(), 0.01);
    EXPECT_GT(counts.true_positives, 1000U);
  }
}

// --- batch and serialization -----------------------------------------------------

std::vector<Decision> run(SlidingFilter& f, std::span<const Event> events, std::size_t batch) {
  std::vector<Decision> out(events.size());
  std::vector<Fingerprint> fps;
  std::vector<Tick> ticks;
  for (std::size_t s = 0; s < events.size(); s += batch) {
    const std::size_t n = std::min(batch, events.size() - s);
    fps.clear();
    ticks.clear();
    for (std::size_t j = 0; j < n; ++j) {
      fps.push_back(events[s + j].fp);
      ticks.push_back(events[s + j].tick);
    }
    if (batch == 1) {
      out[s] = f.test_and_insert(fps[0], ticks[0]);
    } else {
      f.test_and_insert_batch(fps, ticks, std::span<Decision>(out).subspan(s, n));
    }
  }
  return out;
}

StreamSpec growing_stream(std::uint64_t seed) {
  StreamSpec spec;
  spec.domain = 30'000;
  spec.base_rate = 50;
  spec.ticks = 600;
  spec.burst_factor = 5;
  spec.distribution = Distribution::kZipf;
  spec.seed = seed;
  return spec;
}

TEST(TimerFilter, BatchGivesSequentialDecisions) {
  auto events = generate_stream(growing_stream(3));
  for (std::uint8_t bits : {4, 8, 16}) {
    FilterConfig c = timer_config(bits, bits == 4 ? 8 : 100, 500);  // grows mid-batch
    c.equal_timers = bits == 16 ? 2 : 0;
    auto a = make(c);
    auto b = make(c);
    auto seq = run(*a, events, 1);
    auto bat = run(*b, events, 64);
    EXPECT_EQ(seq, bat) << int(bits);
    EXPECT_EQ(a->serialize(), b->serialize());
    EXPECT_GT(a->stats().insertions, 0U);
  }
}

// The batch path has a loop unrolled for each usual probe count (k = 5..8)
// and a generic one for the others; every fpp below picks a different k.
// Each must give the one-by-one decisions, no false negatives, and an FP
// rate within the target, for every timer width, through seals mid-batch and
// runs of many elements per tick.
TEST(TimerFilter, BatchEqualsSequentialForEveryProbeCount) {
  StreamSpec spec = growing_stream(7);
  spec.ticks = 200;
  auto events = generate_stream(spec);
  std::set<std::uint32_t> ks;
  for (std::uint8_t bits : {4, 8, 16}) {
    for (double fpp : {0.2, 0.01, 0.001, 1e-6}) {
      FilterConfig c = timer_config(bits, bits == 4 ? 8 : 100, 500, fpp);
      auto a = make(c);
      auto b = make(c);
      ASSERT_TRUE(a && b);
      ks.insert(as_timer(*a).k());
      SCOPED_TRACE(std::to_string(bits) + "-bit fpp " + std::to_string(fpp) + " k " +
                   std::to_string(as_timer(*a).k()));
      const auto seq = run(*a, events, 1);
      const auto bat = run(*b, events, 97);
      EXPECT_EQ(seq, bat);
      EXPECT_EQ(a->serialize(), b->serialize());
      auto fresh = make(c);
      const auto counts = run_against_oracle(*fresh, events, 256);
      EXPECT_EQ(counts.false_negatives, 0U);
      // At the smallest targets a few false positives are expected noise:
      // allow the expected count plus four standard deviations (Poisson),
      // and 20% for the repeats of a Zipf stream (see the first test).
      const double expected =
          1.2 * fpp * static_cast<double>(counts.true_negatives + counts.false_positives);
      EXPECT_LE(static_cast<double>(counts.false_positives),
                expected + 4 * std::sqrt(expected) + 1);
      EXPECT_GT(counts.true_negatives, 3000U);
    }
  }
  // Both the unrolled (5..8) and the generic probe counts were exercised.
  EXPECT_TRUE(ks.count(5) && ks.count(8));
  EXPECT_TRUE(*ks.begin() < 5 && *ks.rbegin() > 8) << *ks.begin() << " " << *ks.rbegin();
}

// Restores the process-wide vector level when a test ends.
struct SimdGuard {
  Simd saved = simd_in_use();
  ~SimdGuard() { set_simd(saved); }
};

// On AVX2 and AVX-512 CPUs, 8-bit timers take vector batch paths and scrubs
// (simd.h). Each level the CPU runs must give the portable path's decisions
// and leave the same bytes, for every probe count, through seals mid-batch,
// idle gaps and clock jumps (partial catch-up, a whole sweep, a clear).
TEST(TimerFilter, VectorPathsGiveThePortableDecisionsAndState) {
  if (simd_supported() == Simd::kPortable) {
    GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: only the portable path runs here";
  }
  SimdGuard guard;
  std::vector<Event> events;
  Tick offset = 0;
  for (const Tick gap : {0, 40, 170, 400}) {
    StreamSpec spec = growing_stream(21 + gap);
    spec.ticks = 250;
    offset += gap;
    for (Event e : generate_stream(spec)) {
      e.tick += offset;
      events.push_back(e);
    }
    offset = events.back().tick + 1;
  }
  for (const Simd level : {Simd::kAvx2, Simd::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(simd_supported())) continue;
    for (const std::uint32_t window : {100U, 192U}) {
      for (const double fpp : {0.2, 0.01, 0.001, 1e-6}) {
        const FilterConfig c = timer_config(8, window, 500, fpp);
        auto portable = make(c);
        auto vector = make(c);
        ASSERT_TRUE(portable && vector);
        SCOPED_TRACE(std::string(to_string(level)) + " W " + std::to_string(window) + " k " +
                     std::to_string(as_timer(*vector).k()));
        std::uint32_t peak_subfilters = 0;
        for (std::size_t from = 0; from < events.size(); from += 5000) {
          const auto part = std::span<const Event>(events).subspan(
              from, std::min<std::size_t>(5000, events.size() - from));
          ASSERT_EQ(set_simd(Simd::kPortable), Simd::kPortable);
          const auto a = run(*portable, part, 97);
          ASSERT_EQ(set_simd(level), level);
          const auto b = run(*vector, part, 97);
          ASSERT_EQ(a, b) << "events from " << from;
          // (not ASSERT_EQ: the states are large)
          ASSERT_TRUE(portable->serialize() == vector->serialize()) << "events from " << from;
          peak_subfilters = std::max(peak_subfilters, vector->stats().subfilters);
        }
        EXPECT_GT(peak_subfilters, 1U);
        EXPECT_GT(vector->stats().insertions, 1000U);
      }
    }
  }
}

// The live-cell count is kept incrementally (inserts add the cells they fill,
// the scrub subtracts what it clears); restore recounts the cells and refuses
// a mismatch, so a round trip checks it exactly. Over many wraps of the
// clock, with idle gaps and clock jumps, for every width.
TEST(TimerFilter, LiveCellCountStaysExactThroughScrubsAndWraps) {
  for (std::uint8_t bits : {4, 8, 16}) {
    SCOPED_TRACE(int(bits));
    const std::uint32_t window = bits == 4 ? 8 : bits == 8 ? 192 : 300;
    auto f = make(timer_config(bits, window, 4000));
    std::mt19937_64 rng(bits);
    Tick t = 0;
    std::vector<Fingerprint> fps;
    std::vector<Tick> ticks;
    for (int round = 0; round < 60; ++round) {
      fps.clear();
      ticks.clear();
      for (int i = 0; i < 700; ++i) {
        const auto r = rng() % 100;
        t += r < 10 ? 1 : r == 99 ? rng() % (2 * window) : 0;
        fps.push_back(identity_fingerprint(rng() % 6000, 3));
        ticks.push_back(t);
      }
      std::vector<Decision> out(fps.size());
      f->test_and_insert_batch(fps, ticks, out);
      if (round % 6 == 5) {
        const auto restored = restore_filter(f->serialize());
        ASSERT_TRUE(restored) << "round " << round << ": " << restored.error().message;
        EXPECT_EQ((*restored)->stats().live_cells, f->stats().live_cells);
      }
    }
    EXPECT_GT(t, 10U * window);
    // Idle tick by tick past the window and one scrub sweep (P = 2^b - 3 - W
    // ticks): the scrub has emptied every cell.
    EXPECT_GT(f->stats().live_cells, 0U);
    const Tick period = (1U << bits) - 3 - window;
    for (Tick idle = t + 1; idle <= t + window + period + 1; ++idle) f->advance(idle);
    EXPECT_EQ(f->stats().live_cells, 0U);
  }
}

TEST(TimerFilter, SerializeRestoreGivesIdenticalFutureDecisions) {
  auto events = generate_stream(growing_stream(4));
  const std::size_t half = events.size() / 2;  // inside the burst: several sub-filters
  for (std::uint8_t bits : {4, 8, 16}) {
    for (Growth growth : {Growth::kDensity, Growth::kCardinality}) {
      FilterConfig c = timer_config(bits, bits == 4 ? 8 : 100, 500);
      c.growth = growth;
      auto a = make(c);
      (void)run(*a, std::span(events).first(half), 1);
      const std::string blob = a->serialize();
      auto restored = restore_filter(blob);
      ASSERT_TRUE(restored) << restored.error().message;
      auto& b = **restored;
      EXPECT_EQ(b.type(), FilterType::kTimer);
      EXPECT_EQ(config_fingerprint(b.config()), config_fingerprint(a->config()));
      EXPECT_EQ(b.stats().subfilters, a->stats().subfilters);
      EXPECT_EQ(b.serialize(), blob);
      auto rest = std::span(events).subspan(half);
      EXPECT_EQ(run(*a, rest, 1), run(b, rest, 1)) << int(bits);
      EXPECT_EQ(a->serialize(), b.serialize());
    }
  }
}

TEST(TimerFilter, InPlaceSealGivesTheCopyingEnvelopeByteForByte) {
  // serialize() writes its payload after room for the header and seals it in
  // place; the bytes must be exactly those of seal_envelope(payload).
  for (const std::string& payload : {std::string(), std::string("x"), std::string(1000, '\7')}) {
    std::string buffer(kEnvelopeHeaderBytes, '\xAB');
    buffer += payload;
    EXPECT_EQ(seal_envelope_in_place(5, 2, std::move(buffer)), seal_envelope(5, 2, payload));
  }
  auto f = make(timer_config(8, 100, 200));
  for (std::uint64_t id = 0; id < 2000; ++id) {
    (void)f->test_and_insert(identity_fingerprint(id, 11), id / 100);
  }
  ASSERT_GE(f->stats().subfilters, 2U);
  const std::string blob = f->serialize();
  auto env = open_envelope(blob, "timer filter state");
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(blob, seal_envelope(env->kind, env->version, env->payload));
  auto back = restore_filter(blob);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ((*back)->serialize(), blob);
}

TEST(TimerFilter, RejectsEveryTruncationAndByteFlip) {
  StreamSpec spec = growing_stream(5);
  spec.ticks = 200;
  auto events = generate_stream(spec);
  FilterConfig c = timer_config(8, 50, 300);
  c.min_bytes = 256;
  c.max_bytes = 2048;
  auto f = make(c);
  (void)run(*f, events, 1);
  ASSERT_GT(f->stats().subfilters, 1U);
  const std::string blob = f->serialize();
  ASSERT_LT(blob.size(), 100'000U);
  for (std::size_t n = 0; n < blob.size(); ++n) {
    auto r = restore_filter(std::string_view(blob).substr(0, n));
    ASSERT_FALSE(r) << "truncated to " << n;
  }
  std::mt19937_64 rng(9);
  for (int i = 0; i < 2000; ++i) {
    std::string bad = blob;
    const std::size_t at = rng() % bad.size();
    bad[at] = static_cast<char>(bad[at] ^ (1 + rng() % 255));
    ASSERT_FALSE(restore_filter(bad)) << "flip at " << at;
  }
}

// A payload with a valid checksum but inconsistent fields must be rejected
// by field validation, not trusted.
TEST(TimerFilter, RejectsInconsistentFieldsUnderAValidChecksum) {
  FilterConfig c = timer_config(8, 50, 300);
  auto f = make(c);
  for (std::uint64_t id = 0; id < 100; ++id)
    (void)f->test_and_insert(identity_fingerprint(id, 2), 10);
  const std::string blob = f->serialize();
  auto env = open_envelope(blob, "test");
  ASSERT_TRUE(env);
  ASSERT_EQ(env->version, 4);
  const std::string payload(env->payload);
  // Offsets after the config: k (u32), clock, first tick, insertions, count.
  std::string config_bytes;
  ByteWriter w(config_bytes);
  write_config(w, as_timer(*f).config());
  const std::size_t k_at = config_bytes.size();
  const auto seal = [](std::uint16_t version, const std::string& p) {
    return seal_envelope(static_cast<std::uint16_t>(FilterType::kTimer), version, p);
  };
  const auto refused = [&](std::size_t at, const auto& value, const std::string& why) {
    std::string p = payload;
    std::memcpy(p.data() + at, &value, sizeof value);
    auto r = restore_filter(seal(4, p));
    ASSERT_FALSE(r) << why;
    EXPECT_NE(r.error().message.find(why), std::string::npos) << r.error().message;
  };
  refused(k_at, std::uint32_t{3}, "k 3");
  refused(k_at + 4 + 8, Tick{11}, "first tick after clock");
  refused(k_at + 4 + 24, std::uint32_t{0}, "sub-filter count 0");
  refused(k_at + 4 + 24, std::uint32_t{1000}, "sub-filter count 1000");
  // One sub-filter: lines, hash range, expansion count, created, swept,
  // last insert, inserts, live cells, the window ring's first bucket and
  // size, the ring, the cells.
  const std::size_t sub_at = k_at + 4 + 24 + 4;
  refused(sub_at, std::uint64_t{1} << 40, "exceeds input");
  refused(sub_at + 52, std::uint64_t{7}, "live cell count");
  // The cells themselves: flipping one nonzero cell to zero breaks the count.
  const std::size_t growth_at = growth_state_at(payload, 1);
  std::string p = payload;
  std::size_t nz = growth_at - as_timer(*f).subfilter_bytes().back();
  while (p[nz] == 0) ++nz;
  p[nz] = 0;
  EXPECT_FALSE(restore_filter(seal(4, p)));
  // The growth state: each sub-filter's echo hold and share of the target,
  // then the history start, the tick's insertions, arrivals, the arrival
  // rate, rejections, the rejection rate, the overfull flag and limit, and
  // the query counts (first bucket, ring size, ring). The clock is 10.
  refused(growth_at, Tick{10 + 50 + 2}, "echo hold");
  refused(growth_at + 8, 0.0, "share of the target");
  refused(growth_at + 8, std::numeric_limits<double>::quiet_NaN(), "share of the target");
  refused(growth_at + 16, Tick{11}, "history start after the clock");
  refused(growth_at + 24, std::uint64_t{101}, "insertions exceed");
  refused(growth_at + 40, -1.0, "rate not finite or negative");
  refused(growth_at + 56, std::numeric_limits<double>::infinity(), "rate not finite");
  refused(growth_at + 64, std::uint8_t{2}, "overfull flag");
  refused(growth_at + 73, std::uint64_t{1}, "query counts ring position");
  std::uint32_t ring = 0;
  std::memcpy(&ring, payload.data() + growth_at + 81, 4);
  refused(growth_at + 81, ring + 1, "ring size");
  EXPECT_FALSE(restore_filter(seal(4, payload.substr(0, payload.size() - 1))));
  EXPECT_FALSE(restore_filter(seal(4, payload + "x")));
  // Unchanged payload still restores (the test edits are what break it).
  EXPECT_TRUE(restore_filter(seal(4, payload)));
  // Without its growth state it is the format 3 an older kdedup wrote: it
  // restores and still holds every identity; read as format 3 with the
  // growth state, or as 1 or 2, it is inconsistent; version 5 is unknown.
  auto old = restore_filter(seal(3, payload.substr(0, growth_at)));
  ASSERT_TRUE(old) << old.error().message;
  for (std::uint64_t id = 0; id < 100; ++id) {
    EXPECT_EQ((*old)->test_and_insert(identity_fingerprint(id, 2), 20), Decision::kDuplicate);
  }
  for (const std::uint16_t version : {1, 2, 3, 5}) {
    EXPECT_FALSE(restore_filter(seal(version, payload))) << version;
  }
}

// --- equal timers ------------------------------------------------------------

TEST(TimerFilter, EqualTimersNeverMissAnIdenticalRetest) {
  FilterConfig c = timer_config(8, 100, 20'000);
  c.equal_timers = 3;
  auto f = make(c);
  auto fk = as_timer(*f).k();
  ASSERT_GE(fk, 3U);
  for (std::uint64_t id = 0; id < 20'000; ++id) {
    const Tick t = id / 200;
    if (f->test_and_insert(identity_fingerprint(id, 8), t) == Decision::kDistinct) {
      EXPECT_EQ(f->test_and_insert(identity_fingerprint(id, 8), t + 50), Decision::kDuplicate);
    }
  }
}

TEST(TimerFilter, EqualTimersCutFalsePositivesInACrowdedFilter) {
  // One event per tick, so equal timers come from one element only; the
  // sub-filters are a single line each and cannot hold the window.
  StreamSpec spec;
  spec.domain = 1'000'000;
  spec.base_rate = 1;
  spec.ticks = 20'000;
  spec.seed = 21;
  auto events = generate_stream(spec);
  auto crowded = [&](std::uint8_t equal) {
    FilterConfig c = timer_config(8, 200, 20);
    c.min_bytes = c.max_bytes = 64;
    c.equal_timers = equal;
    auto f = make(c);
    return run_against_oracle(*f, events);
  };
  auto off = crowded(0);
  auto on = crowded(3);
  EXPECT_GT(off.fp_rate(), 0.05);
  EXPECT_LT(on.fp_rate(), off.fp_rate() / 2);
}

// --- dynamic size ----------------------------------------------------------------

TEST(TimerFilter, GrowsUnderBurstFromUndersizedStartAndShrinksAfter) {
  for (Growth growth : {Growth::kDensity, Growth::kCardinality}) {
    StreamSpec spec;
    spec.domain = 2'000'000;
    spec.base_rate = 100;
    spec.ticks = 1000;
    spec.burst_factor = 5;
    spec.seed = 31;
    auto events = generate_stream(spec);
    const std::uint32_t window = 100;
    const auto need = static_cast<std::uint64_t>(spec.base_rate * (window + 1));
    FilterConfig c = timer_config(8, window, need / 10);
    c.growth = growth;
    c.min_bytes = 1024;
    auto f = make(c);
    auto& timer = as_timer(*f);
    // Pre-sized reference: what a filter built for the base rate holds.
    auto reference = TimerFilter::create_presized(*normalize(timer_config(8, window, need)));
    const std::uint64_t presized = (*reference)->stats().bytes;

    std::uint32_t max_subs = 0;
    std::uint64_t bytes_before_burst = 0, max_bytes = 0;
    double worst_estimate = 0, worst_budget = 0;
    Tick last = 0;
    auto counts =
        run_against_oracle(*f, events, 1, [&](std::size_t, const Event& e, Decision, bool) {
          if (e.tick == last) return;
          last = e.tick;
          const auto st = f->stats();
          max_subs = std::max(max_subs, st.subfilters);
          max_bytes = std::max(max_bytes, st.bytes);
          if (e.tick == 333) bytes_before_burst = st.bytes;
          worst_estimate = std::max(worst_estimate, st.fpp_estimate);
          worst_budget = std::max(worst_budget, timer.fpp_budget_used());
        });
    SCOPED_TRACE(growth == Growth::kDensity ? "density" : "cardinality");
    EXPECT_EQ(counts.false_negatives, 0U);
    EXPECT_LE(counts.fp_rate(), c.fpp);
    EXPECT_LE(worst_estimate, c.fpp);
    EXPECT_LE(worst_budget, c.fpp);
    EXPECT_GE(max_subs, 2U);
    EXPECT_GT(max_bytes, 3 * bytes_before_burst);  // grew for the 5x burst
    const auto end = f->stats();
    // Density growth returns to one sub-filter; cardinality growth cannot
    // forget insertions, so it alternates between one and two (seed 000 §5).
    EXPECT_LE(end.subfilters, growth == Growth::kDensity ? 1U : 2U);
    EXPECT_LT(end.bytes, max_bytes / 2);
    EXPECT_LE(end.bytes, 3 * presized);
    EXPECT_GE(end.bytes, presized / 2);
  }
}

TEST(TimerFilter, BurstInsideOneTickGrowsGeometricallyNotByExtrapolation) {
  // Regression: a burst that arrives within one tick of a long window (as
  // with arrival time over a file) was extrapolated to (W + 1) times its size
  // and capped only by max_bytes. Growth over a short span must stay within
  // a small multiple of what holding the burst needs, and keep the fpp bound.
  for (Growth growth : {Growth::kDensity, Growth::kCardinality}) {
    SCOPED_TRACE(growth == Growth::kDensity ? "density" : "cardinality");
    const std::uint32_t window = 192;
    const std::uint64_t burst = 100'000;
    FilterConfig c = timer_config(8, window, 5'000);
    c.growth = growth;
    c.max_bytes = 256ULL << 20;
    auto f = make(c);
    auto& timer = as_timer(*f);
    std::uint64_t peak = 0, duplicates = 0;
    double worst_budget = 0;
    for (std::uint64_t id = 0; id < burst; ++id) {
      duplicates += f->test_and_insert(identity_fingerprint(id, 9), 7) == Decision::kDuplicate;
      if (id % 1024 == 0) {
        peak = std::max(peak, f->stats().bytes);
        worst_budget = std::max(worst_budget, timer.fpp_budget_used());
      }
    }
    peak = std::max(peak, f->stats().bytes);
    const std::uint64_t holding =
        (*TimerFilter::create_presized(*normalize(timer_config(8, window, burst))))->stats().bytes;
    EXPECT_GE(f->stats().subfilters, 2U);
    EXPECT_LE(peak, 6 * holding) << "peak " << peak << " vs " << holding << " to hold the burst";
    EXPECT_LE(worst_budget, c.fpp);
    EXPECT_LE(static_cast<double>(duplicates), 2 * c.fpp * static_cast<double>(burst));
    // Every element of the burst is still remembered.
    for (std::uint64_t id = 0; id < burst; id += 97) {
      ASSERT_EQ(f->test_and_insert(identity_fingerprint(id, 9), 8), Decision::kDuplicate);
    }
  }
}

TEST(TimerFilter, StatsReportCellsAndSubfilters) {
  auto f = make(timer_config(4, 8, 10'000));
  auto st0 = f->stats();
  EXPECT_EQ(st0.subfilters, 1U);
  EXPECT_EQ(st0.live_cells, 0U);
  EXPECT_EQ(st0.cells % 128, 0U);
  for (std::uint64_t id = 0; id < 1000; ++id)
    (void)f->test_and_insert(identity_fingerprint(id, 4), 1);
  auto st = f->stats();
  EXPECT_EQ(st.insertions, 1000U);
  EXPECT_GT(st.live_cells, 1000U);
  EXPECT_LE(st.live_cells, 1000U * as_timer(*f).k());
  EXPECT_GT(st.fpp_estimate, 0.0);
  // Idle for more than a window: the scrub clears everything.
  f->advance(1 + 8 + 1);
  for (Tick t = 11; t < 40; ++t) f->advance(t);
  EXPECT_EQ(f->stats().live_cells, 0U);
  EXPECT_EQ(f->stats().fpp_estimate, 0.0);
}

}  // namespace
}  // namespace kdedup::filter
