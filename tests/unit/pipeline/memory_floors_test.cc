// The floors of the assigned partitions against memory.max_bytes: said at an
// assignment that passes it, at its edge and not before.

#include "memory_floors.h"

#include <gtest/gtest.h>

#include "kdedup/config/config.h"

namespace kdedup::pipeline {
namespace {

config::Config with_budget(std::uint64_t max_bytes, std::uint64_t min_bytes) {
  config::Config c;
  c.memory.max_bytes = max_bytes;
  c.filter.min_bytes = min_bytes;
  return c;
}

TEST(FloorsOverBudget, SaidWhenTheAssignedFloorsPassTheBudget) {
  const config::Config c = with_budget(64 * 1024, 4 * 1024);
  EXPECT_FALSE(warn_if_floors_exceed_budget(c, 0));
  EXPECT_FALSE(warn_if_floors_exceed_budget(c, 1));
  EXPECT_FALSE(warn_if_floors_exceed_budget(c, 16));  // 64 KiB: at the budget
  EXPECT_TRUE(warn_if_floors_exceed_budget(c, 17));
  EXPECT_TRUE(warn_if_floors_exceed_budget(c, 1024));
}

TEST(FloorsOverBudget, NeverWithoutABudget) {
  EXPECT_FALSE(warn_if_floors_exceed_budget(with_budget(0, 64 * 1024), 100000));
}

TEST(FloorsOverBudget, OneFloorPastTheBudgetIsSaid) {
  EXPECT_TRUE(warn_if_floors_exceed_budget(with_budget(64 * 1024 - 1, 64 * 1024), 1));
}

}  // namespace
}  // namespace kdedup::pipeline
