#pragma once
// The timer filter's private parts shared by its source files (private to
// lib/src/filter): the cell codecs of 4-, 8- and 16-bit timers, the probe
// positions in a line, the live interval of a tick and the vectorised line
// scrub, the per-tick window counts and a sub-filter. timer_filter.h has the
// design. The helpers have internal linkage (an unnamed namespace): each
// source that includes this gets its own copy, as when they lived in one file.
//
// Threading: plain functions and structs owned by the filter, used on its thread.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

// The AVX2 and AVX-512 paths (simd.h) are compiled into every x86-64 build,
// each function with its own target attribute, and run only where the CPU
// has the instructions: the rest of the program keeps the baseline set.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KDEDUP_TIMER_X86 1
#define KDEDUP_AVX2_TARGET [[gnu::target("avx2,bmi,bmi2,popcnt")]]
#define KDEDUP_AVX512_TARGET [[gnu::target("avx512f,avx512bw,bmi,bmi2,popcnt")]]
#endif

#include "kdedup/filter/simd.h"
#include "kdedup/filter/timer_filter.h"

namespace kdedup::filter {
namespace {

// Version 2 adds each sub-filter's hash range after its line count; it is
// written only when some sub-filter is shrunk (span != lines), so that a
// build that reads only version 1 restores every other snapshot. Version 3
// adds, after the hash range, the expansions whose copies may be alive
// (count, then tick and factor of each); written only when some sub-filter
// has one. Version 4 is version 3 and, after the sub-filters, the growth
// state (TimerFilter::GrowthState in timer_snapshot.cc); written once the
// filter has taken a record.
constexpr std::uint16_t kVersionShrunk = 2;
constexpr std::uint16_t kVersionSplit = 3;
constexpr std::uint16_t kVersion = 4;
constexpr std::uint64_t kLineBytes = 64;
constexpr std::uint64_t kScrubPrefetchLines = 8;
constexpr std::uint32_t kMaxProbes = 16;  // k <= 64 / log2(cells per line) <= 12

__extension__ typedef unsigned __int128 u128;

inline std::uint64_t mulhi(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
}

// The line that holds hash line v of a sub-filter holding `lines` lines
// over a hash range of `span` = 2 x `back` or fewer: v itself, or past the
// held lines the one half the range back (linear hashing: see "Shrink" in
// timer_filter.h).
constexpr std::uint64_t held_line(std::uint64_t v, std::uint64_t lines, std::uint64_t back) {
  return v >= lines ? v - back : v;
}
constexpr unsigned log2_of(std::uint32_t v) {
  unsigned r = 0;
  while ((1U << r) < v) ++r;
  return r;
}

// Zeroed, line-aligned cell memory. Large arrays are 2 MiB aligned and asked
// to use transparent huge pages: every operation touches a random line, and
// with 4 KiB pages nearly every one would also miss the TLB.
inline std::uint8_t* allocate_cells(std::uint64_t bytes) {
  constexpr std::uint64_t kHuge = 2ULL << 20;
  const bool huge = bytes >= kHuge;
  const std::uint64_t align = huge ? kHuge : kLineBytes;
  const std::uint64_t rounded = (bytes + align - 1) / align * align;
  auto* p = static_cast<std::uint8_t*>(std::aligned_alloc(align, rounded));
  if (p == nullptr) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
  std::memset(p, 0, bytes);
  return p;
}

// Non-empty cells in `bytes` of cell memory (straight loops that vectorise).
inline std::uint64_t count_nonempty(const std::uint8_t* data, std::uint64_t bytes, unsigned bits) {
  std::uint64_t n = 0;
  if (bits == 4) {
    for (std::uint64_t i = 0; i < bytes; ++i) n += ((data[i] & 0xF) != 0) + ((data[i] >> 4) != 0);
  } else if (bits == 8) {
    for (std::uint64_t i = 0; i < bytes; ++i) n += data[i] != 0;
  } else {
    const auto* cells = reinterpret_cast<const std::uint16_t*>(data);
    for (std::uint64_t i = 0; i < bytes / 2; ++i) n += cells[i] != 0;
  }
  return n;
}

// Cell access inside one 64-byte line for b-bit timers.
template <unsigned Bits>
struct Cells;

template <>
struct Cells<4> {
  static constexpr std::uint32_t kPerLine = 128;
  static std::uint32_t get(const std::uint8_t* line, std::uint32_t j) {
    return (line[j >> 1] >> ((j & 1) * 4)) & 0xF;
  }
  static void set(std::uint8_t* line, std::uint32_t j, std::uint32_t v) {
    const unsigned shift = (j & 1) * 4;
    line[j >> 1] = static_cast<std::uint8_t>((line[j >> 1] & ~(0xF << shift)) | (v << shift));
  }
};

template <>
struct Cells<8> {
  static constexpr std::uint32_t kPerLine = 64;
  static std::uint32_t get(const std::uint8_t* line, std::uint32_t j) { return line[j]; }
  static void set(std::uint8_t* line, std::uint32_t j, std::uint32_t v) {
    line[j] = static_cast<std::uint8_t>(v);
  }
};

template <>
struct Cells<16> {
  static constexpr std::uint32_t kPerLine = 32;
  static std::uint32_t get(const std::uint8_t* line, std::uint32_t j) {
    return reinterpret_cast<const std::uint16_t*>(line)[j];
  }
  static void set(std::uint8_t* line, std::uint32_t j, std::uint32_t v) {
    reinterpret_cast<std::uint16_t*>(line)[j] = static_cast<std::uint16_t>(v);
  }
};

// k distinct positions in a line of kCells cells from the low fingerprint
// half: log2(kCells) bits each; a taken position moves to the next free cell
// (cyclically). This is the slow path of probe_positions below; the next free
// cell is found without a loop: rotate the free mask so that bit p comes
// first and count its trailing zeros.
template <std::uint32_t kCells, unsigned K>
[[gnu::noinline]] void resolve_positions(std::uint64_t h, std::uint32_t k, std::uint32_t* out) {
  constexpr unsigned kBits = log2_of(kCells);
  if (K != 0) k = K;
  if constexpr (kCells <= 64) {
    using Mask = std::conditional_t<kCells == 64, std::uint64_t, std::uint32_t>;
    static_assert(sizeof(Mask) * 8 == kCells);
    Mask used = 0;
#pragma GCC unroll 16
    for (std::uint32_t i = 0; i < k; ++i) {
      const auto p = static_cast<unsigned>(h & (kCells - 1));
      h >>= kBits;
      // At most k - 1 < kCells cells are used, so some bit of ~used is set.
      const auto free = static_cast<Mask>(~used);
      const unsigned q =
          (p + static_cast<unsigned>(std::countr_zero(std::rotr(free, static_cast<int>(p))))) &
          (kCells - 1);
      used |= Mask{1} << q;
      out[i] = q;
    }
  } else {
    static_assert(kCells == 128);
    std::uint64_t used[2] = {0, 0};
    for (std::uint32_t i = 0; i < k; ++i) {
      const auto p = static_cast<unsigned>(h & (kCells - 1));
      h >>= kBits;
      const unsigned w = p >> 6;
      const std::uint64_t rest = ~used[w] >> (p & 63);  // free cells from p to the word's end
      unsigned q;
      if (rest != 0) {
        q = p + static_cast<unsigned>(std::countr_zero(rest));
      } else if (~used[w ^ 1] != 0) {
        q = (w ^ 1) * 64 + static_cast<unsigned>(std::countr_zero(~used[w ^ 1]));
      } else {
        q = w * 64 + static_cast<unsigned>(std::countr_zero(~used[w]));
      }
      used[q >> 6] |= std::uint64_t{1} << (q & 63);
      out[i] = q;
    }
  }
}

// The k probe positions of a fingerprint (see resolve_positions). When the
// raw log2(kCells)-bit fields are already distinct (at k = 5 in a 64-cell
// line, 85% of fingerprints) they are the answer, found with independent
// operations per probe; only a collision takes the sequential slow path,
// which gives the same result for distinct fields.
template <std::uint32_t kCells, unsigned K>
[[gnu::always_inline]] inline void probe_positions(std::uint64_t h, std::uint32_t k,
                                                   std::uint32_t* out) {
  constexpr unsigned kBits = log2_of(kCells);
  using Mask = std::conditional_t<kCells == 128, u128,
                                  std::conditional_t<kCells == 64, std::uint64_t, std::uint32_t>>;
  Mask used = 0, clash = 0;
#pragma GCC unroll 16
  for (std::uint32_t i = 0; i < k; ++i) {
    const auto p = static_cast<unsigned>((h >> (i * kBits)) & (kCells - 1));
    const Mask bit = Mask{1} << p;
    clash |= used & bit;
    used |= bit;
    out[i] = p;
  }
  if (clash != 0) [[unlikely]] {
    resolve_positions<kCells, K>(h, k, out);
  }
}

// Age test. Codes live in 1..M, M = 2^b - 1, and the live codes at a clock
// form the cyclic interval of W + 1 codes ending at code(now). Taken modulo
// 2^b instead of M, that interval starts at `lo` and spans `span` = W codes
// after it, or W + 1 when it wraps past M (the wrap then also covers 0, the
// empty code, which the test excludes separately):
//   alive(v)  <=>  v != 0  and  (v - lo) mod 2^b <= span.
// No modulo by M per cell, and only two compares. Without the wrap, 0 reads
// as dead on its own: (0 - lo) mod 2^b = 2^b - lo > W since lo <= M - W.
struct LiveInterval {
  std::uint32_t lo = 1;
  std::uint32_t span = 0;
};

// The codes of ages 0..max_age at the clock whose code is `code`.
inline LiveInterval live_interval(std::uint32_t code, std::uint32_t max_age, std::uint32_t m) {
  const std::int64_t lo = static_cast<std::int64_t>(code) - max_age;
  if (lo >= 1) return {static_cast<std::uint32_t>(lo), max_age};
  return {static_cast<std::uint32_t>(lo + m), max_age + 1};
}

// Per-code class for 4- and 8-bit timers, rebuilt when the clock moves:
// summed over the k cells, the low nibble counts the alive cells and the high
// nibble the empty ones (k <= 10 < 16). A table read replaces the two
// compares of the age test.
constexpr std::uint8_t kClassAlive = 0x01;
constexpr std::uint8_t kClassEmpty = 0x10;

// True when all k cells at `pos` are alive; counts the empty ones into
// `empty` (only meaningful for the line about to be written).
template <unsigned Bits>
[[gnu::always_inline]] inline bool all_alive(const std::uint8_t* line, const std::uint32_t* pos,
                                             std::uint32_t k, const auto& view,
                                             std::uint32_t& empty) {
  if constexpr (Bits <= 8) {
    std::uint32_t sum = 0;
#pragma GCC unroll 16
    for (std::uint32_t i = 0; i < k; ++i) sum += view.code_class[Cells<Bits>::get(line, pos[i])];
    empty = sum >> 4;
    return (sum & 0xF) == k;
  } else {
    constexpr std::uint32_t kMask = (1U << Bits) - 1;
    // Branch-free: a dead or empty cell makes `bad` negative.
    std::int32_t bad = 0;
    std::uint32_t zeros = 0;
#pragma GCC unroll 16
    for (std::uint32_t i = 0; i < k; ++i) {
      const std::uint32_t v = Cells<Bits>::get(line, pos[i]);
      const std::uint32_t d = (v - view.live_lo) & kMask;
      bad |= static_cast<std::int32_t>(view.live_span - d) | static_cast<std::int32_t>(v - 1);
      zeros += v == 0;
    }
    empty = zeros;
    return bad >= 0;
  }
}

// Equal-timers heuristic (seed 000 §4): at least `equal` of the k timers
// hold the same code, i.e. were most likely set by one element.
template <unsigned Bits>
inline bool enough_equal(const std::uint8_t* line, const std::uint32_t* pos, std::uint32_t k,
                         std::uint32_t equal) {
  std::uint32_t codes[kMaxProbes];
  for (std::uint32_t i = 0; i < k; ++i) codes[i] = Cells<Bits>::get(line, pos[i]);
  for (std::uint32_t i = 0; i < k; ++i) {
    std::uint32_t same = 0;
    for (std::uint32_t j = 0; j < k; ++j) same += codes[j] == codes[i];
    if (same >= equal) return true;
  }
  return false;
}

template <unsigned Bits>
[[gnu::always_inline]] inline void write_code(std::uint8_t* line, const std::uint32_t* pos,
                                              std::uint32_t k, std::uint32_t code) {
#pragma GCC unroll 16
  for (std::uint32_t i = 0; i < k; ++i) Cells<Bits>::set(line, pos[i], code);
}

// Line scrub: clears the cells of one 64-byte line whose code is outside
// `live` (empty cells stay empty); returns the number of cells cleared.
// Written on 16-byte vectors (GCC vector extensions: SSE2 on x86-64, NEON on
// ARM): per vector a subtract, an unsigned compare, and the count of cells
// that stay. The line is stored back unconditionally: at the default 192
// ticks per window about 80% of visits clear something, and the branch that
// skipped the store for the others mispredicted often enough to cost more
// than the store (measured: batch inserts 4-20% faster without it).
typedef std::uint8_t U8x16 __attribute__((vector_size(16)));
typedef std::uint16_t U16x8 __attribute__((vector_size(16)));
typedef std::uint64_t U64x2 __attribute__((vector_size(16)));

// Sum of the 16 byte lanes (each small enough that the total fits a byte).
inline std::uint32_t sum_bytes(U8x16 v) {
  const U64x2 w = reinterpret_cast<U64x2>(v);
  const std::uint64_t s = w[0] + w[1];  // bytes stay below 256: no carries
  return static_cast<std::uint32_t>((s * 0x0101010101010101ULL) >> 56);
}

// Keep mask of one 16-byte vector (all-ones lanes: keep); the cells that
// stay nonzero or were empty are counted into `stay` (the rest are cleared).
template <unsigned Bits>
inline U8x16 keep_mask(U8x16 x, LiveInterval live, U8x16& stay) {
  if constexpr (Bits == 16) {
    const U16x8 lo = U16x8{} + static_cast<std::uint16_t>(live.lo);
    const U16x8 span = U16x8{} + static_cast<std::uint16_t>(live.span);
    const U16x8 v = reinterpret_cast<U16x8>(x);
    const U16x8 k = reinterpret_cast<U16x8>((v - lo) <= span);
    // 0xFF (-1) in the low byte of each counted cell: counts up in `stay`.
    stay -= reinterpret_cast<U8x16>((k | reinterpret_cast<U16x8>(v == 0)) & std::uint16_t{0x00FF});
    return reinterpret_cast<U8x16>(k);
  } else if constexpr (Bits == 8) {
    const U8x16 lo = U8x16{} + static_cast<std::uint8_t>(live.lo);
    const U8x16 span = U8x16{} + static_cast<std::uint8_t>(live.span);
    const U8x16 k = reinterpret_cast<U8x16>((x - lo) <= span);
    stay -= k | reinterpret_cast<U8x16>(x == 0);
    return k;
  } else {
    // Two 4-bit cells per byte: test the low and high nibbles separately.
    const U8x16 nibble = U8x16{} + std::uint8_t{0x0F};
    const U8x16 lo = U8x16{} + static_cast<std::uint8_t>(live.lo);
    const U8x16 span = U8x16{} + static_cast<std::uint8_t>(live.span);
    const U8x16 low = x & nibble;
    const U8x16 high = (x >> 4) & nibble;
    const U8x16 kl = reinterpret_cast<U8x16>(((low - lo) & nibble) <= span);
    const U8x16 kh = reinterpret_cast<U8x16>(((high - lo) & nibble) <= span);
    stay -= kl | reinterpret_cast<U8x16>(low == 0);
    stay -= kh | reinterpret_cast<U8x16>(high == 0);
    return (kl & nibble) | (kh & ~nibble);
  }
}

template <unsigned Bits>
inline std::uint32_t scrub_line(std::uint8_t* line, LiveInterval live) {
  U8x16 x0, x1, x2, x3;
  std::memcpy(&x0, line, 16);
  std::memcpy(&x1, line + 16, 16);
  std::memcpy(&x2, line + 32, 16);
  std::memcpy(&x3, line + 48, 16);
  U8x16 stay = {};  // per byte lane: cells kept or empty (at most 8 per lane)
  const U8x16 k0 = keep_mask<Bits>(x0, live, stay);
  const U8x16 k1 = keep_mask<Bits>(x1, live, stay);
  const U8x16 k2 = keep_mask<Bits>(x2, live, stay);
  const U8x16 k3 = keep_mask<Bits>(x3, live, stay);
  x0 &= k0;
  x1 &= k1;
  x2 &= k2;
  x3 &= k3;
  std::memcpy(line, &x0, 16);
  std::memcpy(line + 16, &x1, 16);
  std::memcpy(line + 32, &x2, 16);
  std::memcpy(line + 48, &x3, 16);
  return Cells<Bits>::kPerLine - sum_bytes(stay);
}

#if KDEDUP_TIMER_X86
// scrub_line<8> over `count` consecutive lines with AVX-512: one line is one
// register; a compare gives the 64-bit mask of live cells, a zero-masking
// move clears the others, and popcounts give the cells cleared. Same result
// as the portable loop, line for line.
KDEDUP_AVX512_TARGET inline std::uint64_t scrub_lines_avx512_8(std::uint8_t* line,
                                                               std::uint64_t count,
                                                               LiveInterval live) {
  const __m512i lo = _mm512_set1_epi8(static_cast<char>(live.lo));
  const __m512i span = _mm512_set1_epi8(static_cast<char>(live.span));
  std::uint64_t cleared = 0;
  for (std::uint8_t* const stop = line + count * kLineBytes; line != stop; line += kLineBytes) {
    __builtin_prefetch(line + kScrubPrefetchLines * kLineBytes, 1, 0);
    const __m512i x = _mm512_load_si512(line);
    const __mmask64 keep = _mm512_cmple_epu8_mask(_mm512_sub_epi8(x, lo), span);
    const __mmask64 set = _mm512_test_epi8_mask(x, x);
    _mm512_store_si512(line, _mm512_maskz_mov_epi8(keep, x));
    cleared += static_cast<std::uint64_t>(_mm_popcnt_u64(set & ~keep));
  }
  return cleared;
}

// Byte lanes of `x` whose code is in `live` (all-ones) on AVX2, which has no
// unsigned byte compare: x - lo <= span  <=>  min(x - lo, span) == x - lo.
KDEDUP_AVX2_TARGET inline __m256i in_interval_avx2(__m256i x, __m256i lo, __m256i span) {
  const __m256i d = _mm256_sub_epi8(x, lo);
  return _mm256_cmpeq_epi8(_mm256_min_epu8(d, span), d);
}

// The same scrub with AVX2: a line is two registers.
KDEDUP_AVX2_TARGET inline std::uint64_t scrub_lines_avx2_8(std::uint8_t* line, std::uint64_t count,
                                                           LiveInterval live) {
  const __m256i lo = _mm256_set1_epi8(static_cast<char>(live.lo));
  const __m256i span = _mm256_set1_epi8(static_cast<char>(live.span));
  const __m256i zero = _mm256_setzero_si256();
  std::uint64_t cleared = 0;
  for (std::uint8_t* const stop = line + count * kLineBytes; line != stop; line += kLineBytes) {
    __builtin_prefetch(line + kScrubPrefetchLines * kLineBytes, 1, 0);
    for (std::uint8_t* half = line; half != line + kLineBytes; half += 32) {
      auto* p = reinterpret_cast<__m256i*>(half);
      const __m256i x = _mm256_load_si256(p);
      const __m256i keep = in_interval_avx2(x, lo, span);
      _mm256_store_si256(p, _mm256_and_si256(x, keep));
      // Cleared: neither kept nor empty.
      const auto stay = static_cast<std::uint32_t>(
          _mm256_movemask_epi8(_mm256_or_si256(keep, _mm256_cmpeq_epi8(x, zero))));
      cleared += static_cast<std::uint64_t>(_mm_popcnt_u32(~stay));
    }
  }
  return cleared;
}
#endif

// scrub_line over `count` consecutive lines; returns the cells cleared.
template <unsigned Bits>
inline std::uint64_t scrub_run(std::uint8_t* line, std::uint64_t count, LiveInterval live) {
#if KDEDUP_TIMER_X86
  if constexpr (Bits == 8) {
    switch (simd_in_use()) {
      case Simd::kAvx512:
        return scrub_lines_avx512_8(line, count, live);
      case Simd::kAvx2:
        return scrub_lines_avx2_8(line, count, live);
      case Simd::kPortable:
        break;
    }
  }
#endif
  std::uint64_t cleared = 0;
  for (std::uint8_t* const stop = line + count * kLineBytes; line != stop; line += kLineBytes) {
    // Sequential, but it starts cold at every tick: fetch a few lines ahead
    // (a prefetch past the array's end is a harmless hint).
    __builtin_prefetch(line + kScrubPrefetchLines * kLineBytes, 1, 0);
    cleared += scrub_line<Bits>(line, live);
  }
  return cleared;
}

// The smallest 5-smooth number (2^a 3^b 5^c) >= n. Line counts of that form
// have divisors at every scale, so a sub-filter can fold to within a few
// percent of any smaller size (fold() needs an integer factor); the
// rounding itself costs about 2% at the usual sizes.
inline std::uint64_t smooth_ceil(std::uint64_t n) {
  std::uint64_t best = ~std::uint64_t{0};
  for (std::uint64_t p5 = 1;; p5 *= 5) {
    for (std::uint64_t p35 = p5;; p35 *= 3) {
      std::uint64_t v = p35;
      while (v < n) v *= 2;
      best = std::min(best, v);
      if (p35 >= n) break;
    }
    if (p5 >= n) break;
  }
  return best;
}

}  // namespace

// Insertions per tick over the last W + 1 ticks, in buckets of `width` ticks
// (width > 1 only for very long windows; the partly expired oldest bucket is
// still counted, which only overestimates the load).
struct WindowCount {
  std::uint64_t width = 1;
  std::vector<std::uint32_t> ring;
  std::uint64_t first = 0;  // absolute bucket index of ring's oldest bucket
  std::uint64_t sum = 0;
  std::size_t current = 0;  // ring slot of the clock's bucket

