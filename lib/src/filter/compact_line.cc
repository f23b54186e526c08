// The compact filter's line codec: shapes and the portable line operations
// (compact_line.h has the layout and the invariants).

#include "compact_line.h"

#include <map>
#include <mutex>
#include <tuple>

namespace kdedup::filter::compact {
namespace {

// Bits [from, to) of a line as 8 words.
std::array<std::uint64_t, 8> bit_range(unsigned from, unsigned to) {
  std::array<std::uint64_t, 8> m{};
  for (unsigned b = from; b < to; ++b) m[b / 64] |= 1ULL << (b % 64);
  return m;
}

// Moves bits [p, end) of the line up by w and writes `value` (w bits) at p.
// Bits at and above end + w are 0 and stay 0; end + w <= 512.
void insert_bits(Line& L, unsigned p, unsigned end, unsigned w, std::uint64_t value) {
  const unsigned lo = p >> 6, hi = (end + w - 1) >> 6, sh = p & 63;
  const std::uint64_t keep = sh == 0 ? 0 : ~0ULL >> (64 - sh);
  const std::uint64_t moving = L.w[lo] & ~keep;
  for (unsigned i = hi; i > lo + 1; --i) L.w[i] = (L.w[i] << w) | (L.w[i - 1] >> (64 - w));
  if (hi > lo) L.w[lo + 1] = (L.w[lo + 1] << w) | (moving >> (64 - w));
  L.w[lo] = (L.w[lo] & keep) | (moving << w) | (value << sh);
  if (sh + w > 64) L.w[lo + 1] |= value >> (64 - sh);
}

// Removes the w bits at p: bits [p + w, end) move down by w, and the w bits
// below end become 0.
void delete_bits(Line& L, unsigned p, unsigned end, unsigned w) {
  const unsigned lo = p >> 6, hi = (end - 1) >> 6, sh = p & 63;
  const std::uint64_t keep = sh == 0 ? 0 : ~0ULL >> (64 - sh);
  const std::uint64_t first = (L.w[lo] >> w) | (lo < 7 ? L.w[lo + 1] << (64 - w) : 0);
  for (unsigned i = lo + 1; i <= hi; ++i) {
    L.w[i] = (L.w[i] >> w) | (i < 7 ? L.w[i + 1] << (64 - w) : 0);
  }
  L.w[lo] = (L.w[lo] & keep) | (first & ~keep);
  const unsigned cleared = end - w;
  for (unsigned i = cleared >> 6; i <= hi; ++i) {
    const unsigned b = cleared > i * 64 ? cleared - i * 64 : 0;
    L.w[i] &= b == 0 ? 0 : ~0ULL >> (64 - b);
  }
}

u128 code_of(const Line& L, const Layout& l) {
  return static_cast<u128>(code_lo(L, l)) | static_cast<u128>(code_hi(L, l)) << 64;
}

void put_code(Line& L, const Layout& l, u128 c) {
  L.w[0] = (L.w[0] & ~l.code_lo) | static_cast<std::uint64_t>(c);
  L.w[1] = (L.w[1] & ~l.code_hi) | static_cast<std::uint64_t>(c >> 64);
}

u128 below(unsigned p) { return p >= 128 ? ~u128{0} : (u128{1} << p) - 1; }

// Entries 0 .. n-1 of the line's windows: calls f(first entry, window, m)
// for windows of m <= k whole entries.
template <class F>
void for_windows(const Line& L, const Layout& l, unsigned from, unsigned n, F&& f) {
  for (unsigned j = from; j < n; j += l.k) {
    f(j, load_bits(L, l.e0 + j * l.w), std::min(l.k, n - j));
  }
}

// Window bits of the first m entries.
std::uint64_t window_mask(const Layout& l, unsigned m) {
  return m * l.w >= 64 ? ~0ULL : (1ULL << (m * l.w)) - 1;
}

}  // namespace

Shape best_shape(double budget, double load, unsigned t) {
  // Memoized: called for every new table and budget level. Budgets are
  // continuous (planned per table), so the memo is bounded: emptied when
  // full, it costs one search per new key.
  constexpr std::size_t kMaxMemo = 4096;
  static std::mutex mu;
  static std::map<std::tuple<double, double, unsigned>, Shape> cache;
  std::lock_guard lock(mu);
  if (cache.size() >= kMaxMemo) cache.clear();
  auto [it, added] = cache.try_emplace({budget, load, t});
  if (!added) return it->second;
  Shape best;
  double best_fpp = 2.0;
  Shape finest;
  double finest_fpp = 2.0;
  for (unsigned r = 1; r <= kMaxRemainder; ++r) {
    for (unsigned S = 4; S <= kMaxSlots; ++S) {
      // The most buckets the line leaves room for: the lowest fpp at S.
      const int room = static_cast<int>(kLineBits) - static_cast<int>(S + S * (r + t) + t);
      const int B = std::min(room, static_cast<int>(kMaxCodeBits - S));
      if (B < 1) break;
      const Shape s{r, S, static_cast<unsigned>(B)};
      const double f = fpp_at(load, s);
      if (f < finest_fpp) {
        finest = s;
        finest_fpp = f;
      }
      if (f > budget) continue;
      if (S > best.S || (S == best.S && f < best_fpp)) {
        best = s;
        best_fpp = f;
      }
    }
  }
  it->second = best.S != 0 ? best : finest;
  return it->second;
}

Shape narrowed(const Shape& s, unsigned t, unsigned bits) {
  if (bits == 0 || s.r <= bits) return s;
  Shape n{s.r - bits, s.S, s.B};
  while (fits(Shape{n.r, n.S + 1, n.B}, t)) ++n.S;
  return fits(n, t) ? n : s;
}

Layout Layout::of(const Shape& s, unsigned t) {
  Layout l;
  l.shape = s;
  l.t = t;
  l.w = s.r + t;
  l.e0 = s.B + s.S;
  l.code_lo = l.e0 >= 64 ? ~0ULL : (1ULL << l.e0) - 1;
  l.code_hi = l.e0 <= 64 ? 0 : l.e0 >= 128 ? ~0ULL : (1ULL << (l.e0 - 64)) - 1;
  l.rmask = static_cast<std::uint32_t>((1ULL << s.r) - 1);
  l.tmask = (1U << t) - 1;
  l.wmask = (1ULL << l.w) - 1;
  l.stamp_keep = ~0ULL >> t;
  l.k = std::max(1U, 57 / l.w);
  for (unsigned j = 0; j < l.k; ++j) {
    const std::uint64_t one = 1ULL << (j * l.w);
    l.rep |= one;
    l.rfields |= (std::uint64_t{l.rmask} << t) * one;
    l.hfields |= (1ULL << (l.w - 1)) * one;
    l.tfields |= std::uint64_t{l.tmask} * one;
    l.gfields |= (1ULL << t) * one;
  }
  l.lfields = l.rfields & ~l.hfields;
  for (unsigned b = 0; b < 64; ++b) l.entry_of_bit[b] = static_cast<std::uint8_t>(b / l.w);
  l.below_stamp = bit_range(0, kLineBits - t);
  l.from_e0 = bit_range(l.e0, kLineBits);
  for (unsigned i = 0; i < 8; ++i) {
    l.lane_bit[i] = 64 * i;
    l.lane_w[i] = l.w;
  }
  for (unsigned j = 0; j < s.S; ++j) l.from_entry[j] = bit_range(l.e0 + j * l.w, kLineBits - t);
  l.vector = l.w <= 16;
  if (l.vector) {
    l.F = l.w <= 14 ? 4 : 3;
    l.groups = (s.S + 8 * l.F - 1) / (8 * l.F);
    l.lanes = l.F == 4 ? 0xFFFFFFFFU : 0x77777777U;
    l.tmask16 = static_cast<std::uint16_t>(l.tmask);
    l.rmask16 = static_cast<std::uint16_t>(l.wmask & ~std::uint64_t{l.tmask});
    for (unsigned g = 0; g < l.groups; ++g) {
      for (unsigned i = 0; i < 8; ++i) {
        // 64-bit lane i takes the 8 bytes from the one holding its first
        // entry; 16-bit lane `lane` the bits of entry j0 + lane within them.
        const unsigned j0 = g * 8 * l.F + i * l.F;
        const unsigned byte = std::min((l.e0 + j0 * l.w) / 8, 56U);
        for (unsigned b = 0; b < 8; ++b) {
          l.idx[g][i * 8 + b] = static_cast<std::uint8_t>(std::min(63U, byte + b));
        }
        for (unsigned lane = 0; lane < 4; ++lane) {
          const unsigned at = l.e0 + (j0 + lane) * l.w;
          const unsigned o = lane < l.F && at >= 8 * byte && at - 8 * byte < 64 ? at - 8 * byte : 0;
          l.ctrl[g][i * 8 + 2 * lane] = static_cast<std::uint8_t>(o & 63);
          l.ctrl[g][i * 8 + 2 * lane + 1] = static_cast<std::uint8_t>((o + 8) & 63);
        }
      }
    }
  }
  // Byte lanes: the most entries per 64-bit lane whose remainders (or tags)
  // lie inside the 8 bytes from the one holding the lane's first entry.
  if (s.r <= 8 && t <= 8) {
    unsigned f = 1;
    while (f < 8 && 7 + f * l.w + t + 8 <= 64) ++f;
    l.F8 = f;
    l.bytes = s.S <= 8 * f;
  }
  if (l.bytes) {
    for (unsigned i = 0; i < 8; ++i) {
      l.lanes8 |= ((1ULL << l.F8) - 1) << (8 * i);
      const unsigned j0 = i * l.F8;
      const unsigned byte = std::min((l.e0 + j0 * l.w) / 8, 56U);
      for (unsigned b = 0; b < 8; ++b) {
        l.idx8[i * 8 + b] = static_cast<std::uint8_t>(std::min(63U, byte + b));
      }
      for (unsigned f = 0; f < l.F8; ++f) {
        const unsigned at = l.e0 + (j0 + f) * l.w;
        const unsigned o = at >= 8 * byte && at - 8 * byte < 64 ? at - 8 * byte : 0;
        l.tctl8[i * 8 + f] = static_cast<std::uint8_t>(o & 63);
        l.rctl8[i * 8 + f] = static_cast<std::uint8_t>((o + t) & 63);
      }
    }
  }
  return l;
}

std::uint64_t dead_entries(const Line& L, const Layout& l, unsigned n, const Age& a) {
  // Per window: tag + 2^t - now' ... computed as (now | 2^t) - tag, which
  // cannot borrow out of an entry; the age is above the window when adding
  // 2^t - 1 - window carries into bit t.
  std::uint64_t out = 0;
  const std::uint64_t now = (std::uint64_t{a.now} | (1ULL << l.t)) * l.rep;
  const std::uint64_t bias = std::uint64_t{l.tmask - a.window} * l.rep;
  for_windows(L, l, 0, n, [&](unsigned j, std::uint64_t x, unsigned m) {
    const std::uint64_t age = (now - (x & l.tfields)) & l.tfields;
    std::uint64_t dead = (age + bias) & l.gfields & window_mask(l, m);
    for (; dead != 0; dead &= dead - 1) {
      out |= 1ULL << (j + l.entry_of_bit[std::countr_zero(dead)]);
    }
  });
  return out;
}

std::uint64_t matches(const Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem) {
  const std::uint64_t lo = code_lo(L, l), hi = code_hi(L, l);
  const unsigned p = bucket_start(lo, hi, l, q);
  const u128 run = ~(((static_cast<u128>(hi) << 64) | lo) >> p);
  const auto low = static_cast<std::uint64_t>(run);
  const unsigned c =
      low != 0
          ? static_cast<unsigned>(std::countr_zero(low))
          : 64 + static_cast<unsigned>(std::countr_zero(static_cast<std::uint64_t>(run >> 64)));
  const unsigned s = p - q;
  std::uint64_t out = 0;
  const std::uint64_t want = (std::uint64_t{rem} << l.t) * l.rep;
  for_windows(L, l, s, s + c, [&](unsigned j, std::uint64_t x, unsigned m) {
    // Remainder fields equal to rem: zero after the xor (the top bit is set
    // by the add unless the lower bits are all 0).
    const std::uint64_t y = (x ^ want) & l.rfields;
    std::uint64_t z = ~(((y & l.lfields) + l.lfields) | y) & l.hfields & window_mask(l, m);
    for (; z != 0; z &= z - 1) out |= 1ULL << (j + l.entry_of_bit[std::countr_zero(z)]);
  });
  return out;
}

bool holds(const Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem, const Age* a) {
  std::uint64_t m = matches(L, l, q, rem);
  if (a == nullptr) return m != 0;
  for (; m != 0; m &= m - 1) {
    const auto j = static_cast<unsigned>(std::countr_zero(m));
    if (alive(static_cast<std::uint32_t>(entry(L, l, j)) & l.tmask, l, *a)) return true;
  }
  return false;
}

void compact(Line& L, const Layout& l, std::uint64_t dead, std::uint32_t stamp_tag) {
  if (dead != 0) {
    u128 code = code_of(L, l);
    unsigned n = popcount64(static_cast<std::uint64_t>(code)) +
                 popcount64(static_cast<std::uint64_t>(code >> 64));
    // Highest first: the lower entries and their code bits do not move.
    while (dead != 0) {
      const unsigned j = 63 - static_cast<unsigned>(std::countl_zero(dead));
      dead &= ~(1ULL << j);
      const unsigned z =
          select128(static_cast<std::uint64_t>(code), static_cast<std::uint64_t>(code >> 64), j);
      code = (code & below(z)) | ((code >> 1) & ~below(z));
      delete_bits(L, l.e0 + j * l.w, l.e0 + n * l.w, l.w);
      --n;
    }
    put_code(L, l, code);
  }
  set_stamp(L, l, stamp_tag);
}

void insert(Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem, std::uint32_t tag) {
  // insert_bits() moves whole words: the stamp is put back after.
  const std::uint32_t st = stamp(L, l);
  u128 code = code_of(L, l);
  const unsigned n = popcount64(static_cast<std::uint64_t>(code)) +
                     popcount64(static_cast<std::uint64_t>(code >> 64));
  const unsigned p =
      bucket_start(static_cast<std::uint64_t>(code), static_cast<std::uint64_t>(code >> 64), l, q);
  code = (code & below(p)) | ((code & ~below(p)) << 1) | (u128{1} << p);
  put_code(L, l, code);
  insert_bits(L, l.e0 + (p - q) * l.w, l.e0 + n * l.w, l.w, (std::uint64_t{rem} << l.t) | tag);
  set_stamp(L, l, st);
}

bool renew(Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem, const Age& a) {
  for (std::uint64_t m = matches(L, l, q, rem); m != 0; m &= m - 1) {
    const auto j = static_cast<unsigned>(std::countr_zero(m));
    const std::uint64_t e = entry(L, l, j);
    if (!alive(static_cast<std::uint32_t>(e) & l.tmask, l, a)) continue;
    // Rewrite the entry: delete it, insert it with the new tag at the same
    // place (first in its bucket; the order inside a bucket is free).
    const unsigned n = count(L, l);
    const std::uint32_t st = stamp(L, l);
    delete_bits(L, l.e0 + j * l.w, l.e0 + n * l.w, l.w);
    insert_bits(L, l.e0 + j * l.w, l.e0 + (n - 1) * l.w, l.w,
                (e & ~std::uint64_t{l.tmask}) | a.now);
    set_stamp(L, l, st);
    return true;
  }
  return false;
}

void relayout(Line& L, const Layout& from, const Layout& to) {
  const unsigned n = count(L, from);
  std::array<std::uint64_t, kMaxSlots> e{};
  for (unsigned j = 0; j < n; ++j) e[j] = entry(L, from, j);
  const u128 code = code_of(L, from);
  const std::uint32_t st = stamp(L, from);
  Line out{};
  put_code(out, to, code);
  for (unsigned j = 0; j < n; ++j) {
    const std::uint64_t rem = (e[j] >> from.t) & to.rmask;
    insert_bits(out, to.e0 + j * to.w, to.e0 + j * to.w, to.w, (rem << to.t) | (e[j] & to.tmask));
  }
  set_stamp(out, to, st);
  L = out;
}

bool consistent(const Line& L, const Layout& l, const Age& a, unsigned& n) {
  const u128 code = code_of(L, l);
  n = popcount64(static_cast<std::uint64_t>(code)) +
      popcount64(static_cast<std::uint64_t>(code >> 64));
  if (n > l.shape.S) return false;
  // All n entries inside the B buckets: nothing after the B-th 0.
  const std::uint32_t B = l.shape.B;
  const unsigned end =
      bucket_start(static_cast<std::uint64_t>(code), static_cast<std::uint64_t>(code >> 64), l, B);
  if (end != B + n) return false;
  // Nothing outside the code, the n entries and the stamp.
  const auto used = bit_range(0, l.e0 + n * l.w);
  const auto stamp_bits = bit_range(kLineBits - l.t, kLineBits);
  for (unsigned i = 0; i < 8; ++i) {
    if ((L.w[i] & ~used[i] & ~stamp_bits[i]) != 0) return false;
  }
  if (stamp(L, l) == a.now && dead_entries(L, l, n, a) != 0) return false;
  return true;
}

#if KDEDUP_COMPACT_X86
KDEDUP_COMPACT_AVX512 void vector_insert(Line& L, const Layout& l, std::uint32_t q,
                                         std::uint32_t rem, std::uint32_t tag) {
  insert_line_avx512(L, l, q, rem, tag);
}

KDEDUP_COMPACT_AVX512 std::uint64_t vector_dead(const Line& L, const Layout& l, const Age& a) {
  if (l.bytes) return scan_bytes_avx512<true>(_mm512_load_si512(L.w), l, count(L, l), 0, a).dead;
  const __m512i now16 = _mm512_set1_epi16(static_cast<short>(a.now + (1U << l.t)));
  const __m512i window16 = _mm512_set1_epi16(static_cast<short>(a.window));
  return scan_avx512<true>(_mm512_load_si512(L.w), l, count(L, l), now16, now16, window16).dead;
}

KDEDUP_COMPACT_AVX512 void vector_compact(Line& L, const Layout& l, std::uint64_t dead,
                                          std::uint32_t stamp_tag) {
  _mm512_store_si512(L.w, compact_avx512(_mm512_load_si512(L.w), l, dead, stamp_tag));
}

KDEDUP_COMPACT_AVX512 std::uint64_t vector_matches(const Line& L, const Layout& l,
                                                   std::uint32_t rem) {
  const unsigned n = count(L, l);
  const std::uint64_t entries = n >= 64 ? ~0ULL : (1ULL << n) - 1;
  if (l.bytes)
    return scan_bytes_avx512<false>(_mm512_load_si512(L.w), l, n, rem, {}).match & entries;
  const __m512i want = _mm512_set1_epi16(static_cast<short>(rem << l.t));
  return scan_avx512<false>(_mm512_load_si512(L.w), l, n, want, want, want).match & entries;
}

bool avx512_usable() noexcept {
  static const bool usable = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("popcnt");
  }();
  return usable;
}
#endif

}  // namespace kdedup::filter::compact
