#pragma once
// The compact filter's line policies (private to lib/src/filter): how the
// hot path and the scrub probe, search, fill and compact one line, portable
// and with AVX-512 (one kernel per scan kind of a layout). Shared by
// compact_filter.cc (the test-and-insert paths) and compact_clock.cc (the
// scrub). The codec underneath is compact_line.h.
//
// Threading: plain functions on lines the filter owns, on its thread.

#include "compact_table.h"

namespace kdedup::filter {

// The codec's types, by their short names in the policies below.
using compact::Age;
using compact::Layout;
using compact::Line;

// --- line operations of the hot path -----------------------------------------------
//
// probe(): the active table's line: compacted first when its stamp is not the
// clock's (the first touch in a tick), then searched; `n` is its entry count
// after that and `filled` takes the entries removed. seek(): a sealed
// table's line, read only, tags checked. put(): a new entry.

struct CompactFilter::PortableLines {
  using Any = PortableLines;
  static bool accepts(const Layout&) { return true; }
  static bool probe(Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem, const Age& a,
                    unsigned& n, unsigned& p, std::int64_t& filled) {
    n = compact::count(L, l);
    if (compact::stamp(L, l) != a.now) {
      const std::uint64_t dead = compact::dead_entries(L, l, n, a);
      compact::compact(L, l, dead, a.now);
      const unsigned removed = compact::popcount64(dead);
      n -= removed;
      filled -= removed;
    }
    p = 0;  // put() finds it again
    return compact::holds(L, l, q, rem, nullptr);
  }
  static bool seek(const Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem,
                   const Age& a) {
    return compact::holds(L, l, q, rem, &a);
  }
  static void put(Line& L, const Layout& l, std::uint32_t q, unsigned /*p*/, std::uint32_t rem,
                  std::uint32_t tag) {
    compact::insert(L, l, q, rem, tag);
  }
  // The scrub: removes the entries dead at `a` (every entry when
  // `all_dead`), stamps the line; returns how many went.
  static unsigned sweep(Line& L, const Layout& l, const Age& a, bool all_dead,
                        std::uint32_t stamp) {
    const unsigned n = compact::count(L, l);
    const std::uint64_t dead =
        all_dead ? (n >= 64 ? ~0ULL : (1ULL << n) - 1) : compact::dead_entries(L, l, n, a);
    compact::compact(L, l, dead, stamp);
    return compact::popcount64(dead);
  }
  // sweep() on `count` lines from L on, in memory order.
  static std::uint64_t sweep_run(Line* L, std::uint64_t count, const Layout& l, const Age& a,
                                 bool all_dead, std::uint32_t stamp) {
    std::uint64_t removed = 0;
    for (std::uint64_t i = 0; i < count; ++i) {
      __builtin_prefetch(L + std::min(i + 4, count - 1), 1, 0);
      removed += sweep(L[i], l, a, all_dead, stamp);
    }
    return removed;
  }
};

#if KDEDUP_COMPACT_X86
// Kind: which scan the active layout has, fixed per batch run so that the
// hot loop has no branch on it (kAny decides per line: sealed tables, the
// scrub).
namespace {
struct ScanKind {
  static constexpr int kAny = 0, kBytes = 1, kWords = 2;
};
}  // namespace

template <int Kind>
struct CompactFilter::VectorLines {
  using Any = VectorLines<ScanKind::kAny>;
  // The active layouts this kernel handles.
  static bool accepts(const Layout& l) {
    if constexpr (Kind == ScanKind::kBytes) return l.bytes;
    if constexpr (Kind == ScanKind::kWords) return l.vector && !l.bytes;
    return true;
  }
  // Entries matching `m` (any bucket) that are in bucket q.
  KDEDUP_COMPACT_AVX512 static bool in_bucket(std::uint64_t m, std::uint64_t lo, std::uint64_t hi,
                                              std::uint32_t q) {
    for (; m != 0; m = _blsr_u64(m)) {
      const auto j = static_cast<unsigned>(_tzcnt_u64(m));
      if (compact::select128_bmi2(lo, hi, j) - j == q) return true;
    }
    return false;
  }
  template <bool WithDead>
  KDEDUP_COMPACT_AVX512 static compact::VecScan scan(__m512i v, const Layout& l, unsigned n,
                                                     std::uint32_t rem, const Age& a) {
    if constexpr (Kind == ScanKind::kBytes) {
      return compact::scan_bytes_avx512<WithDead>(v, l, n, rem, a);
    } else if constexpr (Kind == ScanKind::kWords) {
      const __m512i want = _mm512_set1_epi16(static_cast<short>(rem << l.t));
      const __m512i now16 = _mm512_set1_epi16(static_cast<short>(a.now + (1U << l.t)));
      const __m512i window16 = _mm512_set1_epi16(static_cast<short>(a.window));
      return compact::scan_avx512<WithDead>(v, l, n, want, now16, window16);
    } else {
      return compact::scan_line_avx512<WithDead>(v, l, n, rem, a);
    }
  }
  KDEDUP_COMPACT_AVX512 static bool probe(Line& L, const Layout& l, std::uint32_t q,
                                          std::uint32_t rem, const Age& a, unsigned& n, unsigned& p,
                                          std::int64_t& filled) {
    if constexpr (Kind == ScanKind::kAny) {
      if (!l.vector) return PortableLines::probe(L, l, q, rem, a, n, p, filled);
    }
    std::uint64_t lo = compact::code_lo(L, l), hi = compact::code_hi(L, l);
    n = static_cast<unsigned>(_mm_popcnt_u64(lo) + _mm_popcnt_u64(hi));
    const __m512i v = _mm512_load_si512(L.w);
    if (compact::stamp(L, l) == a.now) [[likely]] {
      // Bucket q's entries and where a new one would go, without a branch.
      const std::uint64_t in_q = compact::bucket_entries_bmi2(lo, hi, l, q, p);
      return (scan<false>(v, l, n, rem, a).match & in_q) != 0;
    }
    // Stale: the match is judged on the line as it was (live entries only),
    // then the line is compacted.
    const auto s = scan<true>(v, l, n, rem, a);
    const bool hit = (s.match & ~s.dead & compact::bucket_entries_bmi2(lo, hi, l, q, p)) != 0;
    _mm512_store_si512(L.w, compact::compact_avx512(v, l, s.dead, a.now));
    const auto removed = static_cast<unsigned>(_mm_popcnt_u64(s.dead));
    n -= removed;
    filled -= removed;
    lo = compact::code_lo(L, l);
    hi = compact::code_hi(L, l);
    (void)compact::bucket_entries_bmi2(lo, hi, l, q, p);
    return hit;
  }
  KDEDUP_COMPACT_AVX512 static bool seek(const Line& L, const Layout& l, std::uint32_t q,
                                         std::uint32_t rem, const Age& a) {
    if constexpr (Kind == ScanKind::kAny) {
      if (!l.vector) return PortableLines::seek(L, l, q, rem, a);
    }
    const std::uint64_t lo = compact::code_lo(L, l), hi = compact::code_hi(L, l);
    const auto n = static_cast<unsigned>(_mm_popcnt_u64(lo) + _mm_popcnt_u64(hi));
    const auto s = scan<true>(_mm512_load_si512(L.w), l, n, rem, a);
    const std::uint64_t live = s.match & ~s.dead;
    return live != 0 && in_bucket(live, lo, hi, q);
  }
  KDEDUP_COMPACT_AVX512 static void put(Line& L, const Layout& l, std::uint32_t q, unsigned p,
                                        std::uint32_t rem, std::uint32_t tag) {
    if constexpr (Kind == ScanKind::kAny) {
      if (!l.vector) return PortableLines::put(L, l, q, p, rem, tag);
    }
    compact::insert_at_avx512(L, l, q, p, rem, tag);
  }
  KDEDUP_COMPACT_AVX512 static unsigned sweep(Line& L, const Layout& l, const Age& a, bool all_dead,
                                              std::uint32_t stamp) {
    if constexpr (Kind == ScanKind::kAny) {
      if (!l.vector) return PortableLines::sweep(L, l, a, all_dead, stamp);
    }
    const std::uint64_t lo = compact::code_lo(L, l), hi = compact::code_hi(L, l);
    const auto n = static_cast<unsigned>(_mm_popcnt_u64(lo) + _mm_popcnt_u64(hi));
    const __m512i v = _mm512_load_si512(L.w);
    const std::uint64_t dead =
        all_dead ? (n >= 64 ? ~0ULL : (1ULL << n) - 1) : scan<true>(v, l, n, 0, a).dead;
    _mm512_store_si512(L.w, compact::compact_avx512(v, l, dead, stamp));
    return static_cast<unsigned>(_mm_popcnt_u64(dead));
  }
  // sweep() on `count` lines from L on, in memory order, kGroup lines at a
  // time: their dead entries are deleted in rounds, one per line and round
  // (the highest left; none once a line has no more), as many rounds as the
  // line with the most needs. The same bytes as sweep() line by line, but
  // the lines' chains of deletions overlap, and the loop ends once a group
  // instead of once a line, a branch mispredicted about once a line
  // (a busy table loses a tick's entries, a Poisson number, in every line).
  // Four lines measured best (2, 8 and 16 do more rounds or more misses:
  // docs/performance.md, "Compact filter throughput").
  static constexpr std::uint64_t kGroup = 4;
  KDEDUP_COMPACT_AVX512 static std::uint64_t sweep_run(Line* L, std::uint64_t count,
                                                       const Layout& l, const Age& a, bool all_dead,
                                                       std::uint32_t stamp) {
    if (!l.vector) return PortableLines::sweep_run(L, count, l, a, all_dead, stamp);
    std::uint64_t removed = 0;
    std::uint64_t i = 0;
    for (; !all_dead && i + kGroup <= count; i += kGroup) {
      __m512i v[kGroup];
      std::uint64_t dead[kGroup];
      compact::u128 code[kGroup];
      unsigned rounds = 0;
#pragma GCC unroll 4
      for (std::uint64_t g = 0; g < kGroup; ++g) {
        __builtin_prefetch(L + std::min(i + kGroup + g, count - 1), 1, 0);
        const std::uint64_t lo = compact::code_lo(L[i + g], l), hi = compact::code_hi(L[i + g], l);
        const auto n = static_cast<unsigned>(_mm_popcnt_u64(lo) + _mm_popcnt_u64(hi));
        const __m512i line = _mm512_load_si512(L[i + g].w);
        dead[g] = scan<true>(line, l, n, 0, a).dead;
        code[g] = compact::code_without_bmi2(lo, hi, l, dead[g]);
        v[g] = _mm512_and_si512(line, _mm512_load_si512(l.below_stamp.data()));
        const auto gone = static_cast<unsigned>(_mm_popcnt_u64(dead[g]));
        removed += gone;
        rounds = std::max(rounds, gone);
      }
      for (unsigned r = 0; r < rounds; ++r) {
#pragma GCC unroll 4
        for (std::uint64_t g = 0; g < kGroup; ++g) {
          const std::uint64_t d = dead[g];
          const unsigned j = 63 - static_cast<unsigned>(_lzcnt_u64(d | 1));
          dead[g] = d & ~(1ULL << j);
          v[g] = compact::delete_slot_avx512(v[g], l, d != 0 ? j : compact::kMaxSlots);
        }
      }
#pragma GCC unroll 4
      for (std::uint64_t g = 0; g < kGroup; ++g) {
        _mm512_store_si512(L[i + g].w, compact::finish_compact_avx512(v[g], l, code[g], stamp));
      }
    }
    for (; i < count; ++i) removed += sweep(L[i], l, a, all_dead, stamp);
    return removed;
  }
};
#endif

}  // namespace kdedup::filter
