// Slice clock rules and partition placement.

#include "kdedup/pipeline/slice.h"

#include <gtest/gtest.h>

#include <vector>

#include "fixed_now.h"

namespace kdedup::pipeline {
namespace {

using filter::Decision;
using filter::Fingerprint;
using filter::Tick;

TEST(PartitionClock, IsTheMaximumTimestampSeen) {
  PartitionClock c(60'000);
  EXPECT_EQ(c.observe(kWall - 5000, kWall), PartitionClock::Reading::kTimestamp);
  EXPECT_EQ(c.now_ms(), kWall - 5000);
  EXPECT_EQ(c.observe(kWall - 9000, kWall), PartitionClock::Reading::kTimestamp);
  EXPECT_EQ(c.now_ms(), kWall - 5000);  // late records never move time back
  c.observe(kWall - 1000, kWall);
  EXPECT_EQ(c.now_ms(), kWall - 1000);
}

TEST(PartitionClock, FutureTimestampsAreCappedAtWallClockPlusSkew) {
  PartitionClock c(60'000);
  EXPECT_EQ(c.observe(kWall + 60'000, kWall), PartitionClock::Reading::kTimestamp);
  EXPECT_EQ(c.observe(kWall + 3'600'000, kWall), PartitionClock::Reading::kCapped);
  EXPECT_EQ(c.now_ms(), kWall + 60'000);
  EXPECT_EQ(c.observe(INT64_MAX, kWall), PartitionClock::Reading::kCapped);
  EXPECT_EQ(c.now_ms(), kWall + 60'000);
}

TEST(PartitionClock, ZeroAndNegativeTimestampsKeepTheClock) {
  PartitionClock c(60'000);
  c.observe(kWall, kWall);
  EXPECT_EQ(c.observe(0, kWall), PartitionClock::Reading::kNoTimestamp);
  EXPECT_EQ(c.observe(-1, kWall), PartitionClock::Reading::kNoTimestamp);
  EXPECT_EQ(c.observe(INT64_MIN, kWall), PartitionClock::Reading::kNoTimestamp);
  EXPECT_EQ(c.now_ms(), kWall);
}

TEST(PartitionClock, HugeSkewDoesNotOverflow) {
  PartitionClock c(INT64_MAX);
  EXPECT_EQ(c.observe(INT64_MAX, kWall), PartitionClock::Reading::kTimestamp);
  EXPECT_EQ(c.now_ms(), INT64_MAX);
}

SliceOptions exact_options(std::int64_t window_ms, std::uint32_t ticks) {
  SliceOptions o;
  o.window_ms = window_ms;
  o.max_future_skew_ms = 60'000;
  o.filter.type = filter::FilterType::kExact;
  o.filter.ticks_per_window = ticks;
  return o;
}

/// A timer filter charged to a memory budget of its own (10 s window).
SliceOptions budgeted_timer_options() {
  SliceOptions o = exact_options(10'000, 10);
  o.filter.type = filter::FilterType::kTimer;
  o.filter = *filter::normalize(o.filter);
  o.memory = std::make_shared<filter::MemoryBudget>();
  return o;
}

TEST(Slice, TickIsClockOverTickLength) {
  auto s = Slice::create({"t", 0}, exact_options(10'000, 10));
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ((*s)->scale(), filter::TickScale(10'000, 10));
  EXPECT_EQ((*s)->observe(kWall - 2500, kWall), static_cast<Tick>((kWall - 2500) / 1000));
  // no timestamp: judged at the current clock
  EXPECT_EQ((*s)->observe(0, kWall), static_cast<Tick>((kWall - 2500) / 1000));
  (*s)->observe(kWall + 10'000'000, kWall);
  EXPECT_EQ((*s)->clock().now_ms(), kWall + 60'000);
  EXPECT_EQ((*s)->counters()->clock_capped.load(), 1u);
  EXPECT_EQ((*s)->counters()->no_timestamp.load(), 1u);
  EXPECT_EQ((*s)->counters()->clock_ms.load(), kWall + 60'000);
}

TEST(Slice, DuplicatesInsideTheWindowExpireAfterIt) {
  auto made = Slice::create({"t", 0}, exact_options(10'000, 10));
  ASSERT_TRUE(made);
  Slice& s = **made;
  const Fingerprint a{1, 2}, b{3, 4};
  std::vector<Fingerprint> fps{a, b, a};
  std::vector<Tick> ticks(3, s.observe(kWall - 20'000, kWall));
  std::vector<Decision> out(3);
  s.decide(fps, ticks, out);
  EXPECT_EQ(
      out, (std::vector<Decision>{Decision::kDistinct, Decision::kDistinct, Decision::kDuplicate}));
  // 11 s later (more than window + one tick): a is new again
  Tick later = s.observe(kWall - 9'000, kWall);
  std::vector<Fingerprint> again{a};
  std::vector<Tick> t2{later};
  std::vector<Decision> out2(1);
  s.decide(again, t2, out2);
  EXPECT_EQ(out2[0], Decision::kDistinct);
}

TEST(Slice, PassthroughJudgesEverythingDistinct) {
  SliceOptions o = exact_options(10'000, 10);
  o.filter_enabled = false;
  auto s = Slice::create({"t", 3}, o);
  ASSERT_TRUE(s);
  EXPECT_EQ((*s)->filter(), nullptr);
  std::vector<Fingerprint> fps{{1, 1}, {1, 1}};
  std::vector<Tick> ticks{0, 0};
  std::vector<Decision> out(2, Decision::kDuplicate);
  (*s)->decide(fps, ticks, out);
  EXPECT_EQ(out, (std::vector<Decision>{Decision::kDistinct, Decision::kDistinct}));
}

TEST(Slice, RestoredStateContinues) {
  SliceOptions o = exact_options(10'000, 10);
  auto f = filter::make_filter(o.filter);
  ASSERT_TRUE(f);
  Slice s({"t", 1}, o, std::move(*f), kWall, 500);
  EXPECT_EQ(s.clock().now_ms(), kWall);
  EXPECT_EQ(s.next_offset(), 500);
  EXPECT_EQ(s.observe(kWall - 100'000, kWall), static_cast<Tick>(kWall / 1000));
  s.set_processed(500);
  EXPECT_EQ(s.next_offset(), 501);
  EXPECT_EQ(s.counters()->next_offset.load(), 501);
}

TEST(Slice, ItsFilterSharesTheProcessMemoryBudget) {
  // New and restored filters alike are charged while their Slice lives.
  SliceOptions o = exact_options(10'000, 10);
  o.filter.type = filter::FilterType::kTimer;
  o.filter.capacity = 1'000'000;  // a hint: the filter starts at its floor
  o.filter = *filter::normalize(o.filter);
  o.memory = std::make_shared<filter::MemoryBudget>();
  {
    auto fresh = Slice::create({"t", 0}, o);
    ASSERT_TRUE(fresh);
    EXPECT_GT(o.memory->used(), 0U);
    EXPECT_LE(o.memory->used(), o.filter.min_bytes);
    auto restored = filter::restore_filter((*fresh)->filter()->serialize());
    ASSERT_TRUE(restored);
    Slice again({"t", 1}, o, std::move(*restored), kWall, 10);
    EXPECT_EQ(o.memory->used(), 2 * (*fresh)->filter()->stats().cells);  // 8-bit cells
  }
  EXPECT_EQ(o.memory->used(), 0U);
}

TEST(Slice, AParkedSliceHoldsNoFilterRefusesRecordsAndContinuesWithTheOneItIsGivenBack) {
  SliceOptions o = budgeted_timer_options();
  auto made = Slice::create({"t", 2}, o);
  ASSERT_TRUE(made);
  Slice& s = **made;
  const Fingerprint a{0x9E3779B97F4A7C15ULL, 0xC2B2AE3D27D4EB4FULL};
  const Fingerprint b{0x165667B19E3779F9ULL, 0x27D4EB2F165667C5ULL};
  std::vector<Fingerprint> fps{a};
  std::vector<Tick> ticks{s.observe(kWall - 1'000, kWall)};
  std::vector<Decision> out(1);
  s.decide(fps, ticks, out);
  const std::string saved = s.filter()->serialize();
  EXPECT_GT(o.memory->used(), 0U);

  ASSERT_TRUE(s.park());
  EXPECT_TRUE(s.parked());
  EXPECT_FALSE(s.park()) << "parked already";
  EXPECT_EQ(s.filter(), nullptr);
  EXPECT_EQ(o.memory->used(), 0U);
  EXPECT_TRUE(s.counters()->parked.load());
  EXPECT_EQ(s.counters()->filter_bytes.load(), 0U);
  // A record that reaches it now is refused, not judged distinct.
  std::vector<Fingerprint> both{a, b};
  std::vector<Tick> now(2, ticks[0]);
  std::vector<Decision> refused(2, Decision::kDuplicate);
  auto other = Slice::create({"t", 3}, o);
  ASSERT_TRUE(other);
  ASSERT_TRUE((*other)->park());
  (*other)->decide(both, now, refused);
  ASSERT_TRUE((*other)->failure());
  EXPECT_NE((*other)->failure()->find("t[3]"), std::string::npos) << *(*other)->failure();
  EXPECT_NE((*other)->failure()->find("parked"), std::string::npos) << *(*other)->failure();

  auto restored = filter::restore_filter(saved);
  ASSERT_TRUE(restored);
  s.unpark(std::move(*restored));
  EXPECT_FALSE(s.parked());
  EXPECT_FALSE(s.counters()->parked.load());
  EXPECT_EQ(s.counters()->unparks.load(), 1U);
  EXPECT_GT(o.memory->used(), 0U) << "the restored filter is charged";
  std::vector<Decision> decided(2);
  s.decide(both, now, decided);
  EXPECT_FALSE(s.failure());
  EXPECT_EQ(decided, (std::vector<Decision>{Decision::kDuplicate, Decision::kDistinct}));
}

TEST(Slice, APristineSliceIsMadeAnewAndStopsBeingPristineAtItsFirstRecord) {
  SliceOptions o = budgeted_timer_options();
  auto made = Slice::create({"t", 4}, o);
  ASSERT_TRUE(made);
  Slice& s = **made;
  EXPECT_TRUE(s.pristine()) << "a new slice's filter is the one make_filter() gives";
  const std::string empty = s.filter()->serialize();
  const std::uint64_t floor = o.memory->used();
  EXPECT_GT(floor, 0U);

  ASSERT_TRUE(s.park());
  EXPECT_EQ(o.memory->used(), 0U);
  ASSERT_TRUE(s.unpark_new());
  EXPECT_FALSE(s.parked());
  EXPECT_TRUE(s.pristine()) << "no record yet";
  EXPECT_EQ(s.counters()->unparks.load(), 1U);
  EXPECT_EQ(o.memory->used(), floor) << "the new filter is charged as the first was";
  EXPECT_EQ(s.filter()->serialize(), empty) << "made anew, the same filter";

  // An empty batch changes nothing; the first record ends it.
  std::vector<Decision> none;
  s.decide({}, {}, none);
  EXPECT_TRUE(s.pristine());
  const Fingerprint a{0x9E3779B97F4A7C15ULL, 0xC2B2AE3D27D4EB4FULL};
  std::vector<Fingerprint> fps{a};
  std::vector<Tick> ticks{s.observe(kWall - 1'000, kWall)};
  std::vector<Decision> out(1);
  s.decide(fps, ticks, out);
  EXPECT_EQ(out[0], Decision::kDistinct);
  EXPECT_FALSE(s.pristine());

  // A learned delivery (recovery) ends it too, and a restored filter never is.
  auto learner = Slice::create({"t", 5}, o);
  ASSERT_TRUE(learner);
  const std::vector<std::uint8_t> learn{1};
  (*learner)->decide(fps, ticks, out, learn);
  EXPECT_FALSE((*learner)->pristine());
  auto restored = filter::restore_filter(s.filter()->serialize());
  ASSERT_TRUE(restored);
  auto continued = Slice::create({"t", 4}, o, SliceStart{std::move(*restored), kWall - 1'000, 1});
  ASSERT_TRUE(continued);
  EXPECT_FALSE((*continued)->pristine());
}

TEST(Slice, PassthroughDoesNotPark) {
  SliceOptions o = exact_options(10'000, 10);
  o.filter_enabled = false;
  auto s = Slice::create({"t", 3}, o);
  ASSERT_TRUE(s);
  EXPECT_FALSE((*s)->park());
  EXPECT_FALSE((*s)->parked());
}

TEST(Slice, BadFilterConfigIsAnErrorNamingThePartition) {
  SliceOptions o = exact_options(10'000, 10);
  o.filter.fpp = 2.0;
  auto s = Slice::create({"clicks", 4}, o);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("clicks[4]"), std::string::npos);
  EXPECT_NE(s.error().message.find("fpp"), std::string::npos);
}

TEST(ChooseWorker, PicksTheLeastLoadedLowestIndex) {
  std::vector<std::uint32_t> load{0, 0, 0};
  std::vector<std::uint32_t> picks;
  for (int i = 0; i < 7; ++i) {
    auto w = choose_worker(load);
    ++load[w];
    picks.push_back(w);
  }
  EXPECT_EQ(picks, (std::vector<std::uint32_t>{0, 1, 2, 0, 1, 2, 0}));
  load = {3, 1, 1};
  EXPECT_EQ(choose_worker(load), 1u);
  load = {5};
  EXPECT_EQ(choose_worker(load), 0u);
}

}  // namespace
}  // namespace kdedup::pipeline
