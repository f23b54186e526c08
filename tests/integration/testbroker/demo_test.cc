// `kdedup demo` as a user runs it: a small stream through the test broker and
// `kdedup run`, checked against the exact semantics; and bad configs are
// refused up front with the offending key named.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "process.h"

namespace kdedup::testing {
namespace {

using ::testing::HasSubstr;

TEST(Demo, SmallStreamPassesTheExactCheck) {
  auto r =
      run_kdedup({"demo", "--records", "6000", "--partitions", "2", "--instances", "1", "--config",
                  std::string(KDEDUP_SOURCE_DIR) + "/config/local.yaml", "--timeout", "90"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("records in                         6000"));
  EXPECT_THAT(r.out, HasSubstr("false negatives (duplicates out)   0"));
  EXPECT_THAT(r.out, HasSubstr("PASS"));
}

TEST(Demo, InvalidConfigIsRefusedBeforeStartingAnything) {
  TempDir dir;
  write_file(dir.file("bad.yaml"), "group_id: g\nwindow: 10x\n");
  auto r = run_kdedup({"demo", "--config", dir.file("bad.yaml")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("is not valid"));
  EXPECT_THAT(r.err, HasSubstr("window"));
}

TEST(Demo, BadFlagIsAUsageError) {
  auto r = run_kdedup({"demo", "--records", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

}  // namespace
}  // namespace kdedup::testing
