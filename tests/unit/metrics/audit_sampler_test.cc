#include "kdedup/metrics/audit_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bitset>
#include <cmath>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "kdedup/filter/exact_filter.h"
#include "kdedup/filter/fingerprint.h"

namespace kdedup::metrics {
namespace {

using filter::Decision;
using filter::Fingerprint;
using filter::Tick;

constexpr std::uint32_t kWindowTicks = 16;

// A deliberately bad filter: a 512-bit Bloom filter with 3 probes taken from
// fp.lo, never cleared. It fills up within a few hundred identities and then
// calls almost everything a duplicate.
class TinyBloom final : public filter::SlidingFilter {
 public:
  filter::FilterType type() const noexcept override { return filter::FilterType::kTimer; }
  const filter::FilterConfig& config() const noexcept override { return config_; }
  Decision test_and_insert(const Fingerprint& fp, Tick) override {
    bool all = true;
    for (int i = 0; i < 3; ++i) all &= bits_.test(probe(fp, i));
    if (all) return Decision::kDuplicate;
    insert(fp, 0);
    return Decision::kDistinct;
  }
  void insert(const Fingerprint& fp, Tick) override {
    for (int i = 0; i < 3; ++i) bits_.set(probe(fp, i));
  }
  void advance(Tick) override {}
  filter::FilterStats stats() const override { return {}; }
  std::string serialize() const override { return {}; }

 private:
  static std::size_t probe(const Fingerprint& fp, int i) { return (fp.lo >> (9 * i)) & 511; }
  filter::FilterConfig config_;
  std::bitset<512> bits_;
};

// A filter that forgets everything: every duplicate gets through.
class Forgetful final : public filter::SlidingFilter {
 public:
  filter::FilterType type() const noexcept override { return filter::FilterType::kTimer; }
  const filter::FilterConfig& config() const noexcept override { return config_; }
  Decision test_and_insert(const Fingerprint&, Tick) override { return Decision::kDistinct; }
  void insert(const Fingerprint&, Tick) override {}
  void advance(Tick) override {}
  filter::FilterStats stats() const override { return {}; }
  std::string serialize() const override { return {}; }

