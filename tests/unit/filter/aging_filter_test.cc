// AgingFilter (seed 002) against the exact oracle: no false negatives inside
// the window, false-positive rate at target once the first window has passed
// (seed 002 §7.3), slice count following the insertion rate (§7.1),
// serialization and the batch path.

#include "kdedup/filter/aging_filter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"
#include "streams.h"

namespace kdedup::filter {
namespace {

using testing::Distribution;
using testing::Event;
using testing::StreamSpec;

FilterConfig aging(std::uint32_t window, double fpp, std::uint64_t capacity) {
  FilterConfig c;
  c.type = FilterType::kAging;
  c.ticks_per_window = window;
  c.fpp = fpp;
  c.capacity = capacity;
  auto n = normalize(c);
  EXPECT_TRUE(n) << n.error().message;
  return *n;
}

// Identities no stream of these tests ever draws (streams use small ids).
Fingerprint absent(std::uint64_t i) { return testing::identity_fingerprint(i, 0xab5e17); }

TEST(AgingShape, MeetsTargetWithinThePapersMemoryRange) {
  // seed 002 Table 2: the paper's largest bits per element per error rate.
  const double targets[] = {0.1, 0.01, 0.001, 1e-4, 1e-5};
  const double paper_max[] = {13, 24, 35, 45, 56};
  for (int i = 0; i < 5; ++i) {
    const AgingShape s = choose_aging_shape(targets[i]);
    EXPECT_LE(s.fpp, targets[i]);
    EXPECT_DOUBLE_EQ(s.fpp, aging_worst_case_fpp(s.k, s.l));
    EXPECT_LE(s.bits_per_element(), paper_max[i]) << targets[i];
  }
  EXPECT_LE(choose_aging_shape(0.01).bits_per_element(), 20.0);
}

TEST(AgingShape, WorstCaseFormulaMatchesHandComputedCases) {
  // k = 1, l = 1: fills 1 - 2^-1 and 1/2; a match in either slice suffices.
  EXPECT_NEAR(aging_worst_case_fpp(1, 1), 1 - 0.5 * 0.5, 1e-12);
  // k = 2, l = 0 is a plain two-slice filter: fills 1 - 2^-1/2, 1 - 2^-1.
  const double r0 = 1 - std::exp2(-0.5), r1 = 0.5;
  EXPECT_NEAR(aging_worst_case_fpp(2, 0), r0 * r1, 1e-12);
  // More slices, more windows: the fpp grows with l.
  EXPECT_LT(aging_worst_case_fpp(6, 4), aging_worst_case_fpp(6, 8));
}

TEST(AgingFilter, RejectsTooSmallTargetAndBuildsThroughTheFactory) {
  FilterConfig c;
  c.type = FilterType::kAging;
  c.fpp = 1e-12;
  EXPECT_FALSE(normalize(c));
  c.fpp = 0.01;
  auto f = make_filter(c);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f)->type(), FilterType::kAging);
  const FilterStats st = (*f)->stats();
  const AgingShape shape = choose_aging_shape(0.01);
  EXPECT_EQ(st.subfilters, shape.k + shape.l);
  EXPECT_GT(st.slice0_bits, 0U);
}

