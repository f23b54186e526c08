// The time -> tick mapping and its guarantee (DESIGN.md "Clock"): an
// identity delivered at time t is a duplicate for every arrival at a time
// <= t + window, and is forgotten by t + window + one tick, for windows from
// 1 ms to 30 days and every filter type's range of ticks_per_window.

#include "kdedup/filter/tick_scale.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kdedup/filter/exact_filter.h"

namespace kdedup::filter {
namespace {

// The filters' age rule (sliding_filter.h): alive iff now - a <= W.
bool alive(const TickScale& s, std::int64_t delivered_ms, std::int64_t now_ms) {
  return s.tick(now_ms) - s.tick(delivered_ms) <= s.ticks_per_window();
}

TEST(TickScale, TheWindowIsExactAtBothEnds) {
  std::mt19937_64 rng(42);
  constexpr std::int64_t kDay = 86'400'000;
  const std::uint32_t widths[] = {1, 3, 8, 12, 60, 100, 192, 252, 1000, 4096, 65'532};
  for (int i = 0; i < 200'000; ++i) {
    // Windows spread over 1 ms .. 30 days on a log scale.
    const double exponent = std::uniform_real_distribution<double>(0, std::log(30.0 * kDay))(rng);
    const auto window = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::exp(exponent)));
    const std::uint32_t w = widths[rng() % std::size(widths)];
    const TickScale s(window, w);
    const auto t = static_cast<std::int64_t>(rng() % (1'000'000'000'000'000ULL));
    ASSERT_TRUE(alive(s, t, t + window)) << "window " << window << " W " << w << " t " << t;
    ASSERT_TRUE(alive(s, t, t)) << window;
    ASSERT_FALSE(alive(s, t, t + window + s.tick_ms_ceil()))
        << "window " << window << " W " << w << " t " << t;
  }
}

TEST(TickScale, LastMillisecondOfTheWindowAtCommonSettings) {
  // The settings of the bug: 1 s / 192 used to become 5 ms ticks (960 ms).
  for (const auto& [window, w] : std::vector<std::pair<std::int64_t, std::uint32_t>>{
           {1'000, 192}, {250, 192}, {60'000, 192}, {1'000, 8}, {7, 4096}}) {
    const TickScale s(window, w);
    for (std::int64_t t = 1'700'000'000'000; t < 1'700'000'000'000 + 3 * window;
         t += 1 + window / 97) {
      EXPECT_TRUE(alive(s, t, t + window - 1)) << window << "/" << w << " at " << t;
      EXPECT_TRUE(alive(s, t, t + window)) << window << "/" << w << " at " << t;
      EXPECT_FALSE(alive(s, t, t + window + s.tick_ms_ceil())) << window << "/" << w << " at " << t;
    }
  }
}

TEST(TickScale, AnExactFilterOnTheScaleHonoursTheContract) {
  const TickScale s(1'000, 192);
  FilterConfig c;
  c.type = FilterType::kExact;
  c.ticks_per_window = s.ticks_per_window();
  ExactFilter f(*normalize(c));
  const std::int64_t t0 = 1'700'000'000'123;
  const Fingerprint a{1, 1}, b{2, 2};
  EXPECT_EQ(f.test_and_insert(a, s.tick(t0)), Decision::kDistinct);
  EXPECT_EQ(f.test_and_insert(a, s.tick(t0 + 999)), Decision::kDuplicate);
  EXPECT_EQ(f.test_and_insert(a, s.tick(t0 + 1'000)), Decision::kDuplicate);
  EXPECT_EQ(f.test_and_insert(b, s.tick(t0 + 1'000)), Decision::kDistinct);
  EXPECT_EQ(f.test_and_insert(a, s.tick(t0 + 1'000 + s.tick_ms_ceil())), Decision::kDistinct);
}

TEST(TickScale, StartOfTickAndDescriptions) {
  const TickScale s(1'000, 192);
  for (Tick t : {Tick{0}, Tick{1}, Tick{191}, Tick{192}, Tick{123'456'789}}) {
    EXPECT_EQ(s.tick(s.start_ms(t)), t);
    EXPECT_EQ(s.tick(s.start_ms(t) - 1), t == 0 ? 0 : t - 1);
  }
  EXPECT_EQ(s.describe_tick(), "5.208ms");
  EXPECT_EQ(TickScale(600'000, 192).describe_tick(), "3125ms");
  EXPECT_EQ(s.tick_ms_ceil(), 6);
  EXPECT_EQ(s.tick(-5), 0u);
}

TEST(TickScale, FingerprintDependsOnWindowAndTicks) {
  const TickScale a(1'000, 192);
  EXPECT_EQ(a.fingerprint(), TickScale(1'000, 192).fingerprint());
  EXPECT_NE(a.fingerprint(), TickScale(1'001, 192).fingerprint());
  EXPECT_NE(a.fingerprint(), TickScale(1'000, 191).fingerprint());
}

TEST(TickScale, MakeRejectsBadArguments) {
  EXPECT_FALSE(TickScale::make(0, 10));
  EXPECT_FALSE(TickScale::make(10, 0));
  EXPECT_NE(TickScale::make(-1, 10).error().message.find("window"), std::string::npos);
  EXPECT_TRUE(TickScale::make(1, 65'532));
}

}  // namespace
}  // namespace kdedup::filter