  /// Ticks per bucket for a window of `window` ticks (at most 1024 buckets).
  static std::uint64_t width_for(std::uint32_t window) {
    return std::max<std::uint64_t>(1, (std::uint64_t{window} + 1 + 1023) / 1024);
  }
  void init(std::uint32_t window) { init(window, width_for(window)); }
  /// Buckets of `bucket_width` ticks over `window` ticks.
  void init(std::uint32_t window, std::uint64_t bucket_width) {
    width = bucket_width;
    ring.assign(window / width + 2, 0);
    first = 0;
    sum = 0;
  }
  /// The oldest bucket a count over `window` ticks keeps at `now`.
  std::uint64_t first_at(Tick now, std::uint64_t window) const {
    return now >= window ? (now - window) / width : 0;
  }
  /// The ring slot of the bucket that holds `now`.
  std::size_t slot_at(Tick now) const { return (now / width) % ring.size(); }
  void advance(Tick now, std::uint32_t window) {
    current = slot_at(now);
    const std::uint64_t next = first_at(now, window);
    if (next <= first) return;
    if (next - first >= ring.size()) {
      std::fill(ring.begin(), ring.end(), 0);
      sum = 0;
    } else {
      for (std::uint64_t b = first; b < next; ++b) {
        sum -= ring[b % ring.size()];
        ring[b % ring.size()] = 0;
      }
    }
    first = next;
  }
  /// Counts `n` insertions at the tick of the last advance().
  void add(std::uint64_t n) {
    ring[current] += static_cast<std::uint32_t>(n);
    sum += n;
  }
  /// Insertions in the buckets [from, to) (absolute indices, to at most the
  /// clock's bucket + 1); buckets before `first` hold nothing any more.
  std::uint64_t sum_buckets(std::uint64_t from, std::uint64_t to) const {
    from = std::max(from, first);
    std::uint64_t total = 0;
    for (std::uint64_t b = from; b < to; ++b) total += ring[b % ring.size()];
    return total;
  }
};

struct TimerFilter::SubFilter {
  struct Free {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<std::uint8_t[], Free> data;
  std::uint64_t lines = 0;     // lines of cells held
  std::uint64_t span = 0;      // range of the line hash: lines, or up to 2x after a shrink
  Tick created = 0;            // start of the scrub schedule
  std::uint64_t swept = 0;     // lines visited since `created`
  std::uint64_t cursor = 0;    // swept % lines: the next line to visit
  Tick last_insert = 0;        // newest insertion (== created before any)
  std::uint64_t inserts = 0;   // since creation (Growth::kCardinality)
  std::uint64_t nonempty = 0;  // cells != 0
  WindowCount alive;           // insertions in the window
  double share = 1.0;          // of the target it may take (probes: kProbeShare)
  MemoryCharge charge;         // its cells in the MemoryBudget, if any
  // Expansions in place ("Growth in place" in timer_filter.h) whose copies
  // may still be alive, oldest first: an entry inserted before `tick` (a
  // multiple of the window buckets' width) is held in `factor` lines (times
  // the factors of later ones).
  struct Split {
    Tick tick = 0;
    std::uint32_t factor = 1;
  };
  std::vector<Split> splits;
  // Until this tick, a shrink waits for the echo of an expansion whose
  // copies have just expired (maybe_fold()).
  Tick echo_until = 0;

