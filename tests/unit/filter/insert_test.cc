// SlidingFilter::insert on every filter type: an identity recorded as
// delivered is a duplicate for the whole window after the insert, a second
// insert renews it (on_duplicate: refresh), and a filter rebuilt by
// inserting only what another filter delivered decides the rest of the
// stream as that filter does (recovery's rebuild from the output).

#include <gtest/gtest.h>

#include <random>

#include "kdedup/common/bytes.h"
#include "kdedup/filter/sliding_filter.h"
#include "streams.h"
#include "timer_state.h"

namespace kdedup::filter {
namespace {

constexpr Tick kW = 20;

FilterConfig config_of(FilterType type) {
  FilterConfig c;
  c.type = type;
  c.ticks_per_window = kW;
  c.fpp = 0.01;
  c.capacity = 2'000;
  return c;
}

std::unique_ptr<SlidingFilter> make(FilterType type) {
  auto f = make_filter(config_of(type));
  EXPECT_TRUE(f) << f.error().message;
  return std::move(*f);
}

class Insert : public ::testing::TestWithParam<FilterType> {};

TEST_P(Insert, IsADuplicateForTheWholeWindow) {
  auto f = make(GetParam());
  const Fingerprint a{0x1234, 0x9876};
  f->insert(a, 100);
  for (Tick t = 100; t <= 100 + kW; t += 5) {
    EXPECT_EQ(f->test_and_insert(a, t), Decision::kDuplicate) << "tick " << t;
  }
}

TEST_P(Insert, ALiveIdentityIsRenewed) {
  auto f = make(GetParam());
  const Fingerprint a{0x55, 0xAA};
  EXPECT_EQ(f->test_and_insert(a, 0), Decision::kDistinct);
  f->insert(a, kW);  // a duplicate at age W renews the identity (refresh)
  EXPECT_EQ(f->test_and_insert(a, 2 * kW), Decision::kDuplicate);
}

TEST_P(Insert, ExactTimerAndCompactForgetOneWindowAfterTheLastInsert) {
  if (GetParam() == FilterType::kAging) GTEST_SKIP() << "the aging filter's edge is soft";
  auto f = make(GetParam());
  const Fingerprint a{0x77, 0x1};
  f->insert(a, 10);
  f->insert(a, 15);
  EXPECT_EQ(f->test_and_insert(a, 15 + kW), Decision::kDuplicate);
  EXPECT_EQ(f->test_and_insert(a, 16 + kW), Decision::kDistinct);
}

// Filter A decides a stream; filter B only learns A's deliveries (insert)
// for the first half. On the second half both must decide the same, up to
// the probabilistic filters' own false positives: B must never let through
// what A drops because it was delivered (no false negative), and never drop
// an identity A delivered in the second half more often than fpp allows.
TEST_P(Insert, RebuildFromDeliveriesDecidesLikeTheOriginal) {
  testing::StreamSpec spec;
  spec.ticks = 8 * kW;
  spec.base_rate = 150;
  spec.domain = 3'000;
  spec.distribution = testing::Distribution::kZipf;
  spec.seed = 11;
  const auto events = testing::generate_stream(spec);
  auto a = make(GetParam());
  auto b = make(GetParam());
  const std::size_t half = events.size() / 2;
  for (std::size_t i = 0; i < half; ++i) {
    if (a->test_and_insert(events[i].fp, events[i].tick) == Decision::kDistinct) {
      b->insert(events[i].fp, events[i].tick);
    }
  }
  std::uint64_t differ = 0, distinct = 0;
  for (std::size_t i = half; i < events.size(); ++i) {
    const Decision da = a->test_and_insert(events[i].fp, events[i].tick);
    const Decision db = b->test_and_insert(events[i].fp, events[i].tick);
    distinct += da == Decision::kDistinct;
    if (da != db) ++differ;
    if (GetParam() == FilterType::kExact) {
      ASSERT_EQ(da, db) << "event " << i;
    }
  }
  EXPECT_LE(differ, static_cast<std::uint64_t>(0.03 * static_cast<double>(distinct)) + 2)
      << distinct << " distinct in the second half";
}

// For the exact, timer and compact filters the rebuilt state is the
// original's, byte for byte: the same cells are written at the same ticks.
// The timer filter's growth state (format 4) is left out: it counts the
// queries, and a rebuild sees only what was delivered.
TEST_P(Insert, RebuiltStateEqualsTheOriginal) {
  if (GetParam() == FilterType::kAging) {
    GTEST_SKIP() << "the aging filter's generations also count the clock moves of duplicates";
  }
  std::mt19937_64 rng(3);
  auto a = make(GetParam());
  auto b = make(GetParam());
  Tick t = 1;
  for (int i = 0; i < 30'000; ++i) {
    t += rng() % 3 == 0 ? 1 : 0;
    const Fingerprint fp{rng() % 4'000, 17};
    if (a->test_and_insert(fp, t) == Decision::kDistinct) b->insert(fp, t);
  }
  b->advance(t);
  a->advance(t);
  if (GetParam() != FilterType::kTimer) {
    EXPECT_EQ(a->serialize(), b->serialize());
    return;
  }
  const std::string sa = a->serialize(), sb = b->serialize();  // the envelopes view into them
  auto ea = open_envelope(sa, "original");
  auto eb = open_envelope(sb, "rebuilt");
  ASSERT_TRUE(ea && eb);
  const std::size_t subs = a->stats().subfilters;
  EXPECT_EQ(ea->payload.substr(0, growth_state_at(ea->payload, subs)),
            eb->payload.substr(0, growth_state_at(eb->payload, subs)));
}

INSTANTIATE_TEST_SUITE_P(EveryType, Insert,
                         ::testing::Values(FilterType::kTimer, FilterType::kAging,
                                           FilterType::kExact, FilterType::kCompact),
                         [](const ::testing::TestParamInfo<FilterType>& p) {
                           return std::string(to_string(p.param));
                         });

}  // namespace
}  // namespace kdedup::filter
