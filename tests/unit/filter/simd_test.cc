// The vector level switch (kdedup/filter/simd.h): names, and set_simd() as a
// cap at what the CPU supports.

#include "kdedup/filter/simd.h"

#include <gtest/gtest.h>

namespace kdedup::filter {
namespace {

TEST(Simd, NamesRoundTripAndNothingElseParses) {
  for (const Simd s : {Simd::kPortable, Simd::kAvx2, Simd::kAvx512}) {
    EXPECT_EQ(simd_from_string(to_string(s)), s);
  }
  for (const char* bad : {"", "AVX2", "avx", "sse2", "avx512 ", "auto"}) {
    EXPECT_FALSE(simd_from_string(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(Simd, SetIsACapAtWhatTheCpuSupports) {
  const Simd saved = simd_in_use();
  const Simd best = simd_supported();
  EXPECT_EQ(set_simd(Simd::kPortable), Simd::kPortable);
  EXPECT_EQ(simd_in_use(), Simd::kPortable);
  // Asking for more than the CPU has gives what it has.
  EXPECT_EQ(set_simd(Simd::kAvx512), best);
  EXPECT_EQ(simd_in_use(), best);
  const Simd avx2 = set_simd(Simd::kAvx2);
  EXPECT_EQ(avx2, best == Simd::kPortable ? Simd::kPortable : Simd::kAvx2);
  set_simd(saved);
}

}  // namespace
}  // namespace kdedup::filter