  std::uint8_t* line(std::uint64_t i) const { return data.get() + i * kLineBytes; }
  std::uint64_t bytes() const { return lines * kLineBytes; }
  // The held line of hash line v < span.
  std::uint64_t held(std::uint64_t v) const { return held_line(v, lines, span / 2); }
  // Fewer lines held than the hash range (a shrink).
  bool shrunk() const { return lines != span; }

  // Live entries in the window buckets before `to` (absolute index, at most
  // the clock's bucket + 1), each counted once per line that holds a copy of
  // it: for split i (oldest first) with P_i the product of the factors from
  // i on, an entry inserted between splits i - 1 and i is in P_i lines. A
  // split happens before the first insertion of its tick, at the start of a
  // bucket, so the entries it copied are exactly those of earlier buckets.
  double copies_before(std::uint64_t to) const {
    double n = 0;
    for (std::uint64_t b = alive.first; b < to; ++b) n += copies_in(b);
    return n;
  }
  // The entries of bucket `b`, each once per line holding a copy of it: P_i
  // for the first split i after the bucket, 1 after the last.
  double copies_in(std::uint64_t b) const {
    double m = 1;
    for (const Split& x : splits) {
      if (b < x.tick / alive.width) m *= x.factor;
    }
    return m * static_cast<double>(alive.sum_buckets(b, b + 1));
  }

