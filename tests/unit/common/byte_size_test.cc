#include "kdedup/common/byte_size.h"

#include <gtest/gtest.h>

namespace kdedup {
namespace {

TEST(FormatBytes, TheLargestUnitTheCountReaches) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(96 * 1024), "96.0 KiB");
  EXPECT_EQ(format_bytes(1048524), "1023.9 KiB");  // 1023.94 KiB
  EXPECT_EQ(format_bytes(1048525), "1.0 MiB");     // 1023.95 KiB would round to 1024.0
  EXPECT_EQ(format_bytes((1 << 20) - 1), "1.0 MiB");
  EXPECT_EQ(format_bytes((1ULL << 30) - 1), "1.00 GiB");
  EXPECT_EQ(format_bytes(3 << 19), "1.5 MiB");
  EXPECT_EQ(format_bytes(1ULL << 30), "1.00 GiB");
  EXPECT_EQ(format_bytes(~0ULL), "17179869184.00 GiB");
}

}  // namespace
}  // namespace kdedup
