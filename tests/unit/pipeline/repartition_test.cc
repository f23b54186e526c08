// H_S of the repartition stage (seed 000 §3): every identity has one slice,
// in range, the same for every instance and call, spread evenly over the
// slices whatever their count, and independent of the filter's own use of
// the fingerprint.

#include "kdedup/pipeline/repartition.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kdedup::pipeline {
namespace {

TEST(SliceOf, DeterministicAndInRange) {
  const filter::Fingerprinter a("salt"), b("salt");
  for (int i = 0; i < 1'000; ++i) {
    const std::string id = "user-" + std::to_string(i);
    const std::int32_t s = slice_of(a(id), 8);
    EXPECT_GE(s, 0);
    EXPECT_LT(s, 8);
    EXPECT_EQ(s, slice_of(b(id), 8)) << "another instance (same salt) must agree";
  }
  EXPECT_EQ(slice_of(a("x"), 1), 0);
}

TEST(SliceOf, SpreadsEvenlyForAnyPartitionCount) {
  const filter::Fingerprinter fp("another salt");
  for (std::int32_t n : {2, 7, 8, 12, 64}) {
    std::vector<int> count(static_cast<std::size_t>(n), 0);
    const int records = 20'000 * n;
    for (int i = 0; i < records; ++i)
      ++count[static_cast<std::size_t>(slice_of(fp(std::to_string(i)), n))];
    for (std::int32_t s = 0; s < n; ++s) {
      EXPECT_NEAR(count[static_cast<std::size_t>(s)], 20'000, 20'000 * 0.04)
          << n << " slices, slice " << s;
    }
  }
}

TEST(SliceOf, IndependentOfTheLowBitsTheFiltersProbe) {
  // Identities whose fingerprints agree in their low halves' low bits must
  // still spread: the slice is not a function of fp.lo mod n.
  std::vector<int> count(8, 0);
  for (std::uint64_t i = 0; i < 8'000; ++i) {
    ++count[static_cast<std::size_t>(slice_of(filter::Fingerprint{i << 3, i * 31 + 7}, 8))];
  }
  for (int c : count) EXPECT_NEAR(c, 1'000, 150);
}

TEST(SliceOf, ChangesWithTheSalt) {
  const filter::Fingerprinter a("salt-a"), b("salt-b");
  int same = 0;
  for (int i = 0; i < 4'000; ++i)
    same += slice_of(a(std::to_string(i)), 8) == slice_of(b(std::to_string(i)), 8);
  EXPECT_NEAR(same, 500, 120) << "a different salt gives an unrelated slicing";
}

}  // namespace
}  // namespace kdedup::pipeline
