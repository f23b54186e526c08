#pragma once
// The compact filter's line codec (private to lib/src/filter): the shape of a
// 64-byte line of quotient-coded buckets, and the operations on one line,
// portable and with AVX-512. compact_filter.h has the design and its sources;
// this file has the bit layout and the invariants a line keeps.
//
// A line of shape (t, r, S, B) holds up to S entries of w = r + t bits, each
// a remainder (r bits) over a tag (t bits), in B logical buckets:
//
//   bits [0, B + S)          bucket code: for bucket 0 .. B-1 in order, one
//                            1 per entry of the bucket, then a 0; unused
//                            bits after the last bucket's 0 are 0
//   bits [e0, e0 + S w)      entries in bucket order, entry j at e0 + j w,
//                            e0 = B + S; unused entry bits are 0
//   bits [512 - t, 512)      stamp: tag of the tick the line was last
//                            compacted at (no entry in it was dead then)
//
// An all-zero line is empty (B empty buckets), so a zeroed table is valid.
// The entries of bucket q are those after the (q-1)-th 0 of the code; entry
// j belongs to bucket (position of the j-th 1) - j. A new entry goes first in
// its bucket. Compaction removes every entry whose tag is dead and sets the
// stamp: every operation the portable and the vector code do is defined
// here once, and both give the same bytes (tests/unit/filter).
//
// Threading: plain functions on memory the caller owns.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kdedup/filter/compact_filter.h"