 private:
  filter::FilterConfig config_;
};

struct Truth {
  AuditCounts sampled;  // ground truth restricted to the sampler's selection
  std::uint64_t all_truly_new = 0;
  std::uint64_t all_false_positives = 0;
};

// Runs a skewed stream through `f`, feeding the sampler, and computes the
// ground truth independently with plain maps: identity -> tick of its last
// delivery (delivered = the filter said distinct), and identity -> tick of
// the drop that made it a false positive. Per identity (audit_sampler.h): an
// identity not delivered within the window is one trial, at its first such
// record; its later copies within a window of a drop are the same trial.
Truth run_stream(filter::SlidingFilter& f, AuditSampler& sampler, std::uint64_t seed) {
  filter::Fingerprinter fingerprinter("audit-test-salt");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id_dist(0, 2999);
  std::unordered_map<std::string, Tick> last_delivery, dropped_at;
  auto within = [](const std::unordered_map<std::string, Tick>& m, const std::string& id,
                   Tick now) {
    auto it = m.find(id);
    return it != m.end() && now - it->second <= kWindowTicks;
  };
  Truth t;
  for (int i = 0; i < 20000; ++i) {
    const Tick now = static_cast<Tick>(i / 50);
    const std::string id = "user-" + std::to_string(id_dist(rng));
    const Fingerprint fp = fingerprinter(id);
    const Decision d = f.test_and_insert(fp, now);
    sampler.observe(fp, d, now);

    const bool delivered = within(last_delivery, id, now);
    const bool same_trial = !delivered && within(dropped_at, id, now);
    const bool trial = !delivered && !same_trial;
    const bool dropped_new = d == Decision::kDuplicate && !delivered;
    const bool fp_case = dropped_new && trial;
    const bool fn_case = d == Decision::kDistinct && delivered;
    if (trial) ++t.all_truly_new;
    if (fp_case) ++t.all_false_positives;
    if (sampler.selects(fp)) {
      ++t.sampled.sampled;
      if (trial) ++t.sampled.truly_new;
      if (fp_case) ++t.sampled.false_positives;
      if (fn_case) ++t.sampled.false_negatives;
      if (dropped_new) ++t.sampled.false_positive_records;
    }
    if (fp_case) dropped_at[id] = now;
    if (d == Decision::kDistinct) last_delivery[id] = now;
  }
  return t;
}

void expect_counts_eq(const AuditCounts& got, const AuditCounts& want) {
  EXPECT_EQ(got.sampled, want.sampled);
  EXPECT_EQ(got.truly_new, want.truly_new);
  EXPECT_EQ(got.false_positives, want.false_positives);
  EXPECT_EQ(got.false_negatives, want.false_negatives);
  EXPECT_EQ(got.false_positive_records, want.false_positive_records);
}

TEST(AuditSampler, FindsTheBadFiltersFalsePositivesExactly) {
  TinyBloom bad;
  auto sampler = AuditSampler::create(kWindowTicks, 1);
  ASSERT_TRUE(sampler) << sampler.error().message;
  const Truth truth = run_stream(bad, *sampler, 1);
  EXPECT_GT(truth.sampled.false_positives, 1000u);  // the filter really is bad
  expect_counts_eq(sampler->totals(), truth.sampled);
}

TEST(AuditSampler, FindsAnOverloadedTimerFiltersFalsePositives) {
  // The real default filter, configured badly on purpose: a 30% target and a
  // capacity far below the ~1500 identities alive per window.
  filter::FilterConfig config;
  config.type = filter::FilterType::kTimer;
  config.ticks_per_window = kWindowTicks;
  config.fpp = 0.3;
  config.capacity = 50;
  config.timer_bits = 8;
  config.min_bytes = 64;
  config.max_bytes = 64;
  auto timer = filter::make_filter(config);
  ASSERT_TRUE(timer) << timer.error().message;
  auto sampler = AuditSampler::create(kWindowTicks, 1);
  ASSERT_TRUE(sampler);
  const Truth truth = run_stream(**timer, *sampler, 6);
  EXPECT_GT(truth.sampled.false_positives, 100u);
  expect_counts_eq(sampler->totals(), truth.sampled);
}

TEST(AuditSampler, SampledRateEstimatesThePopulationRate) {
  TinyBloom bad;
  auto sampler = AuditSampler::create(kWindowTicks, 16);
  ASSERT_TRUE(sampler);
  const Truth truth = run_stream(bad, *sampler, 2);
  expect_counts_eq(sampler->totals(), truth.sampled);
  const AuditCounts& s = sampler->totals();
  ASSERT_GT(s.truly_new, 100u);
  const double observed = static_cast<double>(s.false_positives) / static_cast<double>(s.truly_new);
  const double actual =
      static_cast<double>(truth.all_false_positives) / static_cast<double>(truth.all_truly_new);
  EXPECT_NEAR(observed, actual, 0.1) << "sampled " << s.sampled << " of 20000";
}

TEST(AuditSampler, ExactFilterHasNoFalsePositivesOrNegatives) {
  filter::FilterConfig config;
  config.type = filter::FilterType::kExact;
  config.ticks_per_window = kWindowTicks;
  filter::ExactFilter exact(config);
  auto sampler = AuditSampler::create(kWindowTicks, 4);
  ASSERT_TRUE(sampler);
  const Truth truth = run_stream(exact, *sampler, 3);
  expect_counts_eq(sampler->totals(), truth.sampled);
  EXPECT_EQ(sampler->totals().false_positives, 0u);
  EXPECT_EQ(sampler->totals().false_negatives, 0u);
  EXPECT_GT(sampler->totals().truly_new, 0u);
  EXPECT_LT(sampler->totals().truly_new, sampler->totals().sampled);  // duplicates were seen
}

TEST(AuditSampler, ForgetfulFilterShowsFalseNegatives) {
  Forgetful forgetful;
  auto sampler = AuditSampler::create(kWindowTicks, 2);
  ASSERT_TRUE(sampler);
  const Truth truth = run_stream(forgetful, *sampler, 4);
  expect_counts_eq(sampler->totals(), truth.sampled);
  EXPECT_GT(sampler->totals().false_negatives, 100u);
  EXPECT_EQ(sampler->totals().false_positives, 0u);
}

TEST(AuditSampler, DrainReturnsCountsSinceThePreviousDrain) {
  auto sampler = AuditSampler::create(kWindowTicks, 1);
  ASSERT_TRUE(sampler);
  const Fingerprint a{1, 2}, b{3, 4};
  sampler->observe(a, Decision::kDistinct, 0);   // truly new
  sampler->observe(a, Decision::kDuplicate, 1);  // correct duplicate
  AuditCounts first = sampler->drain();
  expect_counts_eq(first, AuditCounts{2, 1, 0, 0, 0});
  sampler->observe(b, Decision::kDuplicate, 2);                 // never delivered: FP
  sampler->observe(a, Decision::kDuplicate, 2 + kWindowTicks);  // a expired: FP
  sampler->observe(a, Decision::kDistinct, 3 + kWindowTicks);   // same trial, now delivered
  sampler->observe(a, Decision::kDistinct, 4 + kWindowTicks);   // FN
  expect_counts_eq(sampler->drain(), AuditCounts{4, 2, 2, 1, 2});
  expect_counts_eq(sampler->drain(), AuditCounts{});
  expect_counts_eq(sampler->totals(), AuditCounts{6, 3, 2, 1, 2});
}

TEST(AuditSampler, AnIdentityDroppedOnceIsOneFalsePositiveWhileItsCopiesAreDropped) {
  auto sampler = AuditSampler::create(kWindowTicks, 1);
  ASSERT_TRUE(sampler);
  const Fingerprint x{5, 6}, y{7, 8};
  for (Tick t = 0; t < 4; ++t) sampler->observe(x, Decision::kDuplicate, t);  // never delivered
  sampler->observe(y, Decision::kDistinct, 4);
  for (Tick t = 5; t < 8; ++t) sampler->observe(y, Decision::kDuplicate, t);  // right
  // One trial each: x dropped (4 records wrongly dropped), y delivered.
  expect_counts_eq(sampler->totals(), AuditCounts{8, 2, 1, 0, 4});
  // A window after the drop the filter's cells are all new: another trial.
  sampler->observe(x, Decision::kDuplicate, kWindowTicks + 1);
  expect_counts_eq(sampler->totals(), AuditCounts{9, 3, 2, 0, 5});
}

// A filter whose false positives stick to identities, as a Bloom filter's
// do (the answer depends on the identity's cells): it remembers deliveries
// exactly and also calls "duplicate" every undelivered identity with
// fp.lo % 100 == 0, i.e. it answers wrongly for 1% of fresh identities,
// always the same ones.
class StickyFalsePositives final : public filter::SlidingFilter {
 public:
  StickyFalsePositives() : exact_(config_of()) {}
  filter::FilterType type() const noexcept override { return filter::FilterType::kTimer; }
  const filter::FilterConfig& config() const noexcept override { return exact_.config(); }
  Decision test_and_insert(const Fingerprint& fp, Tick now) override {
    if (exact_.contains(fp, now) || fp.lo % 100 == 0) return Decision::kDuplicate;
    exact_.insert(fp, now);
    return Decision::kDistinct;
  }
  void insert(const Fingerprint& fp, Tick now) override { exact_.insert(fp, now); }
  void advance(Tick now) override { exact_.advance(now); }
  filter::FilterStats stats() const override { return {}; }
  std::string serialize() const override { return {}; }

