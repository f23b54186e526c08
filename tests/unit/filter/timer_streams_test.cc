// Checks the shared stream generators and the oracle runner that every
// filter test relies on (tests/support/streams.h).

#include "streams.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <unordered_set>

#include "kdedup/filter/exact_filter.h"

namespace kdedup::testing {
namespace {

TEST(Streams, SameSpecSameEvents) {
  StreamSpec spec;
  spec.ticks = 50;
  spec.seed = 7;
  auto a = generate_stream(spec);
  auto b = generate_stream(spec);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].fp, b[i].fp);
    EXPECT_EQ(a[i].tick, b[i].tick);
  }
  spec.seed = 8;
  auto c = generate_stream(spec);
  EXPECT_NE(a[0].fp, c[0].fp);
}

TEST(Streams, BurstMultipliesRateInMiddleThird) {
  StreamSpec spec;
  spec.ticks = 300;
  spec.base_rate = 10;
  spec.burst_factor = 5;
  spec.first_tick = 1000;
  std::map<Tick, int> per_tick;
  for (const Event& e : generate_stream(spec)) ++per_tick[e.tick];
  EXPECT_EQ(per_tick[1000], 10);
  EXPECT_EQ(per_tick[1099], 10);
  EXPECT_EQ(per_tick[1100], 50);
  EXPECT_EQ(per_tick[1199], 50);
  EXPECT_EQ(per_tick[1200], 10);
  EXPECT_EQ(per_tick[1299], 10);
  EXPECT_EQ(per_tick.size(), 300U);
}

TEST(Streams, FractionalRateSkipsTicks) {
  StreamSpec spec;
  spec.ticks = 100;
  spec.base_rate = 0.25;
  auto events = generate_stream(spec);
  EXPECT_EQ(events.size(), 25U);
  for (std::size_t i = 1; i < events.size(); ++i) EXPECT_GT(events[i].tick, events[i - 1].tick);
}

TEST(Streams, ZipfIsSkewedUniformIsNot) {
  StreamSpec spec;
  spec.domain = 1000;
  spec.ticks = 100;
  spec.base_rate = 200;
  auto distinct = [](const std::vector<Event>& events) {
    std::unordered_set<Fingerprint, filter::FingerprintHash> s;
    for (const Event& e : events) s.insert(e.fp);
    return s.size();
  };
  const auto uniform = distinct(generate_stream(spec));
  spec.distribution = Distribution::kZipf;
  EventStream zipf(spec);
  int top = 0;
  for (int i = 0; i < 20000; ++i) top += zipf.draw_identity() == 0 ? 1 : 0;
  // P(rank 1) = 1 / H(1000) ~= 0.1336 for alpha = 1.
  EXPECT_NEAR(top / 20000.0, 0.1336, 0.01);
  EXPECT_GT(uniform, 990U);
  EXPECT_LT(distinct(generate_stream(spec)), uniform);
}

TEST(Streams, OracleScoresExactFilterPerfectly) {
  StreamSpec spec;
  spec.domain = 500;
  spec.ticks = 400;
  spec.base_rate = 5;
  filter::FilterConfig config;
  config.type = filter::FilterType::kExact;
  config.ticks_per_window = 50;
  filter::ExactFilter exact(config);
  auto events = generate_stream(spec);
  auto counts = run_against_oracle(exact, events, 16);
  EXPECT_EQ(counts.events, events.size());
  EXPECT_EQ(counts.false_positives, 0U);
  EXPECT_EQ(counts.false_negatives, 0U);
  EXPECT_GT(counts.true_positives, 0U);
  EXPECT_GT(counts.true_negatives, 0U);
}

// A filter that always answers "duplicate" after the first event must be
// scored with false positives only, and one that never does with false
// negatives only: the runner must be able to fail a filter.
class ConstantFilter final : public filter::SlidingFilter {
 public:
  explicit ConstantFilter(filter::Decision d) : decision_(d) { config_.ticks_per_window = 10; }
  filter::FilterType type() const noexcept override { return filter::FilterType::kExact; }
  const filter::FilterConfig& config() const noexcept override { return config_; }
  filter::Decision test_and_insert(const Fingerprint&, Tick) override {
    if (first_) {
      first_ = false;
      return filter::Decision::kDistinct;
    }
    return decision_;
  }
  void insert(const Fingerprint&, Tick) override {}
  void advance(Tick) override {}
  filter::FilterStats stats() const override { return {}; }
  std::string serialize() const override { return {}; }

 private:
  filter::FilterConfig config_;
  filter::Decision decision_;
  bool first_ = true;
};

TEST(Streams, OracleCountsWrongAnswers) {
  std::vector<Event> events = {{identity_fingerprint(1, 0), 0},
                               {identity_fingerprint(2, 0), 1},
                               {identity_fingerprint(1, 0), 2},
                               {identity_fingerprint(1, 0), 30}};
  ConstantFilter always(filter::Decision::kDuplicate);
  auto c = run_against_oracle(always, events);
  EXPECT_EQ(c.true_negatives, 1U);
  EXPECT_EQ(c.false_positives, 2U);  // ids 2 and the expired 1
  EXPECT_EQ(c.true_positives, 1U);
  EXPECT_DOUBLE_EQ(c.fp_rate(), 2.0 / 3.0);

  ConstantFilter never(filter::Decision::kDistinct);
  c = run_against_oracle(never, events);
  EXPECT_EQ(c.false_negatives, 1U);
  EXPECT_EQ(c.true_negatives, 3U);
  EXPECT_EQ(c.false_positives, 0U);
}

// A filter that remembers the latest tick it was asked about: what the
// observer may see of the stream ahead of the event it is told about.
class TickSpy final : public filter::SlidingFilter {
 public:
  TickSpy() { config_.ticks_per_window = 10; }
  filter::FilterType type() const noexcept override { return filter::FilterType::kExact; }
  const filter::FilterConfig& config() const noexcept override { return config_; }
  filter::Decision test_and_insert(const Fingerprint&, Tick now) override {
    seen = std::max(seen, now);
    return filter::Decision::kDistinct;
  }
  void insert(const Fingerprint&, Tick) override {}
  void advance(Tick) override {}
  filter::FilterStats stats() const override { return {}; }
  std::string serialize() const override { return {}; }

  Tick seen = 0;

 private:
  filter::FilterConfig config_;
};

TEST(Streams, TickChunksShowTheObserverEachTickAsItCloses) {
  StreamSpec spec;
  spec.ticks = 40;
  spec.base_rate = 20;
  const auto events = generate_stream(spec);
  for (const bool tick_chunks : {false, true}) {
    TickSpy spy;
    std::size_t ahead = 0, closes = 0;
    const auto counts = run_against_oracle(
        spy, events, 64,
        [&](std::size_t i, const Event& e, filter::Decision, bool) {
          ahead += spy.seen > e.tick ? 1 : 0;
          closes += closes_tick(events, i) ? 1 : 0;
        },
        tick_chunks);
    EXPECT_EQ(counts.events, events.size());
    EXPECT_EQ(closes, 40U);
    // Chunks of 64 over 20 events a tick reach into the next tick, unless
    // they end at each change of tick.
    if (tick_chunks) {
      EXPECT_EQ(ahead, 0U);
    } else {
      EXPECT_GT(ahead, 0U);
    }
  }
}

}  // namespace
}  // namespace kdedup::testing
