// The demo's and the benchmark's stream generator: the click stream is
// reproducible and full of duplicates.

#include "kdedup/testbroker/click_stream.h"

#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>

namespace kdedup::testbroker {
namespace {

TEST(ClickStream, ReproducibleWithDuplicatesOfEveryKind) {
  ClickStreamOptions o{.records = 20'000, .start_ms = 1'000'000, .span_ms = 200'000, .seed = 7};
  ClickStream a(o), b(o);
  Click ca, cb;
  std::map<Click::Kind, int> kinds;
  std::set<std::string> keys;
  std::int64_t min_ts = INT64_MAX, max_ts = 0;
  int n = 0;
  while (a.next(ca)) {
    ASSERT_TRUE(b.next(cb));
    ASSERT_EQ(ca.key, cb.key);
    ASSERT_EQ(ca.value, cb.value);
    ++kinds[ca.kind];
    keys.insert(ca.key);
    min_ts = std::min(min_ts, ca.timestamp_ms);
    max_ts = std::max(max_ts, ca.timestamp_ms);
    ++n;
  }
  EXPECT_FALSE(b.next(cb));
  EXPECT_EQ(n, 20'000);
  EXPECT_GT(kinds[Click::Kind::kRetry], 500);
  EXPECT_GT(kinds[Click::Kind::kRepost], 50);
  EXPECT_GT(kinds[Click::Kind::kFraud], 100);
  EXPECT_LT(keys.size(), 20'000u);  // Zipf collisions plus the duplicates
  EXPECT_GE(min_ts, 1'000'000);
  EXPECT_LE(max_ts, 1'000'000 + 200'000 + 180'000);
}

TEST(ZipfSampler, FavoursSmallRanks) {
  ZipfSampler z(1000, 1.1);
  std::mt19937_64 rng(3);
  int first = 0, last_half = 0;
  for (int i = 0; i < 10'000; ++i) {
    auto v = z(rng);
    ASSERT_LT(v, 1000u);
    first += v == 0;
    last_half += v >= 500;
  }
  EXPECT_GT(first, last_half);
}

}  // namespace
}  // namespace kdedup::testbroker
