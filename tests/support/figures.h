#pragma once
// Tests whose assertions are figures of long streams (bits per identity at
// a burst's peak, false-positive rates, how often a filter resizes) check
// them in the optimised build only.
//
// Under AddressSanitizer or ThreadSanitizer, replaying a stream of a
// million events against the exact oracle takes five to ten times as long,
// and the figures are the same as in the optimised build. The code such a
// test drives (expanding, folding, sealing, restoring along a burst) runs
// under the sanitizers through the shorter tests that check decisions and
// states: MemoryFollowsLoad's restore-along-a-burst and drain-fold tests,
// TimerFilter's and CompactFilter's batch, restore and growth tests.

#include <gtest/gtest.h>

#include "sanitizer.h"

/// First statement of a figures test: skips it in a sanitizer build.
#define KDEDUP_FIGURES_TEST()                                                   \
  do {                                                                          \
    if (::kdedup::testing::kSanitizerBuild) {                                   \
      GTEST_SKIP() << "a figures test: the optimised build checks its figures"; \
    }                                                                           \
  } while (0)