TEST(AgingFilter, RemembersTheWindowThenFadesWithinAFewGenerations) {
  const std::uint32_t w = 64;
  AgingFilter f(aging(w, 1e-5, 2'000));
  const Tick g = f.generation_limit();
  // Background traffic keeps generations turning over; probes are tracked.
  std::vector<std::pair<Fingerprint, Tick>> probes;
  std::uint64_t next = 0, edge = 0, late = 0;
  for (Tick t = 0; t < 4 * w + 12 * g + 1; ++t) {
    for (int i = 0; i < 30; ++i) f.test_and_insert(testing::identity_fingerprint(next++, 5), t);
    if (t % 2 == 0 && t < 3 * w) {
      const Fingerprint fp = absent(t);
      ASSERT_EQ(f.test_and_insert(fp, t), Decision::kDistinct);
      probes.emplace_back(fp, t);
    }
    for (const auto& [fp, at] : probes) {
      if (t == at + w) {
        EXPECT_TRUE(f.contains(fp, t)) << "inserted at " << at << ", now " << t;
      }
      if (t == at + w + g) edge += f.contains(fp, t) ? 1 : 0;
      if (t == at + w + 12 * g) late += f.contains(fp, t) ? 1 : 0;
    }
  }
  // Past W + G - 1 a match needs bits the identity never set: about 1/2 per
  // generation, then only the ordinary false-positive rate (2^-12 + 1e-5).
  EXPECT_LT(edge, probes.size() * 3 / 4);
  EXPECT_LE(late, 1U);
}

struct OracleCase {
  Distribution distribution;
  double burst;
  std::size_t batch;
};

TEST(AgingFilter, NoFalseNegativesAgainstTheOracle) {
  const OracleCase cases[] = {{Distribution::kUniform, 1, 1},
                              {Distribution::kZipf, 1, 1},
                              {Distribution::kUniform, 5, 64},
                              {Distribution::kZipf, 2, 64}};
  for (const OracleCase& oc : cases) {
    StreamSpec spec;
    spec.distribution = oc.distribution;
    spec.domain = 20'000;
    spec.base_rate = 100;
    spec.ticks = 900;
    spec.burst_factor = oc.burst;
    spec.seed = 11;
    const auto events = testing::generate_stream(spec);
    AgingFilter f(aging(96, 0.01, 5'000));
    const auto counts = testing::run_against_oracle(f, events, oc.batch);
    EXPECT_EQ(counts.false_negatives, 0U) << "burst " << oc.burst << " batch " << oc.batch;
    EXPECT_GT(counts.true_positives, counts.events / 10);  // the stream has duplicates
  }
}

// seed 002 §7.3: distinct elements at a steady rate, filters under- and
// over-dimensioned; after the first window, identities never inserted are
// queried and the share reported present must stay at or under the target.
TEST(AgingFilter, FalsePositiveRateSettlesAtTarget) {
  const double targets[] = {0.1, 0.01, 0.001, 1e-4, 1e-5};
  const std::uint32_t w = 64;
  const std::uint64_t per_tick = 160;  // 10,240 distinct per window
  for (double target : targets) {
    for (std::uint64_t capacity : {1'000U, 100'000U}) {
      AgingFilter f(aging(w, target, capacity));
      // Enough queries for ~25 expected false positives at the target.
      const std::uint64_t queries = static_cast<std::uint64_t>(25 / target);
      const Tick measured_ticks = 2 * w;
      const std::uint64_t per_query_tick = queries / measured_ticks + 1;
      std::uint64_t id = 0, asked = 0, positives = 0, missed = 0;
      std::uint32_t max_slices = 0;
      for (Tick t = 0; t < 2 * w + measured_ticks; ++t) {
        for (std::uint64_t i = 0; i < per_tick; ++i) {
          if (f.test_and_insert(testing::identity_fingerprint(id++, 3), t) ==
              Decision::kDuplicate) {
            ++missed;  // a new identity judged duplicate: a false positive too
          }
        }
        max_slices = std::max(max_slices, f.stats().subfilters);
        if (t < 2 * w) continue;
        for (std::uint64_t q = 0; q < per_query_tick; ++q, ++asked) {
          positives += f.contains(absent(asked), t) ? 1 : 0;
        }
      }
      const double rate = static_cast<double>(positives) / static_cast<double>(asked);
      // Poisson allowance around the expected count; the worst case of (k, l)
      // is the state just before a shift, so the average sits below it.
      const double allowed = target * static_cast<double>(asked);
      EXPECT_LE(static_cast<double>(positives), allowed + 3 * std::sqrt(allowed))
          << "target " << target << " capacity " << capacity << " measured " << rate;
      EXPECT_LE(static_cast<double>(missed) / static_cast<double>(id), 2 * target);
      const AgingShape shape = f.shape();
      EXPECT_EQ(f.stats().subfilters, shape.k + shape.l) << target << " " << capacity;
      const double bits = static_cast<double>(f.stats().cells) / (per_tick * (w + 1));
      EXPECT_LE(bits, 1.1 * shape.bits_per_element()) << target << " " << capacity;
      std::printf(
          "target %-7g capacity %-7lu k=%u l=%u measured fpp %.3g (%lu/%lu) slices max %u "
          "bits/element %.1f\n",
          target, static_cast<unsigned long>(capacity), shape.k, shape.l, rate,
          static_cast<unsigned long>(positives), static_cast<unsigned long>(asked), max_slices,
          bits);
    }
  }
}

TEST(AgingFilter, SliceCountGrowsWithTheRateAndReturnsToKPlusL) {
  // seed 002 §7.1: a 5x burst in the middle third of the stream.
  StreamSpec spec;
  spec.domain = 1ULL << 40;  // all distinct
  spec.base_rate = 50;
  spec.ticks = 12 * 64;
  spec.burst_factor = 5;
  const auto events = testing::generate_stream(spec);
  AgingFilter f(aging(64, 0.01, 50 * 64));
  const std::uint32_t base = f.shape().k + f.shape().l;
  std::uint32_t most = 0;
  std::uint64_t s0_before = 0, s0_burst = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    f.test_and_insert(e.fp, e.tick);
    if (i % 16 != 0) continue;  // stats() is not free
    const FilterStats st = f.stats();
    most = std::max(most, st.subfilters);
    if (e.tick == 4 * 64 - 1) s0_before = st.slice0_bits;
    if (e.tick == 8 * 64 - 1) s0_burst = st.slice0_bits;
  }
  EXPECT_GT(most, base + base / 2);
  EXPECT_GT(s0_burst, 3 * s0_before);  // s0 follows the rate (eq. 6-8)
  EXPECT_EQ(f.stats().subfilters, base);
  EXPECT_LT(f.stats().slice0_bits, s0_burst / 3);
}

TEST(AgingFilter, RetiresSlicesAsTheClockMovesPastThem) {
  // A window of distinct identities at a high rate holds many slices; then
  // for a window only duplicates arrive (the last identity, asked again
  // every tick). Nothing is inserted, so once the last generation closes
  // the next one stays open and empty, and slices were retired only at a
  // shift: one that left the window after the last was held until the
  // next insertion (57 slices for k + l = 56 here). Each one now leaves
  // as the clock moves past its window (eq. 3): k + l at the end.
  AgingFilter f(aging(64, 0.01, 100));
  const std::uint32_t base = f.shape().k + f.shape().l;
  std::uint64_t id = 0;
  for (Tick t = 0; t < 64; ++t) {
    for (int i = 0; i < 2'000; ++i) {
      (void)f.test_and_insert(testing::identity_fingerprint(id++, 5), t);
    }
  }
  EXPECT_GT(f.stats().subfilters, base);
  const Fingerprint last = testing::identity_fingerprint(id - 1, 5);
  for (Tick t = 64; t <= 63 + 64; ++t) {
    ASSERT_EQ(f.test_and_insert(last, t), Decision::kDuplicate) << "tick " << t;
  }
  EXPECT_EQ(f.stats().subfilters, base);
}

TEST(AgingFilter, ResumesAfterAnIdleGapWithoutMultiplyingSlices) {
  // Traffic, ten idle windows, the same traffic again: the rate history says
  // "nothing happened", the current tick says otherwise.
  StreamSpec before;
  before.domain = 1ULL << 40;
  before.base_rate = 400;
  before.ticks = 3 * 64;
  StreamSpec after = before;
  after.first_tick = 13 * 64;
  after.seed = 2;
  auto events = testing::generate_stream(before);
  const auto more = testing::generate_stream(after);
  events.insert(events.end(), more.begin(), more.end());
  AgingFilter f(aging(64, 0.01, 400 * 64));
  const std::uint32_t base = f.shape().k + f.shape().l;
  std::uint32_t most = 0;
  const auto counts =
      testing::run_against_oracle(f, events, 1, [&](std::size_t i, const Event&, Decision, bool) {
        if (i % 16 == 0) most = std::max(most, f.stats().subfilters);
      });
  EXPECT_EQ(counts.false_negatives, 0U);
  EXPECT_LT(most, 2 * base);
  EXPECT_EQ(f.stats().subfilters, base);
}

std::vector<Event> mixed_stream(std::uint64_t seed) {
  StreamSpec spec;
  spec.distribution = Distribution::kZipf;
  spec.domain = 30'000;
  spec.base_rate = 80;
  spec.ticks = 600;
  spec.burst_factor = 2;
  spec.seed = seed;
  return testing::generate_stream(spec);
}

TEST(AgingFilter, SerializeRestoreGivesIdenticalFutureDecisions) {
  const auto events = mixed_stream(21);
  AgingFilter f(aging(100, 0.001, 4'000));
  const std::size_t half = events.size() / 2;
  for (std::size_t i = 0; i < half; ++i) f.test_and_insert(events[i].fp, events[i].tick);
  const std::string blob = f.serialize();
  auto restored = restore_filter(blob);
  ASSERT_TRUE(restored) << restored.error().message;
  EXPECT_EQ((*restored)->serialize(), blob);
  for (std::size_t i = half; i < events.size(); ++i) {
    ASSERT_EQ(f.test_and_insert(events[i].fp, events[i].tick),
              (*restored)->test_and_insert(events[i].fp, events[i].tick))
        << i;
  }
  EXPECT_EQ((*restored)->serialize(), f.serialize());
}

// An idle generation restarts an empty s0 in place; when the record that
// triggered the restart is a duplicate nothing refreshes the slice, and that
// state must still restore. Frequent duplicates (small id domain) and a clock
// advancing 0 or 1 tick hit it often; every state along the way is checked.
TEST(AgingFilter, EveryStateAlongAStreamRestores) {
  AgingFilter f(aging(64, 0.01, 1'000));
  std::mt19937_64 rng(5);
  Tick tick = 0;
  for (std::uint64_t i = 0; i < 1'500; ++i) {
    tick += rng() % 2;
    f.test_and_insert(absent(rng() % 300), tick);
    auto restored = restore_filter(f.serialize());
    ASSERT_TRUE(restored) << "after " << i << " records: " << restored.error().message;
  }
}

// Re-seals a modified payload so the checksum passes and the field checks
// themselves must catch the damage.
std::string reseal(const std::string& blob, const std::function<void(std::string&)>& edit) {
  auto env = open_envelope(blob, "test");
  EXPECT_TRUE(env);
  std::string payload(env->payload);
  edit(payload);
  return seal_envelope(env->kind, env->version, payload);
}

TEST(AgingFilter, RejectsTruncatedOrCorruptedState) {
  AgingFilter f(aging(50, 0.01, 1'000));
  for (std::uint64_t i = 0; i < 3'000; ++i) f.test_and_insert(absent(i), i / 20);
  const std::string blob = f.serialize();
  ASSERT_TRUE(restore_filter(blob));

  std::string flipped = blob;
  flipped[blob.size() / 2] ^= 0x04;
  EXPECT_FALSE(restore_filter(flipped));
  EXPECT_FALSE(restore_filter(blob.substr(0, blob.size() - 1)));
  EXPECT_FALSE(restore_filter(blob.substr(0, 30)));

  auto payload_size = open_envelope(blob, "test")->payload.size();
  // Header after the config: k, l, started, clock, insertions, tick base,
  // remaining, next_seq, count; then per slice seq, created, tick base,
  // last, inserted, generation, ones, bits, words.
  std::string config_bytes;
  ByteWriter cw(config_bytes);
  write_config(cw, f.config());
  const std::size_t header = config_bytes.size();
  const std::size_t k_at = header, remaining_at = header + 4 + 4 + 1 + 8 + 8 + 8;
  const std::size_t count_at = remaining_at + 8 + 8, slice0 = count_at + 8;
  const auto put64 = [](std::string& p, std::size_t at, std::uint64_t v) {
    std::memcpy(p.data() + at, &v, sizeof v);
  };
  struct Damage {
    const char* what;
    std::function<void(std::string&)> edit;
  };
  const Damage damages[] = {
      {"truncated payload", [&](std::string& p) { p.resize(payload_size - 8); }},
      {"trailing byte", [](std::string& p) { p.push_back('x'); }},
      {"wrong k", [&](std::string& p) { p[k_at] ^= 1; }},
      {"zero counter", [&](std::string& p) { put64(p, remaining_at, 0); }},
      {"slice count too large", [&](std::string& p) { put64(p, count_at, 1ULL << 40); }},
      {"slice out of sequence", [&](std::string& p) { p[slice0] ^= 1; }},
      {"ones do not match bits", [&](std::string& p) { p[slice0 + 6 * 8] ^= 1; }},
      {"bits not a word multiple", [&](std::string& p) { p[slice0 + 7 * 8] ^= 1; }},
      {"flipped bit in a slice", [&](std::string& p) { p[slice0 + 8 * 8] ^= 1; }},
      {"bad fpp in config", [&](std::string& p) { put64(p, 1 + 4, 0x7ff8000000000000ULL); }},
  };
  for (const Damage& d : damages) {
    auto r = restore_filter(reseal(blob, d.edit));
    EXPECT_FALSE(r) << d.what;
    if (!r) {
      EXPECT_NE(r.error().message.find("state"), std::string::npos) << r.error().message;
    }
  }
  // A different version is refused, not misread.
  auto env = open_envelope(blob, "test");
  EXPECT_FALSE(restore_filter(seal_envelope(env->kind, 99, env->payload)));
}

TEST(AgingFilter, BatchDecidesLikeSequential) {
  const auto events = mixed_stream(33);
  for (std::size_t batch : {2U, 7U, 64U, 1000U}) {
    AgingFilter sequential(aging(80, 0.01, 2'000));
    AgingFilter batched(aging(80, 0.01, 2'000));
    std::vector<Fingerprint> fps;
    std::vector<Tick> ticks;
    for (const Event& e : events) {
      fps.push_back(e.fp);
      ticks.push_back(e.tick);
    }
    std::vector<Decision> out(events.size());
    for (std::size_t i = 0; i < events.size(); i += batch) {
      const std::size_t n = std::min(batch, events.size() - i);
      batched.test_and_insert_batch(std::span(fps).subspan(i, n), std::span(ticks).subspan(i, n),
                                    std::span(out).subspan(i, n));
    }
    for (std::size_t i = 0; i < events.size(); ++i) {
      ASSERT_EQ(sequential.test_and_insert(fps[i], ticks[i]), out[i]) << "batch " << batch;
    }
    EXPECT_EQ(sequential.serialize(), batched.serialize());
  }
}

}  // namespace
}  // namespace kdedup::filter
