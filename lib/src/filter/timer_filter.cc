// Timer filter: wrapping insertion-tick timers in cache-line blocks, scrubbed
// in the background, grown and shrunk by sub-filters (seed 000 §4–5). The
// reasoning behind every constant is in timer_filter.h.

#include "kdedup/filter/timer_filter.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

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

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"
#include "kdedup/filter/simd.h"

namespace kdedup::filter {
namespace {

constexpr std::uint16_t kVersion = 1;
constexpr std::uint64_t kLineBytes = 64;
constexpr std::uint64_t kScrubPrefetchLines = 8;
constexpr std::uint32_t kMaxProbes = 16;  // k <= 64 / log2(cells per line) <= 12

__extension__ typedef unsigned __int128 u128;

std::uint64_t mulhi(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
}

constexpr unsigned log2_of(std::uint32_t v) {
  unsigned r = 0;
  while ((1U << r) < v) ++r;
  return r;
}

// Zeroed, line-aligned cell memory. Large arrays are 2 MiB aligned and asked
// to use transparent huge pages: every operation touches a random line, and
// with 4 KiB pages nearly every one would also miss the TLB.
std::uint8_t* allocate_cells(std::uint64_t bytes) {
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
std::uint64_t count_nonempty(const std::uint8_t* data, std::uint64_t bytes, unsigned bits) {
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
LiveInterval live_interval(std::uint32_t code, std::uint32_t max_age, std::uint32_t m) {
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
bool enough_equal(const std::uint8_t* line, const std::uint32_t* pos, std::uint32_t k,
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
std::uint32_t sum_bytes(U8x16 v) {
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
std::uint32_t scrub_line(std::uint8_t* line, LiveInterval live) {
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
KDEDUP_AVX512_TARGET std::uint64_t scrub_lines_avx512_8(std::uint8_t* line, std::uint64_t count,
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
KDEDUP_AVX2_TARGET std::uint64_t scrub_lines_avx2_8(std::uint8_t* line, std::uint64_t count,
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
std::uint64_t scrub_run(std::uint8_t* line, std::uint64_t count, LiveInterval live) {
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

  void init(std::uint32_t window) {
    width = std::max<std::uint64_t>(1, (std::uint64_t{window} + 1 + 1023) / 1024);
    ring.assign(window / width + 2, 0);
    first = 0;
    sum = 0;
  }
  void advance(Tick now, std::uint32_t window) {
    current = (now / width) % ring.size();
    const std::uint64_t next = now >= window ? (now - window) / width : 0;
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
  std::uint64_t lines = 0;
  Tick created = 0;            // start of the scrub schedule
  std::uint64_t swept = 0;     // lines visited since `created`
  std::uint64_t cursor = 0;    // swept % lines: the next line to visit
  Tick last_insert = 0;        // newest insertion (== created before any)
  std::uint64_t inserts = 0;   // since creation (Growth::kCardinality)
  std::uint64_t nonempty = 0;  // cells != 0
  WindowCount alive;           // insertions in the window
  double share = 1.0;          // of the target it may take (probes: kProbeShare); not serialized
  MemoryCharge charge;         // its cells in the MemoryBudget, if any

  std::uint8_t* line(std::uint64_t i) const { return data.get() + i * kLineBytes; }
  std::uint64_t bytes() const { return lines * kLineBytes; }

  static std::unique_ptr<SubFilter> make(std::uint64_t lines, Tick now, std::uint32_t window) {
    auto s = std::make_unique<SubFilter>();
    s->data.reset(allocate_cells(lines * kLineBytes));
    if (!s->data) return nullptr;
    s->lines = lines;
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

TimerFilter::TimerFilter(const FilterConfig& config) : config_(config) {}
TimerFilter::~TimerFilter() = default;

Result<std::unique_ptr<TimerFilter>> TimerFilter::make_empty(const FilterConfig& config) {
  if (config.type != FilterType::kTimer) return fail("timer filter: config type is not timer");
  if (config.ticks_per_window == 0 ||
      config.ticks_per_window > max_timer_ticks_per_window(config.timer_bits)) {
    return fail("timer filter: ticks_per_window " + std::to_string(config.ticks_per_window) +
                " out of range for " + std::to_string(config.timer_bits) + "-bit timers");
  }
  std::unique_ptr<TimerFilter> f(new TimerFilter(config));
  f->cells_per_line_ = 512 / config.timer_bits;
  f->modulus_ = static_cast<std::uint32_t>((1U << config.timer_bits) - 1);
  f->period_ = f->modulus_ - 2 - config.ticks_per_window;  // P = G - 1 >= 1
  const std::uint32_t max_k = 64 / log2_of(f->cells_per_line_);
  const auto layout = sizing::choose_layout(f->cells_per_line_, kBudgetShare * config.fpp, max_k);
  if (layout.k == 0 || !(layout.elements_per_block > 0)) {
    return fail("timer filter: no layout reaches fpp " + std::to_string(config.fpp));
  }
  f->k_ = layout.k;
  f->model_ = sizing::BlockedModel::get(f->cells_per_line_, f->k_);
  f->target_ = config.fpp;
  f->lambda_full_ = layout.elements_per_block;
  if (config.equal_timers > f->k_) {
    return fail("equal_timers (" + std::to_string(config.equal_timers) +
                ") must not exceed the number of probes k = " + std::to_string(f->k_) +
                " chosen for fpp " + std::to_string(config.fpp));
  }
  return f;
}

Result<std::unique_ptr<TimerFilter>> TimerFilter::create(const FilterConfig& config) {
  auto made = make_empty(config);
  if (!made) return tl::unexpected(made.error());
  std::unique_ptr<TimerFilter> f = std::move(*made);
  const std::uint64_t lines = f->initial_bytes() / kLineBytes;
  auto sub = f->new_subfilter(lines, true);
  if (!sub) return fail("timer filter: cannot allocate " + std::to_string(lines * 64) + " bytes");
  // Sized without any measured rate: a probe (see "Dynamic size").
  sub->share = kProbeShare;
  f->subs_.push_back(std::move(sub));
  f->refresh_threshold();
  return f;
}

Result<std::unique_ptr<TimerFilter>> TimerFilter::create_presized(const FilterConfig& config) {
  auto made = make_empty(config);
  if (!made) return tl::unexpected(made.error());
  std::unique_ptr<TimerFilter> f = std::move(*made);
  const std::uint64_t lines = f->presized_bytes() / kLineBytes;
  auto sub = f->new_subfilter(lines, true);
  if (!sub) return fail("timer filter: cannot allocate " + std::to_string(lines * 64) + " bytes");
  f->subs_.push_back(std::move(sub));
  f->refresh_threshold();
  return f;
}

std::uint64_t TimerFilter::presized_bytes() const noexcept {
  const double lines = std::ceil(static_cast<double>(config_.capacity) / lambda_full_);
  const double max_lines = static_cast<double>(std::max<std::uint64_t>(1, config_.max_bytes / 64));
  return static_cast<std::uint64_t>(std::clamp(lines, 1.0, max_lines)) * kLineBytes;
}

std::uint64_t TimerFilter::floor_lines() const noexcept {
  return std::max<std::uint64_t>(1, config_.min_bytes / kLineBytes);
}

std::uint64_t TimerFilter::initial_bytes() const noexcept {
  // The hint may start the filter below the floor, never above it.
  return std::min(presized_bytes() / kLineBytes, floor_lines()) * kLineBytes;
}

namespace {

// The smallest 5-smooth number (2^a 3^b 5^c) >= n. Line counts of that form
// have divisors at every scale, so a sub-filter can fold to within a few
// percent of any smaller size (fold() needs an integer factor); the
// rounding itself costs about 2% at the usual sizes.
std::uint64_t smooth_ceil(std::uint64_t n) {
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

std::uint64_t TimerFilter::lines_for(double elements, double lambda) const {
  const double min_lines = static_cast<double>(floor_lines());
  const double max_lines = std::max(min_lines, static_cast<double>(config_.max_bytes / kLineBytes));
  double lines = lambda > 0 ? std::ceil(elements / lambda) : max_lines;
  lines = std::clamp(lines, min_lines, max_lines);
  if (lines > static_cast<double>(kFoldGrain)) {
    // kFoldGrain x a 5-smooth number: divisors at every scale.
    const double smooth = static_cast<double>(
        kFoldGrain * smooth_ceil(static_cast<std::uint64_t>(std::ceil(lines / kFoldGrain))));
    if (smooth <= max_lines) lines = smooth;
  }
  return static_cast<std::uint64_t>(lines);
}

std::unique_ptr<TimerFilter::SubFilter> TimerFilter::new_subfilter(std::uint64_t lines,
                                                                   bool required,
                                                                   std::uint64_t least) {
  std::uint64_t bytes = lines * kLineBytes;
  MemoryCharge charge;
  if (budget_) {
    if (required) {
      budget_->charge(bytes);
    } else {
      // What is left of the budget, if less than asked for (a smaller
      // sub-filter fills sooner and asks again), before any fpp is raised.
      least = std::min(least == 0 ? lines : least, lines);
      const std::uint64_t granted = budget_->reserve_up_to(least * kLineBytes, bytes);
      if (granted == 0) return nullptr;
      std::uint64_t fit = granted / kLineBytes;
      if (fit > kFoldGrain) fit = fit / kFoldGrain * kFoldGrain;  // can still fold by 2, 4, 8
      fit = std::max(fit, least);
      if (fit * kLineBytes < granted) budget_->release(granted - fit * kLineBytes);
      lines = fit;
      bytes = fit * kLineBytes;
    }
    charge = MemoryCharge(budget_, bytes);
  }
  auto s = SubFilter::make(lines, clock_, config_.ticks_per_window);
  if (s) s->charge = std::move(charge);
  return s;  // null: out of memory (the charge went with it)
}

void TimerFilter::set_memory_budget(std::shared_ptr<MemoryBudget> budget) {
  budget_ = std::move(budget);
  demand_ = MemoryDemand(budget_);
  // Load per line at kBudgetShare of each level's target (publish_demand).
  level_lambda_.clear();
  for (std::uint32_t l = 0; l < demand_.levels(); ++l) {
    level_lambda_.push_back(model_->lambda_for(
        kBudgetShare * filter::effective_fpp(config_.fpp, std::ldexp(1.0, static_cast<int>(l)))));
  }
  for (auto& s : subs_) {
    s->charge = MemoryCharge();
    if (budget_) {
      budget_->charge(s->bytes());
      s->charge = MemoryCharge(budget_, s->bytes());
    }
  }
  budget_level_ = budget_ ? budget_->level() : 0;
  level_since_ = clock_;
  set_target(filter::effective_fpp(config_.fpp, std::ldexp(1.0, static_cast<int>(budget_level_))));
  refresh_threshold();
}

std::uint32_t TimerFilter::budget_vote() const noexcept {
  const double settle = MemoryBudget::kSettleShare * config_.ticks_per_window;
  return static_cast<double>(clock_ - level_since_) >= std::max(1.0, settle) ? budget_level_
                                                                             : MemoryBudget::kHold;
}

void TimerFilter::observe_budget() {
  if (!budget_) return;
  budget_->settle(budget_vote());  // the load may have fallen
  const std::uint32_t level = budget_->level();
  if (level == budget_level_) return;
  budget_level_ = level;
  level_since_ = clock_;
  set_target(filter::effective_fpp(config_.fpp, std::ldexp(1.0, static_cast<int>(level))));
}

void TimerFilter::publish_demand() {
  if (level_lambda_.empty()) return;
  // What the window holds, or brings at the current rate if more, with the
  // headroom a new sub-filter gets, at each level's load per line.
  const std::uint32_t window = config_.ticks_per_window;
  const auto horizon =
      static_cast<Tick>(std::max(1.0, std::ceil(kFoldHorizonShare * static_cast<double>(window))));
  const double rate = std::max(0.0, recent_rate(horizon));
  // A saturated filter inserts only the share of new identities it does not
  // mistake for duplicates: what arrives is what it inserted / (1 - fpp).
  const double missed = 1.0 - std::min(0.5, fpp_budget_used());
  const double holds =
      kGrowthHeadroom *
      std::max(static_cast<double>(alive_total()), rate * static_cast<double>(window + 1)) / missed;
  demand_bytes_.resize(level_lambda_.size());
  for (std::size_t l = 0; l < level_lambda_.size(); ++l) {
    const auto lines = static_cast<std::uint64_t>(std::ceil(holds / level_lambda_[l]));
    demand_bytes_[l] = std::max(lines, floor_lines()) * kLineBytes;
  }
  demand_.publish(demand_bytes_);
}

void TimerFilter::set_target(double fpp) {
  if (fpp == target_) return;
  target_ = fpp;
  lambda_full_ = model_->lambda_for(kBudgetShare * fpp);
}

double TimerFilter::subfilter_fpp(const SubFilter& s) const {
  return model_->fpp(static_cast<double>(s.alive.sum) / static_cast<double>(s.lines));
}

std::uint64_t TimerFilter::alive_total() const {
  std::uint64_t n = 0;
  for (const auto& s : subs_) n += s->alive.sum;
  return n;
}

double TimerFilter::fpp_budget_used() const {
  double sum = 0;
  for (const auto& s : subs_) sum += subfilter_fpp(*s);
  return sum;
}

double TimerFilter::active_lambda() const {
  const SubFilter& active = *subs_.back();
  // The common case (one sub-filter at its full share) needs no solve: this
  // runs every tick.
  if (subs_.size() == 1 && active.share >= 1.0) return lambda_full_;
  double sealed = 0;
  for (std::size_t i = 0; i + 1 < subs_.size(); ++i) sealed += subfilter_fpp(*subs_[i]);
  const double budget = kBudgetShare * std::min(target_ - sealed, active.share * target_);
  return budget > 0 ? model_->lambda_for(budget) : 0.0;
}

void TimerFilter::refresh_threshold() {
  active_limit_ =
      static_cast<std::uint64_t>(active_lambda() * static_cast<double>(subs_.back()->lines));
  refresh_view();
}

template <unsigned Bits>
void TimerFilter::scrub_lines(SubFilter& s, std::uint64_t count, Tick ref,
                              std::uint64_t extra_age) {
  // A cell's true age is ((code(ref) - code) mod M) + extra_age: exact as long
  // as no cell had aliased at `ref` (the scrub invariant).
  const std::uint32_t m = modulus_;
  const std::uint32_t ref_code = static_cast<std::uint32_t>(ref % m) + 1;
  const std::uint64_t window = config_.ticks_per_window;
  std::uint64_t i = s.cursor;
  if (extra_age > window) {
    // Everything visited is dead (move_clock clears the whole filter instead,
    // but the scrub stays correct on its own).
    for (std::uint64_t n = 0; n < count; ++n, i = i + 1 == s.lines ? 0 : i + 1) {
      s.nonempty -= count_nonempty(s.line(i), kLineBytes, Bits);
      std::memset(s.line(i), 0, kLineBytes);
    }
  } else {
    // Kept: the empty cells and those of ages 0 .. W - extra_age at `ref`.
    const LiveInterval live =
        live_interval(ref_code, static_cast<std::uint32_t>(window - extra_age), m);
    std::uint64_t cleared = 0;
    // In contiguous segments (the sweep wraps at the end of the array).
    for (std::uint64_t left = count; left > 0;) {
      const std::uint64_t run = std::min(left, s.lines - i);
      cleared += scrub_run<Bits>(s.line(i), run, live);
      left -= run;
      i = i + run == s.lines ? 0 : i + run;
    }
    s.nonempty -= cleared;
  }
  s.swept += count;
  s.cursor = i;
}

void TimerFilter::catch_up(SubFilter& s, Tick old_clock, Tick now) {
  // The whole scrub runs here, when the clock moves: by clock `now` the
  // schedule requires required(now) lines, and visiting them in one sweep per
  // tick costs fewer instructions than one line per insert (the insert path
  // carries no scrub state at all).
  const std::uint64_t need = s.required(now, period_);
  if (need <= s.swept) return;
  const std::uint64_t todo = std::min(need - s.swept, s.lines);
  switch (config_.timer_bits) {
    case 4:
      scrub_lines<4>(s, todo, old_clock, now - old_clock);
      break;
    case 8:
      scrub_lines<8>(s, todo, old_clock, now - old_clock);
      break;
    default:
      scrub_lines<16>(s, todo, old_clock, now - old_clock);
      break;
  }
  if (need > s.swept) {  // a jump longer than one sweep: every line was visited once
    s.swept = need;
    s.cursor = need % s.lines;
  }
}

void TimerFilter::clear_all(Tick now) {
  // Every entry was inserted at or before the old clock, more than W ago:
  // nothing is alive, so the filter returns to its floor (a pause longer
  // than the window frees what the last load needed).
  history_from_ = now;
  SubFilter& active = *subs_.back();
  if (active.lines > floor_lines()) {
    clock_ = now;  // the new sub-filter's creation tick
    if (auto sub = new_subfilter(floor_lines(), true)) {
      sub->share = kProbeShare;
      subs_.clear();
      subs_.push_back(std::move(sub));
      return;
    }
    // Out of memory even for the floor: empty the active in place.
  }
  std::memset(active.data.get(), 0, active.bytes());
  active.nonempty = 0;
  active.swept = 0;
  active.cursor = 0;
  active.created = now;
  active.inserts = 0;
  active.alive.init(config_.ticks_per_window);
  active.alive.advance(now, config_.ticks_per_window);
  std::unique_ptr<SubFilter> keep = std::move(subs_.back());
  subs_.clear();
  subs_.push_back(std::move(keep));
}

// noinline: kept out of the flattened vector batch loops (vector_probe).
[[gnu::noinline]] void TimerFilter::move_clock(Tick now) {
  const Tick old = clock_;
  const std::uint32_t window = config_.ticks_per_window;
  if (now - old > window) {
    clear_all(now);
    clock_ = now;
  } else {
    for (auto& s : subs_) catch_up(*s, old, now);
    clock_ = now;
    for (auto& s : subs_) s->alive.advance(now, window);
    // Free sealed sub-filters whose newest insertion left the window.
    const SubFilter* active = subs_.back().get();
    std::erase_if(subs_, [&](const std::unique_ptr<SubFilter>& s) {
      return s.get() != active && (s->inserts == 0 || now - s->last_insert > window);
    });
  }
  tick_inserts_ = 0;
  overfull_ = false;
  observe_budget();
  maybe_fold();
  publish_demand();
  refresh_threshold();  // and the view
  std::uint64_t held = 0;
  for (const auto& s : subs_) held += s->bytes();
  peak_bytes_ = std::max(peak_bytes_, held);
}

void TimerFilter::refresh_view() {
  TickView& v = view_;
  v.count = static_cast<std::uint32_t>(subs_.size());
  for (std::size_t i = 0; i < subs_.size(); ++i) {
    const SubFilter& s = *subs_[subs_.size() - 1 - i];
    v.subs[i] = {s.data.get(), s.lines};
  }
  v.k = k_;
  v.equal = config_.equal_timers;
  // The insert path needs these for every operation; a division per op (the
  // modulus is a runtime value) cost more than the rest of the age test.
  v.now_code = static_cast<std::uint32_t>(clock_ % modulus_) + 1;
  const LiveInterval live = live_interval(v.now_code, config_.ticks_per_window, modulus_);
  v.live_lo = live.lo;
  v.live_span = live.span;
  if (config_.timer_bits <= 8) {
    // Alive: the live.span + 1 codes from live.lo on, modulo 2^b (with 0,
    // empty, inside them when the interval wraps).
    auto& c = v.code_class;
    std::fill(c.begin(), c.end(), std::uint8_t{0});
    const std::uint32_t codes = modulus_ + 1;  // 2^b
    const std::uint32_t end = live.lo + live.span + 1;
    std::fill(c.begin() + live.lo, c.begin() + std::min(end, codes), kClassAlive);
    if (end > codes) std::fill(c.begin(), c.begin() + (end - codes), kClassAlive);
    c[0] = kClassEmpty;
  }
  const SubFilter& a = *subs_.back();
  const std::uint64_t held =
      config_.growth == Growth::kCardinality ? std::max(a.alive.sum, a.inserts) : a.alive.sum;
  v.room = overfull_ ? ~std::uint64_t{0} : active_limit_ > held ? active_limit_ - held : 0;
}

void TimerFilter::commit_inserts(std::uint64_t n, std::uint64_t filled) {
  if (n == 0) return;
  SubFilter& a = *subs_.back();
  a.alive.add(n);
  a.inserts += n;
  a.nonempty += filled;
  a.last_insert = clock_;
  if (insertions_ == 0) first_tick_ = clock_;
  insertions_ += n;
  tick_inserts_ += n;
  view_.room = view_.room > n ? view_.room - n : 0;
}

void TimerFilter::advance(Tick now) {
  if (now > clock_) move_clock(now);
}

double TimerFilter::recent_rate(Tick horizon) const {
  if (insertions_ == 0) return -1;
  const Tick from = std::max({first_tick_, history_from_, clock_ > horizon ? clock_ - horizon : 0});
  const std::uint64_t width = subs_.back()->alive.width;
  // Whole buckets strictly before the clock's (the current one is partial).
  const std::uint64_t b_from = (from + width - 1) / width, b_to = clock_ / width;
  if (b_to <= b_from) return -1;
  std::uint64_t n = 0;
  for (const auto& s : subs_) n += s->alive.sum_buckets(b_from, b_to);
  return static_cast<double>(n) / static_cast<double>((b_to - b_from) * width);
}

TimerFilter::GrowthTarget TimerFilter::growth_target() const {
  // Rate extrapolation (see "Dynamic size" in the header): the larger of the
  // rates over the last W / 8 and W / 32 complete ticks, so that a rising
  // load is seen within a few ticks, and never less than this tick so far.
  // What the window holds bounds it: kMaxGrowthStep times the window's
  // content, projected over a whole window while the history is shorter
  // (at most kMaxProjection times). Beyond that bound, or with no complete
  // tick yet, growth is geometric; a young filter's geometric steps are
  // probes.
  constexpr double kMaxProjection = 8.0;
  const SubFilter& active = *subs_.back();
  const std::uint32_t window = config_.ticks_per_window;
  const double held = static_cast<double>(std::max<std::uint64_t>(
      1, config_.growth == Growth::kCardinality ? active.inserts : active.alive.sum));
  const double holds = std::max(held, static_cast<double>(alive_total()));
  const auto horizon = static_cast<Tick>(
      std::max(1.0, std::ceil(kGrowthHorizonShare * static_cast<double>(window))));
  const double rate = std::max(recent_rate(horizon), recent_rate((horizon + 3) / 4));
  if (rate < 0) return {kMaxGrowthStep * holds, true};
  const Tick history = clock_ - std::max(first_tick_, history_from_);
  const double projection =
      std::min(kMaxProjection, std::max(1.0, static_cast<double>(window + 1) /
                                                 static_cast<double>(std::max<Tick>(1, history))));
  const double bound = kMaxGrowthStep * holds * projection;
  const double want = kGrowthHeadroom * std::max(rate, static_cast<double>(tick_inserts_)) *
                      static_cast<double>(window + 1);
  if (want <= bound) return {std::max(1.0, want), false};
  // A young filter's probe holds a few times what the window holds now (no
  // projection): it lives a window, and the next one will know the rate.
  if (history < horizon) return {kMaxGrowthStep * holds, true};
  return {bound, false};
}

void TimerFilter::seal_and_grow() {
  if (subs_.size() >= kMaxSubfilters) {
    overfull_ = true;  // until the next tick
    view_.room = ~std::uint64_t{0};
    return;
  }
  const GrowthTarget want = growth_target();
  const double free = target_ - fpp_budget_used();  // the active is about to be sealed
  // A probe is sized for its own small share; a rate-sized sub-filter for
  // the share it will have once the sealed ones' entries expire (header).
  const double share =
      want.probe ? std::min(free, kProbeShare * target_) : std::max(free, kPlanShare * target_);
  const double lambda = model_->lambda_for(kBudgetShare * (share > 0 ? share : 1e-3 * target_));
  std::uint64_t lines = lines_for(want.elements, lambda);
  if (!demand_bytes_.empty() && budget_->demand(0) > budget_->max_bytes()) {
    // Over budget, each filter holds at most its share of it, in proportion
    // to what it needs at the target (so every partition's fpp rises alike):
    // the room freed as sub-filters expire goes to the partitions that need
    // it, not to the first to ask.
    const double part = static_cast<double>(budget_->max_bytes()) *
                        static_cast<double>(demand_bytes_.front()) /
                        static_cast<double>(budget_->demand(0));
    double held = 0;
    for (const auto& s : subs_) held += static_cast<double>(s->bytes());
    const double room = std::max(0.0, part - held) / kLineBytes;
    lines = std::max(floor_lines(), std::min(lines, static_cast<std::uint64_t>(room)));
  }
  // Take no less than a quarter of what it asks for: sub-filters much
  // smaller than the rate needs fill at once, and each sealed one takes a
  // share of the fpp budget; overfilling the active until the next tick
  // costs less.
  auto sub = new_subfilter(lines, false, std::max(floor_lines(), lines / 4));
  if (!sub) {
    // The budget refused (or memory ran out): keep inserting into the active
    // until the next tick, when growth is asked for again.
    overfull_ = true;
    view_.room = ~std::uint64_t{0};
    return;
  }
  if (want.probe) sub->share = kProbeShare;
  subs_.push_back(std::move(sub));
  refresh_threshold();
}

void TimerFilter::maybe_fold() {
  // Runs at every tick: the usual answer (a sub-filter sized for what it
  // holds) comes from a few compares, before any rate is computed.
  SubFilter& a = *subs_.back();
  const std::uint64_t floor = floor_lines();
  if (a.lines <= floor) return;
  if (config_.growth == Growth::kDensity &&
      static_cast<double>(a.lines) * lambda_full_ <
          2 * kFoldHeadroom * static_cast<double>(a.alive.sum)) {
    return;  // it holds more than half of what it can: no fold is possible
  }
  const std::uint32_t window = config_.ticks_per_window;
  const auto horizon =
      static_cast<Tick>(std::max(1.0, std::ceil(kFoldHorizonShare * static_cast<double>(window))));
  // A young sub-filter's rate is still being learned (and it was just sized).
  if (clock_ - a.created < horizon) return;
  if (a.alive.sum == 0 && config_.growth == Growth::kDensity) {
    // Nothing in it is alive (a quiet partition, a restored snapshot whose
    // entries have expired): back to the floor, whatever its line count.
    if (auto sub = new_subfilter(floor, true)) {
      sub->share = kProbeShare;
      subs_.back() = std::move(sub);
    }
    return;
  }
  if (a.lines < 2 * floor) return;
  const double rate = recent_rate(horizon);
  if (rate < 0) return;
  if (config_.growth == Growth::kCardinality) {
    // Cardinality growth never forgets an insertion (seed 000 §5), so its
    // active cannot fold (its count would pass the limit at once): a lone
    // active twice what the rate needs is sealed and replaced by a
    // rate-sized one instead, and leaves a window later.
    const double want = kGrowthHeadroom * rate * static_cast<double>(window + 1);
    if (subs_.size() != 1 || a.lines < 2 * lines_for(want, lambda_full_)) return;
    const double share = std::max(target_ - fpp_budget_used(), kPlanShare * target_);
    auto sub = new_subfilter(lines_for(want, model_->lambda_for(kBudgetShare * share)), false);
    if (sub) subs_.push_back(std::move(sub));
    return;
  }
  const double lambda = active_lambda();
  if (!(lambda > 0)) return;
  const double content = static_cast<double>(a.alive.sum);
  const double turnover = rate * static_cast<double>(window + 1);
  const auto need = std::max(
      floor,
      static_cast<std::uint64_t>(std::ceil(kFoldHeadroom * std::max(content, turnover) / lambda)));
  // Fold once the window has turned over at the current rate: what it holds
  // is what the rate brings, so the need is final and one fold lands close
  // to it (an earlier fold could land on a line count without a divisor
  // near the final need).
  if (content > kSettled * turnover) return;
  // The smallest divisor L' of the line count with L' >= need: fold by L / L'.
  std::uint64_t best = a.lines;
  if (a.lines >= 2 * need) {
    for (std::uint64_t d = 1; d * d <= a.lines; ++d) {
      if (a.lines % d != 0) continue;
      for (const std::uint64_t c : {d, a.lines / d}) {
        if (c >= need && c < best) best = c;
      }
    }
  }
  if (best > a.lines / 2) {
    // Too little to fold by an integer factor (less than 2x, or no divisor):
    // a lone active more than 1.5x what the rate needs is replaced by a
    // rate-sized one (it leaves a window later), as long as the two together
    // stay within what the filter already held at its peak.
    if (subs_.size() != 1) return;
    const double want = kGrowthHeadroom * turnover;
    if (2 * a.lines < 3 * lines_for(want, lambda_full_)) return;
    const double share = std::max(target_ - fpp_budget_used(), kPlanShare * target_);
    const std::uint64_t lines = lines_for(want, model_->lambda_for(kBudgetShare * share));
    if ((a.lines + lines) * kLineBytes > peak_bytes_) return;
    if (auto sub = new_subfilter(lines, false)) subs_.push_back(std::move(sub));
    return;
  }
  const std::uint64_t factor = a.lines / best;
  switch (config_.timer_bits) {
    case 4:
      fold<4>(a, factor);
      break;
    case 8:
      fold<8>(a, factor);
      break;
    default:
      fold<16>(a, factor);
      break;
  }
}

template <unsigned Bits>
void TimerFilter::fold(SubFilter& s, std::uint64_t factor) {
  // New line j merges old lines j * factor .. j * factor + factor - 1: per
  // cell the youngest live code (dead codes read as empty). Live codes are
  // ordered by age as (v - lo) mod 2^b over the live interval (see "Age
  // test"), so the youngest is the largest key.
  const std::uint64_t lines = s.lines / factor;
  std::unique_ptr<std::uint8_t[], SubFilter::Free> data(allocate_cells(lines * kLineBytes));
  if (!data) return;  // no memory for the smaller copy: stay as is
  const std::uint32_t now_code = static_cast<std::uint32_t>(clock_ % modulus_) + 1;
  const LiveInterval live = live_interval(now_code, config_.ticks_per_window, modulus_);
  const std::uint32_t mask = modulus_;  // 2^b - 1
  auto key = [&](std::uint32_t v) -> std::uint32_t {
    if (v == 0) return 0;
    const std::uint32_t offset = (v - live.lo) & mask;
    return offset <= live.span ? offset + 1 : 0;
  };
  std::uint64_t nonempty = 0;
  for (std::uint64_t j = 0; j < lines; ++j) {
    std::uint8_t* out = data.get() + j * kLineBytes;
    for (std::uint32_t c = 0; c < Cells<Bits>::kPerLine; ++c) {
      std::uint32_t best = 0, best_key = 0;
      for (std::uint64_t i = 0; i < factor; ++i) {
        const std::uint32_t v = Cells<Bits>::get(s.line(j * factor + i), c);
        const std::uint32_t k = key(v);
        if (k > best_key) {
          best_key = k;
          best = v;
        }
      }
      if (best != 0) {
        Cells<Bits>::set(out, c, best);
        ++nonempty;
      }
    }
  }
  s.data = std::move(data);
  s.lines = lines;
  s.nonempty = nonempty;
  // Every cell is now live or empty, as if each line had just been visited:
  // the sweep continues from the schedule's position for the new size.
  s.swept = s.required(clock_, period_);
  s.cursor = s.swept % lines;
  s.charge.resize(lines * kLineBytes);
}

namespace {

// The line of `fp` in one sub-filter (multiply-high range reduction).
inline std::uint8_t* line_of(const std::uint64_t hi, std::uint8_t* data, std::uint64_t lines) {
  return data + mulhi(hi, lines) * kLineBytes;
}

// Outcome of probe_once.
enum class Probe : std::uint8_t {
  kDuplicate,  ///< all k cells alive in some sub-filter: nothing written
  kInserted,   ///< distinct: the k cells of the active line now hold the clock's code
  kNeedSeal,   ///< distinct, but the active sub-filter is full: nothing written
};

// One test-and-insert against a TickView (first-test-then-set, seed 000 §4).
// `inserted` is how many inserts the caller has made into the active
// sub-filter since `view` was taken; on kInserted, `filled` is the number of
// cells that were empty before the write.
template <unsigned Bits, unsigned K>
[[gnu::always_inline]] inline Probe probe_once(const auto& view, const Fingerprint& fp,
                                               std::uint64_t inserted, std::uint32_t& filled) {
  // K != 0: the probe count as a compile-time constant, so that every loop
  // over the k cells unrolls and the positions stay in registers.
  const std::uint32_t k = K != 0 ? K : view.k;
  std::uint32_t pos[kMaxProbes];
  probe_positions<Cells<Bits>::kPerLine, K>(fp.lo, k, pos);
  // Newest sub-filter first: it holds the most recent, most often repeated ids.
  std::uint8_t* active = line_of(fp.hi, view.subs[0].data, view.subs[0].lines);
  std::uint32_t empty = 0;
  if (all_alive<Bits>(active, pos, k, view, empty) &&
      (view.equal == 0 || enough_equal<Bits>(active, pos, k, view.equal))) {
    return Probe::kDuplicate;
  }
  for (std::uint32_t s = 1; s < view.count; ++s) {
    const std::uint8_t* line = line_of(fp.hi, view.subs[s].data, view.subs[s].lines);
    std::uint32_t unused;
    if (all_alive<Bits>(line, pos, k, view, unused) &&
        (view.equal == 0 || enough_equal<Bits>(line, pos, k, view.equal))) {
      return Probe::kDuplicate;
    }
  }
  if (inserted >= view.room) return Probe::kNeedSeal;
  // Distinct: insert into the active sub-filter (first-test-then-set).
  write_code<Bits>(active, pos, k, view.now_code);
  filled = empty;
  return Probe::kInserted;
}

// insert(): writes the clock's code into the k cells of the active line
// without testing them first (the identity was delivered: its lifetime
// starts now, whatever older cells say). kNeedSeal when the active is full.
template <unsigned Bits>
inline Probe write_once(const auto& view, const Fingerprint& fp, std::uint64_t inserted,
                        std::uint32_t& filled) {
  if (inserted >= view.room) return Probe::kNeedSeal;
  std::uint32_t pos[kMaxProbes];
  probe_positions<Cells<Bits>::kPerLine, 0>(fp.lo, view.k, pos);
  std::uint8_t* active = line_of(fp.hi, view.subs[0].data, view.subs[0].lines);
  filled = 0;
  for (std::uint32_t i = 0; i < view.k; ++i) filled += Cells<Bits>::get(active, pos[i]) == 0;
  write_code<Bits>(active, pos, view.k, view.now_code);
  return Probe::kInserted;
}

// The portable probe: probe_once.
template <unsigned Bits, unsigned K>
struct PortableProbe {
  [[gnu::always_inline]] static inline Probe run(const auto& view, const Fingerprint& fp,
                                                 std::uint64_t inserted, std::uint32_t& filled) {
    return probe_once<Bits, K>(view, fp, inserted, filled);
  }
};

#if KDEDUP_TIMER_X86
// The k probe cells of a 64-cell line as a bit mask (the cells of
// probe_positions: the raw 6-bit fields when distinct, else the slow path).
template <unsigned K>
[[gnu::always_inline]] inline std::uint64_t probe_mask64(std::uint64_t h, std::uint32_t k) {
  if (K != 0) k = K;
  std::uint64_t mask = 0;
#pragma GCC unroll 16
  for (std::uint32_t i = 0; i < k; ++i) mask |= std::uint64_t{1} << ((h >> (6 * i)) & 63);
  if (static_cast<std::uint32_t>(std::popcount(mask)) != k) [[unlikely]] {
    std::uint32_t pos[kMaxProbes];
    resolve_positions<64, K>(h, k, pos);
    mask = 0;
    for (std::uint32_t i = 0; i < k; ++i) mask |= std::uint64_t{1} << pos[i];
  }
  return mask;
}

// probe_once<8, K> without equal timers, on vectors, for either instruction
// set: the k positions are a 64-bit mask, `Line` reads the line into
// registers with the masks of its set and live cells (a few instructions for
// the whole line), and writes the clock's code into the probe cells in one
// go. Same outcome and the same bytes written as probe_once<8, K>. The run()
// functions below carry the instruction set's target; they cannot be
// always_inline (the run loop that calls them has the baseline target), so
// decide_batch_avx2/avx512 are flattened: everything they call is inlined
// into them, except move_clock and decide (noinline: cold, and large).
template <class Line, unsigned K>
[[gnu::always_inline]] inline Probe vector_probe(const auto& view, const Fingerprint& fp,
                                                 std::uint64_t inserted, std::uint32_t& filled) {
  const std::uint64_t want = probe_mask64<K>(fp.lo, view.k);
  const typename Line::Codes codes(view.live_lo, view.live_span);
  std::uint8_t* active = line_of(fp.hi, view.subs[0].data, view.subs[0].lines);
  const Line a(active, codes);
  if ((a.live & want) == want) return Probe::kDuplicate;
  for (std::uint32_t s = 1; s < view.count; ++s) {
    const Line other(line_of(fp.hi, view.subs[s].data, view.subs[s].lines), codes);
    if ((other.live & want) == want) return Probe::kDuplicate;
  }
  if (inserted >= view.room) return Probe::kNeedSeal;
  a.write(active, want, view.now_code);
  filled = static_cast<std::uint32_t>(std::popcount(want & ~a.set));
  return Probe::kInserted;
}

// A line of 8-bit timers on AVX-512: one register; a masked store writes.
struct Avx512Line {
  struct Codes {
    __m512i lo, span;
    KDEDUP_AVX512_TARGET Codes(std::uint32_t l, std::uint32_t s)
        : lo(_mm512_set1_epi8(static_cast<char>(l))),
          span(_mm512_set1_epi8(static_cast<char>(s))) {}
  };
  __m512i x;
  std::uint64_t set;   // cells != 0
  std::uint64_t live;  // set cells whose code is in the live interval

  KDEDUP_AVX512_TARGET Avx512Line(const std::uint8_t* line, const Codes& c)
      : x(_mm512_load_si512(line)),
        set(_mm512_test_epi8_mask(x, x)),
        live(_mm512_cmple_epu8_mask(_mm512_sub_epi8(x, c.lo), c.span) & set) {}
  KDEDUP_AVX512_TARGET void write(std::uint8_t* line, std::uint64_t cells,
                                  std::uint32_t code) const {
    _mm512_mask_storeu_epi8(line, cells, _mm512_set1_epi8(static_cast<char>(code)));
  }
};

KDEDUP_AVX2_TARGET inline std::uint64_t movemask64(__m256i low, __m256i high) {
  return static_cast<std::uint32_t>(_mm256_movemask_epi8(low)) |
         std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_epi8(high))} << 32;
}

// All-ones in the byte lanes whose bit is set in `bits` (32 cells): each
// byte of `bits` is copied into 8 lanes and tested against one bit each.
KDEDUP_AVX2_TARGET inline __m256i byte_mask_avx2(std::uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i select = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, select), select);
}

// A line of 8-bit timers on AVX2: two registers; written back whole, the
// probe cells blended in.
struct Avx2Line {
  struct Codes {
    __m256i lo, span;
    KDEDUP_AVX2_TARGET Codes(std::uint32_t l, std::uint32_t s)
        : lo(_mm256_set1_epi8(static_cast<char>(l))),
          span(_mm256_set1_epi8(static_cast<char>(s))) {}
  };
  __m256i x0, x1;
  std::uint64_t set;   // cells != 0
  std::uint64_t live;  // set cells whose code is in the live interval

  KDEDUP_AVX2_TARGET Avx2Line(const std::uint8_t* line, const Codes& c)
      : x0(_mm256_load_si256(reinterpret_cast<const __m256i*>(line))),
        x1(_mm256_load_si256(reinterpret_cast<const __m256i*>(line + 32))),
        set(~movemask64(_mm256_cmpeq_epi8(x0, _mm256_setzero_si256()),
                        _mm256_cmpeq_epi8(x1, _mm256_setzero_si256()))),
        live(movemask64(in_interval_avx2(x0, c.lo, c.span), in_interval_avx2(x1, c.lo, c.span)) &
             set) {}
  KDEDUP_AVX2_TARGET void write(std::uint8_t* line, std::uint64_t cells, std::uint32_t code) const {
    const __m256i v = _mm256_set1_epi8(static_cast<char>(code));
    const auto low = static_cast<std::uint32_t>(cells);
    const auto high = static_cast<std::uint32_t>(cells >> 32);
    _mm256_store_si256(reinterpret_cast<__m256i*>(line),
                       _mm256_blendv_epi8(x0, v, byte_mask_avx2(low)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(line + 32),
                       _mm256_blendv_epi8(x1, v, byte_mask_avx2(high)));
  }
};

template <unsigned K>
struct Avx512Probe {
  KDEDUP_AVX512_TARGET static inline Probe run(const auto& view, const Fingerprint& fp,
                                               std::uint64_t inserted, std::uint32_t& filled) {
    return vector_probe<Avx512Line, K>(view, fp, inserted, filled);
  }
};

template <unsigned K>
struct Avx2Probe {
  KDEDUP_AVX2_TARGET static inline Probe run(const auto& view, const Fingerprint& fp,
                                             std::uint64_t inserted, std::uint32_t& filled) {
    return vector_probe<Avx2Line, K>(view, fp, inserted, filled);
  }
};
#endif

}  // namespace

// noinline: kept out of the flattened vector batch loops (vector_probe).
template <unsigned Bits>
[[gnu::noinline]] Decision TimerFilter::decide(const Fingerprint& fp) {
  std::uint32_t filled = 0;
  Probe p = probe_once<Bits, 0>(view_, fp, 0, filled);
  if (p == Probe::kNeedSeal) {
    // The active is full: seal it and insert into a new one (or, at the cap
    // of sub-filters, into the same one anyway: view_.room stays 0).
    seal_and_grow();
    TickView v = view_;
    v.room = ~std::uint64_t{0};
    p = probe_once<Bits, 0>(v, fp, 0, filled);
  }
  if (p == Probe::kDuplicate) return Decision::kDuplicate;
  commit_inserts(1, filled);
  return Decision::kDistinct;
}

Decision TimerFilter::test_and_insert(const Fingerprint& fp, Tick now) {
  if (now > clock_) move_clock(now);
  switch (config_.timer_bits) {
    case 4:
      return decide<4>(fp);
    case 8:
      return decide<8>(fp);
    default:
      return decide<16>(fp);
  }
}

template <unsigned Bits>
void TimerFilter::write(const Fingerprint& fp) {
  std::uint32_t filled = 0;
  if (write_once<Bits>(view_, fp, 0, filled) == Probe::kNeedSeal) {
    seal_and_grow();
    TickView v = view_;
    v.room = ~std::uint64_t{0};  // at the cap of sub-filters: into the same one anyway
    write_once<Bits>(v, fp, 0, filled);
  }
  commit_inserts(1, filled);
}

void TimerFilter::insert(const Fingerprint& fp, Tick now) {
  if (now > clock_) move_clock(now);
  switch (config_.timer_bits) {
    case 4:
      return write<4>(fp);
    case 8:
      return write<8>(fp);
    default:
      return write<16>(fp);
  }
}

template <unsigned Bits, class Prober>
[[gnu::always_inline]] inline void TimerFilter::run_batch(std::span<const Fingerprint> fps,
                                                          std::span<const Tick> ticks,
                                                          std::span<Decision> out) {
  // Prefetch the line each live sub-filter will read kPrefetchDistance
  // elements ahead; decisions are made strictly in order, so they equal the
  // one-by-one results (a sub-filter added mid-batch only misses a hint).
  // The work is split into runs of elements at one clock value (the common
  // case: many records per tick): the clock moves, the sub-filters change and
  // the insertion counters are booked only between runs, so inside a run
  // every constant lives in a local view and each element costs its probe
  // positions, k reads, and k writes when it is new.
  const std::size_t n = fps.size();
  for (std::size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) {
    for (std::uint32_t s = 0; s < view_.count; ++s) {
      __builtin_prefetch(line_of(fps[i].hi, view_.subs[s].data, view_.subs[s].lines), 1, 3);
    }
  }
  const std::size_t prefetch_end = n > kPrefetchDistance ? n - kPrefetchDistance : 0;
  std::size_t i = 0;
  while (i < n) {
    if (ticks[i] > clock_) move_clock(ticks[i]);
    const Tick clock = clock_;
    std::size_t end = i;
    while (end < n && ticks[end] <= clock) ++end;
    const TickView view = view_;
    std::uint64_t inserted = 0, filled = 0;
    // False when the active sub-filter must be sealed first (nothing done).
    auto decide_one = [&](std::size_t j) __attribute__((always_inline)) {
      std::uint32_t empty = 0;
      const Probe p = Prober::run(view, fps[j], inserted, empty);
      if (p == Probe::kNeedSeal) return false;
      out[j] = p == Probe::kDuplicate ? Decision::kDuplicate : Decision::kDistinct;
      inserted += p == Probe::kInserted;
      filled += empty;
      return true;
    };
    const std::size_t split = std::min(end, prefetch_end);
    bool stopped = false;
    for (; i < split; ++i) {
      const std::uint64_t hi = fps[i + kPrefetchDistance].hi;
      __builtin_prefetch(line_of(hi, view.subs[0].data, view.subs[0].lines), 1, 3);
      for (std::uint32_t s = 1; s < view.count; ++s) {
        __builtin_prefetch(line_of(hi, view.subs[s].data, view.subs[s].lines), 1, 3);
      }
      if (!decide_one(i)) {
        stopped = true;
        break;
      }
    }
    if (!stopped) {
      for (; i < end; ++i) {
        if (!decide_one(i)) break;
      }
    }
    commit_inserts(inserted, filled);
    if (i < n && ticks[i] <= clock_) {
      // Stopped for a seal: this element goes through the one-by-one path,
      // which seals and inserts; the next run picks up the new view.
      out[i] = decide<Bits>(fps[i]);
      ++i;
    }
  }
}

template <unsigned Bits, unsigned K>
void TimerFilter::decide_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                               std::span<Decision> out) {
#if KDEDUP_TIMER_X86
  if constexpr (Bits == 8) {
    if (config_.equal_timers == 0) {
      switch (simd_in_use()) {
        case Simd::kAvx512:
          return decide_batch_avx512<K>(fps, ticks, out);
        case Simd::kAvx2:
          return decide_batch_avx2<K>(fps, ticks, out);
        case Simd::kPortable:
          break;
      }
    }
  }
#endif
  run_batch<Bits, PortableProbe<Bits, K>>(fps, ticks, out);
}

#if KDEDUP_TIMER_X86
template <unsigned K>
KDEDUP_AVX2_TARGET [[gnu::flatten]] void TimerFilter::decide_batch_avx2(
    std::span<const Fingerprint> fps, std::span<const Tick> ticks, std::span<Decision> out) {
  run_batch<8, Avx2Probe<K>>(fps, ticks, out);
}

template <unsigned K>
KDEDUP_AVX512_TARGET [[gnu::flatten]] void TimerFilter::decide_batch_avx512(
    std::span<const Fingerprint> fps, std::span<const Tick> ticks, std::span<Decision> out) {
  run_batch<8, Avx512Probe<K>>(fps, ticks, out);
}
#endif

template <unsigned Bits>
void TimerFilter::decide_batch_k(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                                 std::span<Decision> out) {
  // The k of the usual targets (fpp 1% .. 0.1%) get a loop unrolled for them.
  switch (k_) {
    case 5:
      return decide_batch<Bits, 5>(fps, ticks, out);
    case 6:
      return decide_batch<Bits, 6>(fps, ticks, out);
    case 7:
      return decide_batch<Bits, 7>(fps, ticks, out);
    case 8:
      return decide_batch<Bits, 8>(fps, ticks, out);
    default:
      return decide_batch<Bits, 0>(fps, ticks, out);
  }
}

void TimerFilter::test_and_insert_batch(std::span<const Fingerprint> fps,
                                        std::span<const Tick> ticks, std::span<Decision> out) {
  switch (config_.timer_bits) {
    case 4:
      return decide_batch_k<4>(fps, ticks, out);
    case 8:
      return decide_batch_k<8>(fps, ticks, out);
    default:
      return decide_batch_k<16>(fps, ticks, out);
  }
}

FilterStats TimerFilter::stats() const {
  FilterStats st;
  double none = 1.0;
  for (const auto& s : subs_) {
    st.bytes += s->bytes() + s->alive.ring.size() * sizeof(std::uint32_t);
    st.cells += s->lines * cells_per_line_;
    st.live_cells += s->nonempty;
    none *= 1.0 - subfilter_fpp(*s);
  }
  st.subfilters = static_cast<std::uint32_t>(subs_.size());
  st.insertions = insertions_;
  st.fpp_estimate = 1.0 - none;
  return st;
}

std::vector<std::uint64_t> TimerFilter::subfilter_bytes() const {
  std::vector<std::uint64_t> out;
  for (const auto& s : subs_) out.push_back(s->bytes());
  return out;
}

std::string TimerFilter::serialize() const {
  // The payload is written once, after room for the envelope header, into a
  // buffer reserved at its final size: the cell arrays (nearly all the bytes,
  // up to max_bytes per sub-filter) are copied exactly once and never moved.
  std::uint64_t tail = 0;
  for (const auto& s : subs_) {
    tail += 7 * sizeof(std::uint64_t) + sizeof(std::uint32_t) +
            s->alive.ring.size() * sizeof(std::uint32_t) + s->bytes();
  }
  std::string out(kEnvelopeHeaderBytes, '\0');
  ByteWriter w(out);
  write_config(w, config_);
  w.put<std::uint32_t>(k_);
  w.put<Tick>(clock_);
  w.put<Tick>(first_tick_);
  w.put<std::uint64_t>(insertions_);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(subs_.size()));
  out.reserve(out.size() + tail + kEnvelopeTrailerBytes);
  for (const auto& s : subs_) {
    w.put<std::uint64_t>(s->lines);
    w.put<Tick>(s->created);
    w.put<std::uint64_t>(s->swept);
    w.put<Tick>(s->last_insert);
    w.put<std::uint64_t>(s->inserts);
    w.put<std::uint64_t>(s->nonempty);
    w.put<std::uint64_t>(s->alive.first);
    w.put<std::uint32_t>(static_cast<std::uint32_t>(s->alive.ring.size()));
    for (std::uint32_t c : s->alive.ring) w.put<std::uint32_t>(c);
    w.put_bytes(std::string_view(reinterpret_cast<const char*>(s->data.get()), s->bytes()));
  }
  return seal_envelope_in_place(static_cast<std::uint16_t>(FilterType::kTimer), kVersion,
                                std::move(out));
}

Result<std::unique_ptr<SlidingFilter>> TimerFilter::restore(std::string_view payload,
                                                            std::uint16_t version) {
  auto bad = [](const std::string& what) { return fail("timer filter state: " + what); };
  if (version != kVersion) return bad("unsupported format version " + std::to_string(version));
  ByteReader r(payload);
  auto config = read_config(r);
  if (!config) return tl::unexpected(config.error());
  if (config->type != FilterType::kTimer) return bad("wrong filter type in config");
  auto k = r.get<std::uint32_t>("k");
  auto clock = r.get<Tick>("clock");
  auto first_tick = r.get<Tick>("first tick");
  auto insertions = r.get<std::uint64_t>("insertions");
  auto count = r.get<std::uint32_t>("sub-filter count");
  if (!k || !clock || !first_tick || !insertions || !count) return bad("truncated header");
  if (*count == 0 || *count > kMaxSubfilters) {
    return bad("sub-filter count " + std::to_string(*count) + " out of range");
  }
  if (*first_tick > *clock) return bad("first tick after clock");
  // Rebuild the empty shell from the config, then check the derived fields.
  auto made = make_empty(*config);  // the real sub-filters come from the input
  if (!made) return bad(made.error().message);
  std::unique_ptr<TimerFilter> f = std::move(*made);
  if (*k != f->k_) return bad("k " + std::to_string(*k) + " does not match the config");
  f->clock_ = *clock;
  f->first_tick_ = *first_tick;
  f->insertions_ = *insertions;
  const std::uint32_t window = config->ticks_per_window;
  for (std::uint32_t i = 0; i < *count; ++i) {
    auto lines = r.get<std::uint64_t>("lines");
    auto created = r.get<Tick>("created");
    auto swept = r.get<std::uint64_t>("swept");
    auto last_insert = r.get<Tick>("last insert");
    auto inserts = r.get<std::uint64_t>("inserts");
    auto nonempty = r.get<std::uint64_t>("nonempty");
    auto first = r.get<std::uint64_t>("window first bucket");
    auto ring_size = r.get<std::uint32_t>("window ring size");
    if (!lines || !created || !swept || !last_insert || !inserts || !nonempty || !first ||
        !ring_size) {
      return bad("truncated sub-filter header");
    }
    if (*lines == 0 || *lines > r.remaining() / kLineBytes) {
      return bad("sub-filter size exceeds input");
    }
    if (*created > *clock || *last_insert > *clock || *last_insert < *created) {
      return bad("sub-filter ticks inconsistent with the clock");
    }
    if (*nonempty > *lines * f->cells_per_line_) return bad("live cell count exceeds cells");
    auto s = std::make_unique<SubFilter>();
    s->alive.init(window);
    if (*ring_size != s->alive.ring.size()) return bad("window ring size does not match config");
    if (*ring_size > r.remaining() / 4) return bad("window ring exceeds input");
    std::uint64_t sum = 0;
    for (auto& c : s->alive.ring) {
      c = *r.get<std::uint32_t>("window ring");
      sum += c;
    }
    if (sum > *inserts) return bad("window count exceeds insertions");
    const std::uint64_t expect_first = *clock >= window ? (*clock - window) / s->alive.width : 0;
    if (*first != expect_first) return bad("window ring position does not match the clock");
    s->alive.first = *first;
    s->alive.sum = sum;
    s->alive.current = (*clock / s->alive.width) % s->alive.ring.size();
    auto cells = r.get_bytes(*lines * kLineBytes, "cells");
    if (!cells) return bad("truncated cells");
    s->data.reset(allocate_cells(*lines * kLineBytes));
    if (!s->data) return bad("cannot allocate " + std::to_string(*lines * kLineBytes) + " bytes");
    std::memcpy(s->data.get(), cells->data(), cells->size());
    s->lines = *lines;
    s->created = *created;
    s->swept = *swept;
    s->cursor = *swept % *lines;
    s->last_insert = *last_insert;
    s->inserts = *inserts;
    s->nonempty = *nonempty;
    // The live-cell count must match the cells (a cheap full consistency check).
    const std::uint64_t counted = count_nonempty(s->data.get(), s->bytes(), config->timer_bits);
    if (counted != s->nonempty) return bad("live cell count does not match the cells");
    if (s->swept < s->required(*clock, f->period_) ||
        s->swept > s->required(*clock + 1, f->period_)) {
      return bad("scrub position inconsistent with the clock");
    }
    f->subs_.push_back(std::move(s));
  }
  if (auto end = r.expect_end("timer filter state"); !end) return tl::unexpected(end.error());
  f->history_from_ = f->first_tick_;
  // A snapshot of an oversized filter (an old capacity-sized one, or one
  // taken at the peak of a burst) folds to what its content and rate need,
  // as it would at its next tick.
  f->maybe_fold();
  f->refresh_threshold();
  return std::unique_ptr<SlidingFilter>(std::move(f));
}

}  // namespace kdedup::filter
