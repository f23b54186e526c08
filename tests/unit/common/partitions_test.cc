#include "kdedup/common/partitions.h"

#include <gtest/gtest.h>

namespace kdedup {
namespace {

TEST(SummarizePartitions, RangesPerTopicSortedAndDeduplicated) {
  EXPECT_EQ(summarize_partitions({}), "");
  EXPECT_EQ(summarize_partitions({{"in", 3}, {"in", 1}, {"in", 2}, {"in", 7}, {"a", 0}, {"in", 2}}),
            "a[0], in[1-3,7]");
  std::vector<std::pair<std::string, std::int32_t>> thousand;
  for (std::int32_t p = 1023; p >= 0; --p) thousand.emplace_back("in", p);
  EXPECT_EQ(summarize_partitions(thousand), "in[0-1023]");
  thousand.erase(thousand.begin() + 500);  // partition 523 missing
  EXPECT_EQ(summarize_partitions(thousand), "in[0-522,524-1023]");
}

}  // namespace
}  // namespace kdedup