#if defined(__x86_64__) && defined(__GNUC__)
#if !defined(__clang__) && __GNUC__ < 13
// GCC 12 reports the _mm512_undefined_*() inside its own AVX-512 intrinsics
// as maybe uninitialized once they are inlined (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#define KDEDUP_COMPACT_X86 1
// Everything the vector path uses: AVX-512 F/BW/VL, VBMI (byte permutes and
// multishifts), VBMI2 (funnel shifts), BMI2 (pdep / pext for select).
#define KDEDUP_COMPACT_AVX512 \
  [[gnu::target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,bmi,bmi2,popcnt,lzcnt")]]
#endif

namespace kdedup::filter::compact {

__extension__ typedef unsigned __int128 u128;

inline constexpr unsigned kLineBits = 512;
inline constexpr std::uint64_t kLineBytes = 64;
/// Most entries a line holds (the masks of a line are 64-bit words).
inline constexpr unsigned kMaxSlots = 64;
/// Code bits (buckets + entries) fit two 64-bit words.
inline constexpr unsigned kMaxCodeBits = 128;
/// Widest remainder.
inline constexpr unsigned kMaxRemainder = 28;

inline std::uint64_t mulhi(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
}

/// False-positive probability of one table at live load `load` (entries per
/// slot): a query compares its remainder with the entries of its bucket in
/// two lines, 2 S load / B of them on average, each equal with probability
/// 2^-r.
[[nodiscard]] inline double fpp_at(double load, const Shape& s) {
  if (!(load > 0) || s.S == 0) return 0.0;
  const double per = std::log1p(-std::ldexp(1.0, -static_cast<int>(s.r)));
  return -std::expm1(2.0 * load * s.S / s.B * per);
}

/// Largest load whose fpp_at() is at most `fpp`.
[[nodiscard]] inline double load_for(double fpp, const Shape& s) {
  if (!(fpp > 0)) return 0.0;
  if (fpp >= 1.0) return 1e9;
  const double per = std::log1p(-std::ldexp(1.0, -static_cast<int>(s.r)));
  return std::log1p(-fpp) * s.B / (2.0 * s.S * per);
}

/// Highest live load at which two choices between lines of S slots, in a
/// sliding window of W ticks, rarely find both lines full: at most about one
/// insertion in a million, in a simulation of the steady state (an entry
/// per insertion into the less full of two random lines, the oldest tick's
/// entries removed at each tick; the filter itself misses about ten times
/// less often). The fullest lines stay a few slots above the mean (Azar et
/// al. 1999: ln ln n / ln 2 + O(1)), so what must be left free is a number
/// of slots, not a share: about 3 at W = 10, where the load reaches its peak
/// only at the end of each tick, rising to 4 for long windows, whose load
/// stays at its peak (measured: W = 10: 3.0-3.2, W = 29: 3.3-3.6, W = 125:
/// 3.7-4.1 slots for S = 18 .. 37).
[[nodiscard]] inline double safe_load(unsigned S, std::uint32_t window) {
  const double free_slots = std::max(2.0, 4.1 - 11.0 / std::max(1U, window));
  return std::max(0.5, 1.0 - free_slots / static_cast<double>(S));
}

/// True when a line of tag width t holds shape `s`.
[[nodiscard]] inline bool fits(const Shape& s, unsigned t) {
  return s.r >= 1 && s.r <= kMaxRemainder && s.S >= 4 && s.S <= kMaxSlots && s.B >= 1 &&
         s.B + s.S <= kMaxCodeBits && s.B + s.S + s.S * (s.r + t) + t <= kLineBits;
}

/// The shape with the most slots per line (the fewest bits per entry) whose
/// fpp_at(load) is at most `budget`; among those, the one with the lowest
/// fpp. The finest shape there is when none fits.
[[nodiscard]] Shape best_shape(double budget, double load, unsigned t);

/// The shape a table of shape `s` becomes when its remainders lose `bits`
/// bits in place (same buckets, more slots): budget pressure; `s` when none.
[[nodiscard]] Shape narrowed(const Shape& s, unsigned t, unsigned bits);

/// A 64-byte line.
struct alignas(64) Line {
  std::uint64_t w[8];
};

/// What a tag's liveness is judged against: alive iff (now - tag) mod 2^t <=
/// window.
struct Age {
  std::uint32_t now = 0;  // tag of the clock
  std::uint32_t window = 0;
};

/// Where an identity goes in a table: its two candidate lines, its bucket
/// and its remainder. Derived from the fingerprint through Key.
struct Key {
  std::uint64_t pos = 0;    // line positions
  std::uint64_t mixed = 0;  // bucket (top bits) and remainder (low bits)
  /// Bin of the overflow filter (any table).
  [[nodiscard]] unsigned bin() const { return static_cast<unsigned>(mixed >> 56); }
};

inline constexpr std::uint64_t kPosMul = 0x9E3779B97F4A7C15ULL;  // odd: a bijection of lo
inline constexpr std::uint64_t kAltMul = 0xD6E8FEB86659FD93ULL;

/// Fingerprint.lo through an odd multiplier gives `mixed`: its top bits pick
/// the bucket (multiply-high by B) and its low bits are the remainder, so a
/// remainder narrowed in place keeps the low bits a query computes.
/// Fingerprint.hi xor `mixed` gives `pos`: the first line by multiply-high,
/// the second from pos times another odd constant. With salted XXH3-128 the
/// halves are independent; the xor only spreads weak test inputs.
[[nodiscard]] inline Key key_of(std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t mixed = lo * kPosMul;
  return {hi ^ mixed, mixed};
}

/// A line's shape with everything the codec derives from it, as plain values
/// for the hot path. Built once per table (Layout::of).
struct alignas(64) Layout {
  Shape shape;
  unsigned t = 0;
  unsigned w = 0;                          // entry bits r + t
  unsigned e0 = 0;                         // first entry bit (B + S)
  std::uint64_t code_lo = 0, code_hi = 0;  // the code region in words 0 and 1
  std::uint32_t rmask = 0, tmask = 0;
  std::uint64_t wmask = 0;
  std::uint64_t stamp_keep = 0;  // word 7 without the stamp
  // SWAR windows of k whole entries (64-bit load from an entry's bit):
  // one bit at each entry's start (rep), the remainders, their top bits,
  // the remainders' other bits, the tags, the bit above each tag.
  unsigned k = 0;
  std::uint64_t rep = 0, rfields = 0, hfields = 0, lfields = 0, tfields = 0, gfields = 0;
  std::array<std::uint8_t, 64> entry_of_bit{};  // bit in a window -> its entry
  // The vector path (AVX-512, w <= 16): entries unpacked into 16-bit lanes,
  // F of them per 64-bit lane group (4, or 3 when w > 14), `groups`
  // registers per line; lanes: F ones per 4 bits.
  bool vector = false;
  unsigned F = 0, groups = 0;
  std::uint32_t lanes = 0;
  std::uint16_t rmask16 = 0, tmask16 = 0;
  alignas(64) std::array<std::array<std::uint8_t, 64>, 2> idx{}, ctrl{};
  // The byte-lane scan (r <= 8 and S <= 8 F8): F8 entries per 64-bit lane,
  // each entry's remainder (rctl) or tag (tctl) in its own byte lane, the
  // whole line in one register; lanes8: F8 ones per 8 bits.
  bool bytes = false;
  unsigned F8 = 0;
  std::uint64_t lanes8 = 0;
  alignas(64) std::array<std::uint8_t, 64> idx8{}, rctl8{}, tctl8{};
  // Bit masks (8 words): the entry region below the stamp, bits >= e0; and
  // per 64-bit lane: its first bit, w, 64 - w.
  alignas(64) std::array<std::uint64_t, 8> below_stamp{}, from_e0{};
  alignas(64) std::array<std::uint64_t, 8> lane_bit{}, lane_w{};
  // from_entry[j]: the bits from entry j's first (e0 + j w) up to the stamp,
  // 0 for j = S .. kMaxSlots: where an insertion or deletion moves entries,
  // a load instead of four vector operations.
  alignas(64) std::array<std::array<std::uint64_t, 8>, kMaxSlots + 1> from_entry{};

  [[nodiscard]] static Layout of(const Shape& s, unsigned t);

  [[nodiscard]] std::uint32_t bucket_of(const Key& key) const {
    return static_cast<std::uint32_t>(mulhi(key.mixed, shape.B));
  }
  [[nodiscard]] std::uint32_t remainder_of(const Key& key) const {
    return static_cast<std::uint32_t>(key.mixed) & rmask;
  }
  [[nodiscard]] std::uint64_t line1(const Key& key, std::uint64_t lines) const {
    return mulhi(key.pos, lines);
  }
  [[nodiscard]] std::uint64_t line2(const Key& key, std::uint64_t lines) const {
    return mulhi(key.pos * kAltMul, lines);
  }
};

// --- portable operations -------------------------------------------------------

inline unsigned popcount64(std::uint64_t x) { return static_cast<unsigned>(std::popcount(x)); }

/// Position of the k-th set bit of x (x has more than k).
inline unsigned select64(std::uint64_t x, unsigned k) {
  // Byte by byte, then bit by bit inside the byte: at most 8 + 7 steps.
  unsigned base = 0;
  for (;;) {
    const unsigned c = popcount64(x & 0xFF);
    if (k < c) break;
    k -= c;
    x >>= 8;
    base += 8;
  }
  for (; k > 0; --k) x &= x - 1;
  return base + static_cast<unsigned>(std::countr_zero(x));
}

inline unsigned select128(std::uint64_t lo, std::uint64_t hi, unsigned k) {
  const unsigned c = popcount64(lo);
  return k < c ? select64(lo, k) : 64 + select64(hi, k - c);
}

inline std::uint64_t code_lo(const Line& L, const Layout& l) { return L.w[0] & l.code_lo; }
inline std::uint64_t code_hi(const Line& L, const Layout& l) { return L.w[1] & l.code_hi; }
inline unsigned count(const Line& L, const Layout& l) {
  return popcount64(code_lo(L, l)) + popcount64(code_hi(L, l));
}
inline std::uint32_t stamp(const Line& L, const Layout& l) {
  return static_cast<std::uint32_t>(L.w[7] >> (64 - l.t));
}
inline void set_stamp(Line& L, const Layout& l, std::uint32_t s) {
  L.w[7] = (L.w[7] & l.stamp_keep) | (std::uint64_t{s} << (64 - l.t));
}
inline bool alive(std::uint32_t tag, const Layout& l, const Age& a) {
  return ((a.now - tag) & l.tmask) <= a.window;
}

/// 64 bits of the line from bit `pos` (0 past the end; at least 57 valid
/// bits, or all up to the end), without reading outside the line.
inline std::uint64_t load_bits(const Line& L, unsigned pos) {
  const unsigned byte = std::min(pos >> 3, 56U);
  std::uint64_t x;
  std::memcpy(&x, reinterpret_cast<const char*>(L.w) + byte, 8);
  return x >> (pos - 8 * byte);
}

inline std::uint64_t entry(const Line& L, const Layout& l, unsigned j) {
  return load_bits(L, l.e0 + j * l.w) & l.wmask;
}

/// First code position of bucket q (after the (q-1)-th 0).
inline unsigned bucket_start(std::uint64_t lo, std::uint64_t hi, const Layout& l, std::uint32_t q) {
  if (q == 0) return 0;
  return select128(~lo & l.code_lo, ~hi & l.code_hi, q - 1) + 1;
}

/// Entries of the line that are dead at `a` (bit j: entry j), among n.
std::uint64_t dead_entries(const Line& L, const Layout& l, unsigned n, const Age& a);

/// Entries with remainder `rem` in bucket q (bit j: entry j); their tags are
/// not looked at.
std::uint64_t matches(const Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem);

/// True if bucket q holds `rem` with a live tag (`a` null: every entry is
/// alive, the line is fresh).
bool holds(const Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem, const Age* a);

/// Removes the entries in `dead` (bit j: entry j) and sets the stamp.
void compact(Line& L, const Layout& l, std::uint64_t dead, std::uint32_t stamp_tag);

/// Adds the entry (rem, tag) first in bucket q; the line must have room.
void insert(Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem, std::uint32_t tag);

/// Gives a live entry (q, rem) the tag `now`; false if there is none.
bool renew(Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem, const Age& a);

/// Rewrites the line from layout `from` to `to` (same t and B, narrower
/// remainders, at least as many slots): each remainder keeps its low bits.
void relayout(Line& L, const Layout& from, const Layout& to);

/// True when the line is one the codec produces: its code has B buckets and
/// at most S entries, every unused bit is 0, and a stamp equal to `now`
/// has no dead entry behind it. Counts its entries into `n`.
bool consistent(const Line& L, const Layout& l, const Age& a, unsigned& n);

// --- AVX-512 operations ------------------------------------------------------------
//
// The same operations on a whole line in one register: the entries are
// unpacked into 16-bit lanes by a byte permute and a multishift (the bytes
// holding F entries go to each 64-bit lane, each entry's bits to its own
// 16-bit lane), compared all at once; an insertion is a funnel shift of
// the entry region by w and of the code region by 1, blended in.

#if KDEDUP_COMPACT_X86

/// True when the CPU runs the vector path.
[[nodiscard]] bool avx512_usable() noexcept;

struct VecScan {
  std::uint64_t match = 0;  // entries with the remainder (any bucket)
  std::uint64_t dead = 0;   // entries dead at the age (when asked)
};

KDEDUP_COMPACT_AVX512 inline std::uint32_t lanes_of(const Layout& l, std::uint64_t entries,
                                                    unsigned g) {
  const std::uint64_t part = entries >> (g * 8 * l.F);
  return l.F == 4 ? static_cast<std::uint32_t>(part)
                  : static_cast<std::uint32_t>(_pdep_u64(part, l.lanes));
}
KDEDUP_COMPACT_AVX512 inline std::uint64_t entries_of(const Layout& l, std::uint32_t lanes,
                                                      unsigned g) {
  const std::uint64_t e = l.F == 4 ? lanes : _pext_u64(lanes, l.lanes);
  return e << (g * 8 * l.F);
}

/// Remainder matches among the n entries of the line in `v`; with `with_dead`
/// also the dead entries at (now16, window16) (tags as 16-bit lanes).
/// Without it the matches may include unused slots past the n entries
/// (whose bits are 0): the hot path ands them with a bucket's entries.
template <bool WithDead>
KDEDUP_COMPACT_AVX512 inline VecScan scan_avx512(__m512i v, const Layout& l, unsigned n,
                                                 __m512i want, __m512i now16, __m512i window16) {
  VecScan s;
  const std::uint64_t valid = !WithDead || n >= 64 ? ~0ULL : (1ULL << n) - 1;
  const __m512i rm = _mm512_set1_epi16(static_cast<short>(l.rmask16));
  const __m512i tm = _mm512_set1_epi16(static_cast<short>(l.tmask16));
  for (unsigned g = 0; g < l.groups; ++g) {
    const __m512i idx = _mm512_load_si512(l.idx[g].data());
    const __m512i ctrl = _mm512_load_si512(l.ctrl[g].data());
    const __m512i f = _mm512_multishift_epi64_epi8(ctrl, _mm512_permutexvar_epi8(idx, v));
    const __mmask32 k = lanes_of(l, valid, g);
    const __mmask32 m = _mm512_mask_cmpeq_epi16_mask(k, _mm512_and_si512(f, rm), want);
    s.match |= entries_of(l, m, g);
    if constexpr (WithDead) {
      const __m512i age = _mm512_and_si512(_mm512_sub_epi16(now16, _mm512_and_si512(f, tm)), tm);
      s.dead |= entries_of(l, _mm512_mask_cmpgt_epu16_mask(k, age, window16), g);
    }
  }
  return s;
}

/// Bits >= c per 64-bit lane, given c - 64 i in lane i (any value: a count
/// of 64 or more shifts everything out, a negative one clamps to 0).
KDEDUP_COMPACT_AVX512 inline __m512i bits_from(__m512i c) {
  return _mm512_sllv_epi64(_mm512_set1_epi64(-1), _mm512_max_epi64(c, _mm512_setzero_si512()));
}
KDEDUP_COMPACT_AVX512 inline __m512i lane_offsets(const Layout& l, unsigned bit) {
  return _mm512_sub_epi64(_mm512_set1_epi64(bit), _mm512_load_si512(l.lane_bit.data()));
}

/// The line with a 1 inserted into the code at p and the entry value at
/// entry j, bit E = e0 + j w (the code region [p, e0) moves up by 1, the
/// entries from E by w).
KDEDUP_COMPACT_AVX512 inline __m512i insert_avx512(__m512i v, const Layout& l, unsigned p,
                                                   unsigned j, std::uint64_t value) {
  const unsigned E = l.e0 + j * l.w;
  const __m512i prev = _mm512_alignr_epi64(v, _mm512_setzero_si512(), 7);  // lane i: lane i - 1
  const __m512i up1 = _mm512_shldi_epi64(v, prev, 1);
  const __m512i upw = _mm512_shldv_epi64(v, prev, _mm512_load_si512(l.lane_w.data()));
  const __m512i cp = lane_offsets(l, p), ce = lane_offsets(l, E);
  const __m512i e0 = _mm512_load_si512(l.from_e0.data());
  // code [p, e0) from up1 with a 1 at p; entries [E, stamp) from upw with
  // the value at E; the rest stays.
  __m512i r = _mm512_ternarylogic_epi64(_mm512_andnot_si512(e0, bits_from(cp)), up1, v, 0xCA);
  r = _mm512_ternarylogic_epi64(_mm512_load_si512(l.from_entry[j].data()), upw, r, 0xCA);
  r = _mm512_or_si512(r, _mm512_sllv_epi64(_mm512_set1_epi64(1), cp));
  const __m512i nce = _mm512_sub_epi64(_mm512_setzero_si512(), ce);
  const __m512i bv = _mm512_set1_epi64(static_cast<long long>(value));
  const __m512i bm = _mm512_set1_epi64(static_cast<long long>(l.wmask));
  const __m512i val = _mm512_or_si512(_mm512_sllv_epi64(bv, ce), _mm512_srlv_epi64(bv, nce));
  const __m512i fm = _mm512_or_si512(_mm512_sllv_epi64(bm, ce), _mm512_srlv_epi64(bm, nce));
  return _mm512_ternarylogic_epi64(fm, val, r, 0xCA);
}

KDEDUP_COMPACT_AVX512 inline unsigned select128_bmi2(std::uint64_t lo, std::uint64_t hi,
                                                     unsigned k) {
  // Without a branch: which word holds the k-th bit is a coin flip.
  const auto c = static_cast<unsigned>(_mm_popcnt_u64(lo));
  const std::uint64_t high = 0 - static_cast<std::uint64_t>(k >= c);
  const std::uint64_t word = lo ^ ((lo ^ hi) & high);
  const unsigned kk = k - (c & static_cast<unsigned>(high));
  return (64 & static_cast<unsigned>(high)) +
         static_cast<unsigned>(_tzcnt_u64(_pdep_u64(1ULL << kk, word)));
}

template <bool WithDead>
KDEDUP_COMPACT_AVX512 inline VecScan scan_bytes_avx512(__m512i v, const Layout& l, unsigned n,
                                                       std::uint32_t rem, const Age& a);

/// Remainder matches (and dead entries) of the line in `v` by whichever
/// scan its layout has.
template <bool WithDead>
KDEDUP_COMPACT_AVX512 inline VecScan scan_line_avx512(__m512i v, const Layout& l, unsigned n,
                                                      std::uint32_t rem, const Age& a) {
  if (l.bytes) return scan_bytes_avx512<WithDead>(v, l, n, rem, a);
  const __m512i want = _mm512_set1_epi16(static_cast<short>(rem << l.t));
  const __m512i now16 = _mm512_set1_epi16(static_cast<short>(a.now + (1U << l.t)));
  const __m512i window16 = _mm512_set1_epi16(static_cast<short>(a.window));
  return scan_avx512<WithDead>(v, l, n, want, now16, window16);
}

/// Byte-lane scan (Layout::bytes): remainder matches and, with WithDead, the
/// dead entries among the n entries of the line in `v` (without it, as
/// scan_avx512(): unused slots may match).
template <bool WithDead>
KDEDUP_COMPACT_AVX512 inline VecScan scan_bytes_avx512(__m512i v, const Layout& l, unsigned n,
                                                       std::uint32_t rem, const Age& a) {
  VecScan s;
  const std::uint64_t valid =
      WithDead ? _pdep_u64(n >= 64 ? ~0ULL : (1ULL << n) - 1, l.lanes8) : l.lanes8;
  const __m512i bytes = _mm512_permutexvar_epi8(_mm512_load_si512(l.idx8.data()), v);
  const __m512i rems = _mm512_multishift_epi64_epi8(_mm512_load_si512(l.rctl8.data()), bytes);
  const __mmask64 m = _mm512_mask_cmpeq_epi8_mask(
      valid, _mm512_and_si512(rems, _mm512_set1_epi8(static_cast<char>(l.rmask))),
      _mm512_set1_epi8(static_cast<char>(rem)));
  s.match = _pext_u64(m, l.lanes8);
  if constexpr (WithDead) {
    const __m512i tm = _mm512_set1_epi8(static_cast<char>(l.tmask));
    const __m512i tags = _mm512_and_si512(
        _mm512_multishift_epi64_epi8(_mm512_load_si512(l.tctl8.data()), bytes), tm);
    const __m512i age =
        _mm512_and_si512(_mm512_sub_epi8(_mm512_set1_epi8(static_cast<char>(a.now)), tags), tm);
    s.dead = _pext_u64(
        _mm512_mask_cmpgt_epu8_mask(valid, age, _mm512_set1_epi8(static_cast<char>(a.window))),
        l.lanes8);
  }
  return s;
}

/// Bucket q of a line with code words lo, hi: its first code position
/// (`p`, where a new entry's 1 goes) and its entries as a mask.
KDEDUP_COMPACT_AVX512 inline std::uint64_t bucket_entries_bmi2(std::uint64_t lo, std::uint64_t hi,
                                                               const Layout& l, std::uint32_t q,
                                                               unsigned& p) {
  p = q == 0 ? 0 : select128_bmi2(~lo & l.code_lo, ~hi & l.code_hi, q - 1) + 1;
  // The run of 1s from p: the trailing zeros of the inverted code above p.
  // A 128-bit shift (shrd and a conditional move): whether p is in the
  // high word is a coin flip, a branch on it mispredicted a third of the time.
  const auto above_lo = static_cast<std::uint64_t>(((static_cast<u128>(hi) << 64) | lo) >> p);
  const auto run = static_cast<unsigned>(_tzcnt_u64(~above_lo));
  // p - q entries sit in the buckets below q: 64 in a full line, whose
  // bucket q is then empty (a shift by 64 is undefined, not zero).
  const unsigned below = p - q;
  return below >= 64 ? 0 : _bzhi_u64(~0ULL, run) << below;
}

/// The line without its entry j: the entries above it move down by w (the
/// code is left alone). `v` has no stamp (its top t bits are 0), so what
/// moves down from the top is 0. j = kMaxSlots leaves `v` as it is.
KDEDUP_COMPACT_AVX512 inline __m512i delete_slot_avx512(__m512i v, const Layout& l, unsigned j) {
  const __m512i ne = _mm512_alignr_epi64(_mm512_setzero_si512(), v, 1);  // lane i: lane i + 1
  const __m512i downw = _mm512_shrdv_epi64(v, ne, _mm512_load_si512(l.lane_w.data()));
  return _mm512_ternarylogic_epi64(_mm512_load_si512(l.from_entry[j].data()), downw, v, 0xCA);
}

/// The code of a line with code words lo, hi without the 1s of its `dead`
/// entries (one pdep and one pext per word).
KDEDUP_COMPACT_AVX512 inline u128 code_without_bmi2(std::uint64_t lo, std::uint64_t hi,
                                                    const Layout& l, std::uint64_t dead) {
  const auto below = static_cast<unsigned>(_mm_popcnt_u64(lo));
  const std::uint64_t gone_lo = _pdep_u64(dead, lo);
  const std::uint64_t gone_hi = _pdep_u64(below >= 64 ? 0 : dead >> below, hi);
  const std::uint64_t keep_lo = l.code_lo & ~gone_lo, keep_hi = l.code_hi & ~gone_hi;
  const std::uint64_t c_lo = _pext_u64(lo, keep_lo), c_hi = _pext_u64(hi, keep_hi);
  const auto kept_lo = static_cast<unsigned>(_mm_popcnt_u64(keep_lo));
  return static_cast<u128>(c_lo) | static_cast<u128>(c_hi) << kept_lo;
}

/// The line in `v` with its stamp set to `tag`.
KDEDUP_COMPACT_AVX512 inline __m512i stamped_avx512(__m512i v, const Layout& l, std::uint32_t tag) {
  const __m512i stamp = _mm512_load_si512(l.below_stamp.data());
  const __m512i s = _mm512_set_epi64(static_cast<long long>(std::uint64_t{tag} << (64 - l.t)), 0, 0,
                                     0, 0, 0, 0, 0);
  return _mm512_ternarylogic_epi64(stamp, v, s, 0xCA);
}

/// The line in `v` (entries moved, stamp cleared) with `code` written into
/// its code region and stamped `tag`.
KDEDUP_COMPACT_AVX512 inline __m512i finish_compact_avx512(__m512i v, const Layout& l, u128 code,
                                                           std::uint32_t tag) {
  const __m512i c = _mm512_set_epi64(0, 0, 0, 0, 0, 0, static_cast<long long>(code >> 64),
                                     static_cast<long long>(static_cast<std::uint64_t>(code)));
  const __m512i region = _mm512_set_epi64(0, 0, 0, 0, 0, 0, static_cast<long long>(l.code_hi),
                                          static_cast<long long>(l.code_lo));
  return stamped_avx512(_mm512_ternarylogic_epi64(region, c, v, 0xCA), l, tag);
}

/// The line without its `dead` entries, stamped `tag`. The code loses the 1s
/// of those entries in one pext per word; the entries move down one at a
/// time, the highest first, with the stamp cleared (it is set at the end).
KDEDUP_COMPACT_AVX512 inline __m512i compact_avx512(__m512i v, const Layout& l, std::uint64_t dead,
                                                    std::uint32_t tag) {
  if (dead != 0) {
    const __m128i low = _mm512_castsi512_si128(v);
    const std::uint64_t w0 = static_cast<std::uint64_t>(_mm_cvtsi128_si64(low));
    const std::uint64_t w1 = static_cast<std::uint64_t>(_mm_extract_epi64(low, 1));
    const u128 code = code_without_bmi2(w0 & l.code_lo, w1 & l.code_hi, l, dead);
    v = _mm512_and_si512(v, _mm512_load_si512(l.below_stamp.data()));
    for (std::uint64_t d = dead; d != 0;) {
      const unsigned j = 63 - static_cast<unsigned>(_lzcnt_u64(d));
      d &= ~(1ULL << j);
      v = delete_slot_avx512(v, l, j);
    }
    return finish_compact_avx512(v, l, code, tag);
  }
  return stamped_avx512(v, l, tag);
}

/// insert() on a line in memory, given the first code position p of bucket
/// q (bucket_entries_bmi2()).
KDEDUP_COMPACT_AVX512 inline void insert_at_avx512(Line& L, const Layout& l, std::uint32_t q,
                                                   unsigned p, std::uint32_t rem,
                                                   std::uint32_t tag) {
  const std::uint64_t value = (std::uint64_t{rem} << l.t) | tag;
  _mm512_store_si512(L.w, insert_avx512(_mm512_load_si512(L.w), l, p, p - q, value));
}

/// insert() on a line in memory.
KDEDUP_COMPACT_AVX512 inline void insert_line_avx512(Line& L, const Layout& l, std::uint32_t q,
                                                     std::uint32_t rem, std::uint32_t tag) {
  const std::uint64_t lo = code_lo(L, l), hi = code_hi(L, l);
  const unsigned p = q == 0 ? 0 : select128_bmi2(~lo & l.code_lo, ~hi & l.code_hi, q - 1) + 1;
  insert_at_avx512(L, l, q, p, rem, tag);
}

/// The tests' handles on the vector operations (out of line, with the
/// target; the hot path inlines the forms above).
void vector_insert(Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem, std::uint32_t tag);
[[nodiscard]] std::uint64_t vector_dead(const Line& L, const Layout& l, const Age& a);
void vector_compact(Line& L, const Layout& l, std::uint64_t dead, std::uint32_t stamp_tag);
/// Entries with remainder `rem`, any bucket.
[[nodiscard]] std::uint64_t vector_matches(const Line& L, const Layout& l, std::uint32_t rem);

#endif  // KDEDUP_COMPACT_X86

}  // namespace kdedup::filter::compact