  // Takes `cells`, `lines` lines over a hash range of `span`, every cell in
  // them live or empty, as if each line had just been visited: the sweep
  // continues from the schedule's position for the new size at `now`.
  void take_cells(std::unique_ptr<std::uint8_t[], Free> cells, std::uint64_t new_span,
                  std::uint64_t new_lines, Tick now, std::uint32_t period, unsigned bits) {
    data = std::move(cells);
    span = new_span;
    lines = new_lines;
    nonempty = count_nonempty(data.get(), bytes(), bits);
    swept = required(now, period);
    cursor = swept % lines;
  }

  static std::unique_ptr<SubFilter> make(std::uint64_t lines, Tick now, std::uint32_t window) {
    auto s = std::make_unique<SubFilter>();
    s->data.reset(allocate_cells(lines * kLineBytes));
    if (!s->data) return nullptr;
    s->lines = lines;
    s->span = lines;
    s->created = now;
    s->last_insert = now;
    s->alive.init(window);
    s->alive.advance(now, window);
    return s;
  }

  // Lines the schedule requires by clock c: floor((c - created) * lines / P).
  std::uint64_t required(Tick c, std::uint32_t period) const {
    if (c <= created) return 0;
    const u128 r = static_cast<u128>(c - created) * lines / period;
    return r > ~std::uint64_t{0} ? ~std::uint64_t{0} : static_cast<std::uint64_t>(r);
  }
};

}  // namespace kdedup::filter
