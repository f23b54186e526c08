// The compact filter's line codec (lib/src/filter/compact_line.h) against a
// reference model of a line (a list of entries in bucket order): random
// insertions, compactions, renewals and narrowings on every base shape and
// tag width, the decoded line equal to the model after each step, the
// AVX-512 operations byte for byte equal to the portable ones, and
// consistent() rejecting what the codec never writes.

#include "compact_line.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kdedup/filter/simd.h"

namespace kdedup::filter::compact {
namespace {

struct Entry {
  std::uint32_t bucket = 0, rem = 0, tag = 0;
  friend bool operator==(const Entry&, const Entry&) = default;
};

// The line decoded through the codec's own reading functions.
std::vector<Entry> decode(const Line& L, const Layout& l) {
  std::vector<Entry> out;
  const unsigned n = count(L, l);
  for (unsigned j = 0; j < n; ++j) {
    const std::uint64_t e = entry(L, l, j);
    const unsigned pos = select128(code_lo(L, l), code_hi(L, l), j);
    out.push_back({pos - j, static_cast<std::uint32_t>(e >> l.t) & l.rmask,
                   static_cast<std::uint32_t>(e) & l.tmask});
  }
  return out;
}

// Entries with remainder `rem`, any bucket (what the vector scan reports).
std::uint64_t all_matches(const Line& L, const Layout& l, std::uint32_t rem) {
  std::uint64_t out = 0;
  for (unsigned j = 0; j < count(L, l); ++j) {
    if (((entry(L, l, j) >> l.t) & l.rmask) == rem) out |= 1ULL << j;
  }
  return out;
}

std::uint64_t model_dead(const std::vector<Entry>& m, const Layout& l, const Age& a) {
  std::uint64_t dead = 0;
  for (std::size_t j = 0; j < m.size(); ++j) {
    if (!alive(m[j].tag, l, a)) dead |= 1ULL << j;
  }
  return dead;
}

std::vector<Shape> shapes(unsigned t) {
  std::vector<Shape> out;
  for (double fpp : {0.1, 0.01, 0.001, 1e-5}) {
    const Shape s = best_shape(0.9 * fpp, 0.95, t);
    out.push_back(s);
    const Shape n = narrowed(s, t, 3);
    if (!(n == s)) out.push_back(n);
  }
  return out;
}

class CompactLine : public ::testing::TestWithParam<unsigned> {};

TEST_P(CompactLine, OperationsFollowTheModel) {
  const unsigned t = GetParam();
  const std::uint32_t window = (1U << t) - 3;
  std::mt19937_64 rng(t);
  for (const Shape& s : shapes(t)) {
    SCOPED_TRACE(::testing::Message() << "r " << s.r << " S " << s.S << " B " << s.B);
    ASSERT_TRUE(fits(s, t));
    const Layout l = Layout::of(s, t);
    for (int trial = 0; trial < 20; ++trial) {
      Line L{};
      std::vector<Entry> m;
      std::uint32_t clock = static_cast<std::uint32_t>(rng());
      for (int step = 0; step < 400; ++step) {
        if (rng() % 8 == 0) ++clock;  // the clock moves now and then
        const Age a{clock & l.tmask, window};
        const std::uint32_t q = static_cast<std::uint32_t>(rng() % s.B);
        const std::uint32_t rem = static_cast<std::uint32_t>(rng()) & l.rmask;
        const int op = static_cast<int>(rng() % 10);
        const std::uint32_t before = stamp(L, l);
        if (op < 6 && m.size() < s.S) {
          insert(L, l, q, rem, a.now);
          ASSERT_EQ(stamp(L, l), before);
          auto at = std::find_if(m.begin(), m.end(), [&](const Entry& e) { return e.bucket >= q; });
          m.insert(at, Entry{q, rem, a.now});
        } else if (op < 8) {
          const std::uint64_t dead = model_dead(m, l, a);
          ASSERT_EQ(dead_entries(L, l, count(L, l), a), dead);
          compact(L, l, dead, a.now);
          std::erase_if(m, [&](const Entry& e) { return !alive(e.tag, l, a); });
          ASSERT_EQ(stamp(L, l), a.now);
        } else if (!m.empty()) {
          // Renew an entry the line holds (or miss one it does not).
          const Entry pick = m[rng() % m.size()];
          const std::uint32_t want = op == 8 ? pick.rem : (pick.rem + 1) & l.rmask;
          auto hit = std::find_if(m.begin(), m.end(), [&](const Entry& e) {
            return e.bucket == pick.bucket && e.rem == want && alive(e.tag, l, a);
          });
          ASSERT_EQ(renew(L, l, pick.bucket, want, a), hit != m.end());
          ASSERT_EQ(stamp(L, l), before);
          if (hit != m.end()) hit->tag = a.now;
          ASSERT_EQ(holds(L, l, pick.bucket, pick.rem, &a),
                    std::any_of(m.begin(), m.end(), [&](const Entry& e) {
                      return e.bucket == pick.bucket && e.rem == pick.rem && alive(e.tag, l, a);
                    }));
        }
        ASSERT_EQ(decode(L, l), m);
        unsigned n = 0;
        const Age fresh{stamp(L, l), window};
        if (model_dead(m, l, fresh) == 0) {
          ASSERT_TRUE(consistent(L, l, fresh, n));
        }
        ASSERT_TRUE(consistent(L, l, Age{(stamp(L, l) + 1) & l.tmask, window}, n));
        ASSERT_EQ(n, m.size());
      }
      // Narrowed in place: the same entries with their low remainder bits.
      const Shape ns = narrowed(s, t, std::min(3U, s.r - 1));
      if (!(ns == s)) {
        const Layout nl = Layout::of(ns, t);
        Line N = L;
        relayout(N, l, nl);
        auto expect = m;
        for (Entry& e : expect) e.rem &= nl.rmask;
        ASSERT_EQ(decode(N, nl), expect);
        ASSERT_EQ(stamp(N, nl), stamp(L, l));
      }
    }
  }
}

TEST_P(CompactLine, ConsistentRejectsWhatTheCodecNeverWrites) {
  const unsigned t = GetParam();
  const std::uint32_t window = (1U << t) - 3;
  const Shape s = best_shape(0.009, 0.95, t);
  const Layout l = Layout::of(s, t);
  Line L{};
  for (std::uint32_t i = 0; i < s.S / 2; ++i) insert(L, l, i % s.B, i & l.rmask, 3);
  unsigned n = 0;
  const Age a{3, window};
  compact(L, l, 0, 3);
  ASSERT_TRUE(consistent(L, l, a, n));
  // A bit past the entries, below the stamp.
  Line bad = L;
  const unsigned past = l.e0 + (s.S / 2) * l.w + 1;
  bad.w[past / 64] |= 1ULL << (past % 64);
  EXPECT_FALSE(consistent(bad, l, a, n));
  // An entry after the last bucket: a 1 past the B-th 0 of the code.
  bad = L;
  const unsigned end = bucket_start(code_lo(L, l), code_hi(L, l), l, s.B);
  bad.w[end / 64] |= 1ULL << (end % 64);
  EXPECT_FALSE(consistent(bad, l, a, n));
  // A stamp that says "compacted now" over a dead entry.
  Line stale{};
  insert(stale, l, 0, 1, 0);
  set_stamp(stale, l, window + 1);
  EXPECT_FALSE(consistent(stale, l, Age{window + 1, window}, n));
  EXPECT_TRUE(consistent(stale, l, Age{window + 2, window}, n));
}

#if KDEDUP_COMPACT_X86
TEST_P(CompactLine, VectorOperationsWriteTheSameBytes) {
  if (!avx512_usable()) GTEST_SKIP() << "no AVX-512 VBMI on this CPU";
  const unsigned t = GetParam();
  const std::uint32_t window = (1U << t) - 3;
  std::mt19937_64 rng(100 + t);
  for (const Shape& s : shapes(t)) {
    const Layout l = Layout::of(s, t);
    if (!l.vector) continue;
    SCOPED_TRACE(::testing::Message() << "r " << s.r << " S " << s.S << " B " << s.B);
    for (int trial = 0; trial < 20; ++trial) {
      Line P{}, V{};
      std::uint32_t clock = 0;
      for (int step = 0; step < 300; ++step) {
        if (rng() % 6 == 0) ++clock;
        const Age a{clock & l.tmask, window};
        const std::uint32_t q = static_cast<std::uint32_t>(rng() % s.B);
        const std::uint32_t rem = static_cast<std::uint32_t>(rng()) & l.rmask;
        if (rng() % 4 != 0 && count(P, l) < s.S) {
          insert(P, l, q, rem, a.now);
          vector_insert(V, l, q, rem, a.now);
        } else {
          const std::uint64_t dead = dead_entries(P, l, count(P, l), a);
          ASSERT_EQ(vector_dead(V, l, a), dead);
          compact(P, l, dead, a.now);
          vector_compact(V, l, dead, a.now);
        }
        ASSERT_EQ(std::memcmp(P.w, V.w, sizeof P.w), 0);
        ASSERT_EQ(vector_matches(V, l, rem), all_matches(P, l, rem));
      }
    }
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(TagBits, CompactLine, ::testing::Values(4U, 5U, 6U, 8U),
                         [](const auto& p) { return "t" + std::to_string(p.param); });

}  // namespace
}  // namespace kdedup::filter::compact
