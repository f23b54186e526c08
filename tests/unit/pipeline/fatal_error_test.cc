// FatalError: the first problem wins, and a stage's message names the stage
// once.

#include "fatal_error.h"

#include <gtest/gtest.h>

namespace kdedup::pipeline {
namespace {

TEST(FatalError, TheFirstMessageIsKept) {
  FatalError fatal;
  EXPECT_FALSE(fatal.raised());
  fatal.set("consumer fatal error: fenced");
  fatal.set("a later problem");
  EXPECT_TRUE(fatal.raised());
  EXPECT_EQ(fatal.message(), "consumer fatal error: fenced");
}

TEST(FatalError, TheStagePrefixStartsTheMessage) {
  FatalError fatal{"repartition: "};
  fatal.set("offsets of clicks[3] went backwards at 17");
  EXPECT_EQ(fatal.message(), "repartition: offsets of clicks[3] went backwards at 17");
}

TEST(FatalError, AMessageNamingItsStageIsNotPrefixedTwice) {
  FatalError fatal{"repartition: "};
  fatal.set("repartition consumer fatal error: fenced");
  EXPECT_EQ(fatal.message(), "repartition consumer fatal error: fenced");
}

}  // namespace
}  // namespace kdedup::pipeline
