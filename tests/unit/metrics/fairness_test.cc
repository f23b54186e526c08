#include "kdedup/metrics/fairness.h"

#include <gtest/gtest.h>

#include <vector>

namespace kdedup::metrics {
namespace {

TEST(Fairness, EqualLoadsArePerfectlyFair) {
  const std::vector<double> loads(8, 125.0);
  EXPECT_DOUBLE_EQ(jain_fairness(loads), 1.0);
  EXPECT_DOUBLE_EQ(max_share(loads), 1.0 / 8);
}

TEST(Fairness, OneHotSliceGivesOneOverS) {
  for (std::size_t s : {2u, 4u, 16u}) {
    std::vector<double> loads(s, 0.0);
    loads[s / 2] = 1000.0;
    EXPECT_DOUBLE_EQ(jain_fairness(loads), 1.0 / static_cast<double>(s)) << "S=" << s;
    EXPECT_DOUBLE_EQ(max_share(loads), 1.0) << "S=" << s;
  }
}

TEST(Fairness, SkewedLoadMatchesTheFormula) {
  // (1+2+3)^2 / (3 * (1+4+9)) = 36/42
  const std::vector<double> loads{1.0, 2.0, 3.0};
  EXPECT_DOUBLE_EQ(jain_fairness(loads), 36.0 / 42.0);
  EXPECT_DOUBLE_EQ(max_share(loads), 0.5);
}

TEST(Fairness, ScaleInvariant) {
  const std::vector<double> a{1.0, 5.0, 2.0}, b{100.0, 500.0, 200.0};
  EXPECT_DOUBLE_EQ(jain_fairness(a), jain_fairness(b));
  EXPECT_DOUBLE_EQ(max_share(a), max_share(b));
}

TEST(Fairness, NoSlicesOrNoLoadIsVacuouslyEven) {
  EXPECT_DOUBLE_EQ(jain_fairness({}), 1.0);
  EXPECT_DOUBLE_EQ(max_share({}), 0.0);
  const std::vector<double> idle(3, 0.0);
  EXPECT_DOUBLE_EQ(jain_fairness(idle), 1.0);
  EXPECT_DOUBLE_EQ(max_share(idle), 0.0);
}

}  // namespace
}  // namespace kdedup::metrics
