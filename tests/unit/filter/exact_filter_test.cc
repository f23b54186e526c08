#include "kdedup/filter/exact_filter.h"

#include <gtest/gtest.h>

#include <random>

namespace kdedup::filter {
namespace {

FilterConfig exact(std::uint32_t w) {
  FilterConfig c;
  c.type = FilterType::kExact;
  c.ticks_per_window = w;
  return *normalize(c);
}

TEST(ExactFilter, RemembersForExactlyTheWindow) {
  ExactFilter f(exact(10));
  const Fingerprint a{1, 2};
  EXPECT_EQ(f.test_and_insert(a, 100), Decision::kDistinct);
  EXPECT_EQ(f.test_and_insert(a, 110), Decision::kDuplicate);  // age 10 == W: alive
  EXPECT_EQ(f.test_and_insert(a, 111), Decision::kDistinct);   // age 11 > W: expired
  EXPECT_EQ(f.test_and_insert(a, 115), Decision::kDuplicate);  // re-inserted at 111
}

TEST(ExactFilter, DuplicatesDoNotExtendLifetime) {
  ExactFilter f(exact(10));
  const Fingerprint a{3, 4};
  EXPECT_EQ(f.test_and_insert(a, 0), Decision::kDistinct);
  EXPECT_EQ(f.test_and_insert(a, 9), Decision::kDuplicate);
  EXPECT_EQ(f.test_and_insert(a, 11), Decision::kDistinct);
}

TEST(ExactFilter, SerializeRestoreGivesIdenticalFutureDecisions) {
  ExactFilter f(exact(50));
  std::mt19937_64 rng(7);
  Tick t = 0;
  for (int i = 0; i < 5000; ++i) {
    t += rng() % 2;
    f.test_and_insert({rng() % 500, 0}, t);
  }
  auto restored = restore_filter(f.serialize());
  ASSERT_TRUE(restored) << restored.error().message;
  for (int i = 0; i < 5000; ++i) {
    t += rng() % 2;
    const Fingerprint fp{rng() % 500, 0};
    ASSERT_EQ(f.test_and_insert(fp, t), (*restored)->test_and_insert(fp, t)) << i;
  }
}

TEST(ExactFilter, RejectsCorruptedState) {
  ExactFilter f(exact(50));
  for (std::uint64_t i = 0; i < 100; ++i) f.test_and_insert({i, i}, i);
  std::string blob = f.serialize();
  blob[blob.size() / 2] ^= 0x10;
  EXPECT_FALSE(restore_filter(blob));
  EXPECT_FALSE(restore_filter(f.serialize().substr(0, 40)));
}

}  // namespace
}  // namespace kdedup::filter