 private:
  static filter::FilterConfig config_of() {
    filter::FilterConfig c;
    c.type = filter::FilterType::kExact;
    c.ticks_per_window = kWindowTicks;
    return *filter::normalize(c);
  }
  filter::ExactFilter exact_;
};

// The stream shape: every identity comes 5 times within the window.
// Counted per record, each wrongly dropped identity weighs 5 times (about
// 5% at a 1% filter); per identity the observed rate is the filter's 1%,
// comparable with the configured fpp, and the wrongly dropped records are
// all in false_positive_records.
TEST(AuditSampler, ObservedRateIsPerIdentityLikeTheConfiguredFpp) {
  StickyFalsePositives f;
  auto sampler = AuditSampler::create(kWindowTicks, 1);
  ASSERT_TRUE(sampler);
  filter::Fingerprinter fingerprinter("audit-test-salt");
  constexpr int kIdentities = 40'000, kCopies = 5;
  std::vector<std::pair<Tick, Fingerprint>> stream;
  for (int i = 0; i < kIdentities; ++i) {
    const Fingerprint fp = fingerprinter("id-" + std::to_string(i));
    for (int c = 0; c < kCopies; ++c) stream.emplace_back(static_cast<Tick>(i / 1000 + c), fp);
  }
  std::stable_sort(stream.begin(), stream.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [tick, fp] : stream) sampler->observe(fp, f.test_and_insert(fp, tick), tick);

  const AuditCounts& s = sampler->totals();
  EXPECT_EQ(s.truly_new, static_cast<std::uint64_t>(kIdentities));
  EXPECT_EQ(s.false_positive_records, kCopies * s.false_positives);
  EXPECT_EQ(s.false_negatives, 0u);
  const double observed = static_cast<double>(s.false_positives) / static_cast<double>(s.truly_new);
  EXPECT_NEAR(observed, 0.01, 0.003) << s.false_positives << " of " << s.truly_new;
}

TEST(AuditSampler, SelectsAboutOneInNAndLeavesFingerprintBitsUniform) {
  auto sampler = AuditSampler::create(kWindowTicks, 1024);
  ASSERT_TRUE(sampler);
  std::mt19937_64 rng(5);
  std::uint64_t selected = 0;
  std::array<std::uint64_t, 4> hi_low_bits{}, lo_top_bits{};
  constexpr int kDraws = 2'000'000;
  for (int i = 0; i < kDraws; ++i) {
    const Fingerprint fp{rng(), rng()};
    if (!sampler->selects(fp)) continue;
    ++selected;
    ++hi_low_bits[fp.hi & 3];
    ++lo_top_bits[fp.lo >> 62];
  }
  const double expected = kDraws / 1024.0;  // ~1953
  EXPECT_NEAR(static_cast<double>(selected), expected, 5 * std::sqrt(expected));
  // Selecting on raw bits would pin these to one value; the mixer does not.
  for (int v = 0; v < 4; ++v) {
    EXPECT_NEAR(static_cast<double>(hi_low_bits[v]), selected / 4.0, 0.2 * selected / 4.0);
    EXPECT_NEAR(static_cast<double>(lo_top_bits[v]), selected / 4.0, 0.2 * selected / 4.0);
  }
}

TEST(AuditSampler, RejectsBadArguments) {
  auto zero_n = AuditSampler::create(kWindowTicks, 0);
  ASSERT_FALSE(zero_n);
  EXPECT_NE(zero_n.error().message.find("one_in"), std::string::npos);
  auto zero_w = AuditSampler::create(0, 8);
  ASSERT_FALSE(zero_w);
  EXPECT_NE(zero_w.error().message.find("ticks_per_window"), std::string::npos);
}

}  // namespace
}  // namespace kdedup::metrics
