// Compact filter: a bucketized cuckoo table of short fingerprints with
// wrapping tick tags, grown and shrunk by tables. The design, its sources and
// the reasoning behind every constant are in compact_filter.h.

#include "kdedup/filter/compact_filter.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"

namespace kdedup::filter {
namespace {

constexpr std::uint16_t kVersion = 1;
constexpr std::uint64_t kMaxBlockBits = CompactFilter::kBlockBytes * 8;
constexpr std::uint64_t kLineBytes = 64;
constexpr unsigned kSlots = CompactFilter::kSlots;
// After the last block, so that a 16-byte load of its last bucket stays
// inside the allocation.
constexpr std::uint64_t kTailBytes = 64;
// A failed kick chain adds a table even past kMaxTables, up to this many
// (the hot path's view of the tables is a fixed array).
constexpr std::uint32_t kHardMaxTables = 64;
// Overflow entries beyond which a failed kick chain no longer adds a table.
constexpr std::size_t kMaxOverflow = 4096;
constexpr unsigned kMaxSortedAge = 13;                    // largest W with 4-bit tags
constexpr std::uint64_t kPosMul = 0x9E3779B97F4A7C15ULL;  // odd: a bijection of fp.lo
constexpr std::uint64_t kAltMul = 0xD6E8FEB86659FD93ULL;
constexpr std::uint64_t kKickMul = 0xA0761D6478BD642FULL;

__extension__ typedef unsigned __int128 u128;

inline std::uint64_t mulhi(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
}

constexpr std::array<std::uint8_t, 16> kBitCount = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};

// --- tags stored sorted ------------------------------------------------------
//
// With 4-bit tags a bucket stores its four tags in ascending order as the
// rank of their multiset: t0 <= t1 <= t2 <= t3 map to the strictly
// increasing u_j = t_j + j in [0, 19), ranked in colexicographic order,
//   code = C(u0, 1) + C(u1, 2) + C(u2, 3) + C(u3, 4)  in [0, C(19, 4)),
// computed as lo[t0 | t1 << 4] + hi[t2 | t3 << 4]. Slot j's fingerprint goes
// with the j-th tag. An all-zero bucket is code 0 with four empty slots.
struct SortedTags {
  static constexpr std::uint32_t kCodes = 3876;  // C(19, 4)
  std::array<std::uint16_t, 4096> decode{};      // tag j in bits 4j .. 4j + 3
  std::array<std::uint16_t, 256> lo{}, hi{};

  static constexpr std::uint32_t choose(std::uint32_t n, std::uint32_t k) {
    std::uint32_t r = 1;
    for (std::uint32_t i = 0; i < k; ++i) r = r * (n - i) / (i + 1);
    return n < k ? 0 : r;
  }
  constexpr SortedTags() {
    for (unsigned a = 0; a < 16; ++a) {
      for (unsigned b = 0; b < 16; ++b) {
        lo[a | b << 4] = static_cast<std::uint16_t>(a + choose(b + 1, 2));
        hi[a | b << 4] = static_cast<std::uint16_t>(choose(a + 2, 3) + choose(b + 3, 4));
      }
    }
    for (unsigned a = 0; a < 16; ++a) {
      for (unsigned b = a; b < 16; ++b) {
        for (unsigned c = b; c < 16; ++c) {
          for (unsigned d = c; d < 16; ++d) {
            const auto packed = static_cast<std::uint16_t>(a | b << 4 | c << 8 | d << 12);
            decode[encode(packed)] = packed;
          }
        }
      }
    }
  }
  // Code of four sorted tags packed as nibbles, tag j in bits 4j .. 4j + 3.
  constexpr std::uint32_t encode(std::uint32_t packed) const {
    return lo[packed & 0xFF] + hi[packed >> 8];
  }
};

constexpr SortedTags kTags{};
static_assert(kTags.encode(0xFFFF) == SortedTags::kCodes - 1);
static_assert(kTags.encode(0) == 0);

// young(max_age, ref)[code]: bit j set when tag j of `code` is at most
// max_age ticks older than tag `ref` (mod 16). One 4 KiB page per (max_age,
// ref), built once per process (0.9 MiB): queries read the page of (W, clock),
// the scrub the page of its reference clock.
class YoungTables {
 public:
  YoungTables() : data_((kMaxSortedAge + 1) * 16 * 4096, 0) {
    for (unsigned age = 0; age <= kMaxSortedAge; ++age) {
      for (unsigned ref = 0; ref < 16; ++ref) {
        std::uint8_t* page = data_.data() + (age * 16 + ref) * 4096;
        for (std::uint32_t code = 0; code < SortedTags::kCodes; ++code) {
          const std::uint32_t tags = kTags.decode[code];
          std::uint8_t m = 0;
          for (unsigned j = 0; j < kSlots; ++j) {
            const std::uint32_t tag = (tags >> (4 * j)) & 0xF;
            m = static_cast<std::uint8_t>(m | (((ref - tag) & 0xF) <= age) << j);
          }
          page[code] = m;
        }
      }
    }
  }
  const std::uint8_t* page(unsigned max_age, std::uint32_t ref) const {
    return data_.data() + (std::min(max_age, kMaxSortedAge) * 16 + (ref & 0xF)) * 4096;
  }

 private:
  std::vector<std::uint8_t> data_;
};

const YoungTables& young_tables() {
  static const YoungTables tables;
  return tables;
}

// --- memory ------------------------------------------------------------------

struct FreeCells {
  void operator()(std::uint8_t* p) const { std::free(p); }
};

// Zeroed blocks (an all-zero bucket is empty). Large tables are 2 MiB
// aligned and asked to use transparent huge pages, as the timer filter's
// cells are: every operation reads random lines.
std::uint8_t* allocate_blocks(std::uint64_t bytes) {
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

// --- sizing model --------------------------------------------------------------

// False-positive probability of one table at live load `load` (entries per
// slot): a query meets 8 * load live slots, each matching its f-bit
// fingerprint (never 0) with probability 1 / (2^f - 1).
double fpp_at(double load, unsigned f) {
  if (!(load > 0)) return 0.0;
  const double q = 1.0 / (std::ldexp(1.0, static_cast<int>(f)) - 1.0);
  if (q >= 1.0) return 1.0;
  return -std::expm1(2.0 * kSlots * load * std::log1p(-q));
}

// Largest load whose fpp_at() is at most `fpp`.
double load_for(double fpp, unsigned f) {
  if (!(fpp > 0)) return 0.0;
  if (fpp >= 1.0) return 1e9;
  const double q = 1.0 / (std::ldexp(1.0, static_cast<int>(f)) - 1.0);
  if (q >= 1.0) return 0.0;
  return std::log1p(-fpp) / (2.0 * kSlots * std::log1p(-q));
}

// Insertions per tick over the last W + 1 ticks, one counter per tick.
struct TickCounts {
  std::vector<std::uint32_t> ring;  // tick x at x % ring.size(); W + 2 slots
  std::uint64_t sum = 0;            // over ticks clock - W .. clock

  void init(std::uint32_t window) {
    ring.assign(window + 2, 0);
    sum = 0;
  }
  std::uint32_t at(Tick x) const { return ring[x % ring.size()]; }
  // The clock moves from `old` to `now`: ticks old - W .. now - W - 1 leave.
  void advance(Tick old, Tick now, std::uint32_t window) {
    if (now - old >= ring.size()) {
      std::fill(ring.begin(), ring.end(), 0);
      sum = 0;
      return;
    }
    for (Tick x = old; x < now; ++x) {
      if (x < window) continue;
      std::uint32_t& c = ring[(x - window) % ring.size()];
      sum -= c;
      c = 0;
    }
  }
};

}  // namespace

unsigned compact_fingerprint_bits(double fpp) {
  for (unsigned f = 4; f <= 32; ++f) {
    if (fpp_at(CompactFilter::kFingerprintLoad, f) <= CompactFilter::kBudgetShare * fpp) return f;
  }
  return 33;
}

// A table's bucket format: what follows from its fingerprint width f (and
// the filter's tag width t), as plain values for the hot path.
struct CompactFilter::Layout {
  unsigned f = 0;
  unsigned t = 0;
  unsigned code_bits = 0;         // bits of a bucket's tags (12 sorted, 4t plain)
  unsigned bucket_bits = 0;       // code_bits + 4 f
  std::uint32_t per_block = 0;    // buckets per block
  std::uint64_t block_bytes = 0;  // whole cache lines
  std::uint32_t fmax = 0;         // 2^f - 1: fingerprints are 1 .. fmax
  std::uint32_t tag_mask = 0;     // 2^t - 1
  int codec = 0;                  // 0: Sorted64, 1: Sorted128, 2: Plain128
  // The four fingerprint fields, from bit 0: one bit low in each, the high
  // bit of each, all of them; the multiplier that gathers the high bits.
  u128 low_bits = 0;
  u128 high_bits = 0;
  u128 fields = 0;
  u128 gather = 0;
  std::array<u128, 16> field_mask{};  // the fields of a 4-bit slot mask

  static unsigned bucket_bits_of(unsigned f, unsigned t) {
    return (t == 4 ? 12 : 4 * t) + kSlots * f;
  }
  // Most buckets a block of kBlockBytes holds.
  static std::uint32_t max_per_block(unsigned f, unsigned t) {
    return static_cast<std::uint32_t>(kMaxBlockBits / bucket_bits_of(f, t));
  }
  static Layout of(unsigned f, unsigned t, std::uint32_t per_block) {
    Layout l;
    l.f = f;
    l.t = t;
    l.code_bits = t == 4 ? 12 : 4 * t;
    l.bucket_bits = l.code_bits + kSlots * f;
    l.per_block = per_block;
    l.block_bytes = (std::uint64_t{per_block} * l.bucket_bits + 511) / 512 * kLineBytes;
    l.fmax = static_cast<std::uint32_t>((std::uint64_t{1} << f) - 1);
    l.tag_mask = (1U << t) - 1;
    l.codec = t != 4 ? 2 : l.bucket_bits + 7 <= 64 ? 0 : 1;
    for (unsigned j = 0; j < kSlots; ++j) {
      l.low_bits |= u128{1} << (j * f);
      l.high_bits |= u128{1} << (j * f + f - 1);
      l.gather |= u128{1} << (3 * f - j * (f - 1));
    }
    l.fields = (u128{1} << (kSlots * f)) - 1;
    for (unsigned m = 0; m < 16; ++m) {
      for (unsigned j = 0; j < kSlots; ++j) {
        if (m >> j & 1) l.field_mask[m] |= u128{l.fmax} << (j * f);
      }
    }
    return l;
  }
};

// One cuckoo table: whole blocks of buckets in one format, and what its
// scrub and budget need to know.
struct CompactFilter::Table {
  std::unique_ptr<std::uint8_t[], FreeCells> data;
  std::uint64_t blocks = 0;
  Layout layout;
  Tick created = 0;            // start of the scrub schedule
  std::uint64_t swept = 0;     // buckets visited since `created`
  Tick last_insert = 0;        // newest insertion (== created before any)
  std::uint64_t inserts = 0;   // since creation
  std::uint64_t nonempty = 0;  // slots with a fingerprint
  TickCounts alive;            // insertions in the window
  MemoryCharge charge;         // its bytes in the MemoryBudget, if any

  std::uint64_t bytes() const { return blocks * layout.block_bytes; }
  std::uint64_t buckets() const { return blocks * layout.per_block; }
  std::uint64_t slots() const { return buckets() * kSlots; }
  std::uint8_t* block(std::uint64_t i) const { return data.get() + i * layout.block_bytes; }

  // Buckets the schedule requires by clock c: floor((c - created) * buckets / P).
  std::uint64_t required(Tick c, std::uint32_t period) const {
    if (c <= created) return 0;
    const u128 r = static_cast<u128>(c - created) * buckets() / period;
    return r > ~std::uint64_t{0} ? ~std::uint64_t{0} : static_cast<std::uint64_t>(r);
  }
};

// A displaced entry on its way to its other bucket `to` (waiting), or one
// that found no room (overflow). Either way a query finds it here.
struct CompactFilter::Stashed {
  std::uint32_t table = 0;  // index into tables_
  std::uint32_t to = 0;     // bucket in the block
  std::uint64_t block = 0;
  std::uint32_t fp = 0;  // in its table's width
  std::uint32_t tag = 0;
  std::uint32_t kicks = 0;  // moves so far
  std::uint64_t ready = 0;  // insertions_ value from which it may move
};

namespace {

// Whether a tag is alive: at most `window` ticks older than `now_tag`
// (mod 2^t); with sorted tags, `young` lists the live slots of every code.
struct Age {
  std::uint32_t now_tag = 0;
  std::uint32_t window = 0;
  const std::uint8_t* young = nullptr;
};

}  // namespace

// What the hot path reads, as plain values: rebuilt by refresh_view()
// whenever the clock moves or the tables change.
struct CompactFilter::View {
  struct Cells {
    std::uint8_t* data = nullptr;
    std::uint64_t blocks = 0;
    const Layout* layout = nullptr;
  };
  std::array<Cells, kHardMaxTables> tables{};  // newest (the active one) first
  std::uint32_t count = 0;
  Age age;
  std::uint32_t tick_slot = 0;  // clock mod (W + 2): the tick's insertion counter
  std::uint64_t room = 0;       // inserts the active may take before it must be sealed
};

// The bucket formats the hot paths are compiled for: tags stored sorted in
// a 64- or 128-bit word, or stored as they are (5- to 8-bit tags).
struct CompactFilter::Sorted64 {
  using Word = std::uint64_t;
  static constexpr bool kSorted = true;
  static constexpr int kId = 0;
};
struct CompactFilter::Sorted128 {
  using Word = u128;
  static constexpr bool kSorted = true;
  static constexpr int kId = 1;
};
struct CompactFilter::Plain128 {
  using Word = u128;
  static constexpr bool kSorted = false;
  static constexpr int kId = 2;
};

namespace {

// --- positions -----------------------------------------------------------------
//
// Fingerprint.lo, through an odd multiplier, gives the product the stored
// fingerprint is taken from (its top bits, scaled to 1 .. 2^f - 1, so
// tables of different widths agree on the leading bits); Fingerprint.hi xor
// the same product gives the position: the block (multiply-high by the
// table's blocks) and, from the low half of that product, the first bucket.
// With salted XXH3-128 fingerprints the two halves are independent, so
// position and stored fingerprint are too; the xor only spreads weak test
// inputs.

template <class K>
inline K key_of(const Fingerprint& x) {
  const std::uint64_t mixed = x.lo * kPosMul;
  return {x.hi ^ mixed, mixed};
}

inline std::uint32_t fp_of(std::uint64_t mixed, std::uint32_t fmax) {
  return static_cast<std::uint32_t>(1 + mulhi(mixed, fmax));
}

// The reflection point of an entry's two buckets: b2 = (c - b1) mod
// buckets-per-block, an involution, so either bucket gives the other.
inline std::uint32_t reflection(std::uint32_t fp, std::uint32_t per_block) {
  return static_cast<std::uint32_t>(mulhi(fp * kAltMul, per_block));
}

inline std::uint32_t other(std::uint32_t c, std::uint32_t b, std::uint32_t per_block) {
  return c >= b ? c - b : c + per_block - b;
}

struct Place {
  std::uint64_t block = 0;
  std::uint32_t b1 = 0;
  std::uint32_t b2 = 0;
};

inline Place place_of(std::uint64_t pos, std::uint32_t c, std::uint64_t blocks,
                      std::uint32_t per_block) {
  const std::uint64_t block = mulhi(pos, blocks);
  const auto b1 = static_cast<std::uint32_t>(mulhi(pos * blocks, per_block));
  return {block, b1, other(c, b1, per_block)};
}

// --- buckets -------------------------------------------------------------------
//
// A bucket is code_bits of tags followed by four f-bit fingerprints, packed
// back to back in its block; it is read and written as one unaligned 64- or
// 128-bit word. F below is a bucket's four fingerprint fields moved to bit 0.

template <class Word>
inline Word bucket_mask(unsigned bits) {
  return (Word{1} << bits) - 1;
}

template <class Word>
inline Word load_bucket(const std::uint8_t* block, std::uint32_t b, unsigned bits) {
  const std::uint64_t at = std::uint64_t{b} * bits;
  Word w;
  std::memcpy(&w, block + (at >> 3), sizeof(Word));
  return (w >> (at & 7)) & bucket_mask<Word>(bits);
}

template <class Word>
inline void store_bucket(std::uint8_t* block, std::uint32_t b, unsigned bits, Word value) {
  const std::uint64_t at = std::uint64_t{b} * bits;
  const unsigned shift = static_cast<unsigned>(at & 7);
  Word w;
  std::memcpy(&w, block + (at >> 3), sizeof(Word));
  w = (w & ~(bucket_mask<Word>(bits) << shift)) | (value << shift);
  std::memcpy(block + (at >> 3), &w, sizeof(Word));
}

// always_inline: a function whose only effect is __builtin_prefetch is
// classified as const by GCC's pure-const analysis, and calls to it deleted.
[[gnu::always_inline]] inline void prefetch_bucket(const std::uint8_t* block, std::uint32_t b,
                                                   unsigned bits) {
  const std::uint64_t at = std::uint64_t{b} * bits;
  __builtin_prefetch(block + (at >> 3), 1, 3);
  __builtin_prefetch(block + ((at + bits - 1) >> 3), 1, 3);
}

// Fields of F that are zero, as a 4-bit mask. Adding 2^(f-1) - 1 to each
// field's low f - 1 bits sets its high bit unless they are all zero, and no
// carry leaves a field; the high bits are then gathered by one multiply
// (their products land on distinct bits, f >= 4).
template <class Word>
inline unsigned zero_fields(Word x, const auto& l) {
  const auto high = static_cast<Word>(l.high_bits);
  const auto fields = static_cast<Word>(l.fields);
  const Word set = (x & ~high) + (fields & ~high);
  const Word zero = ~(set | x) & high;
  return static_cast<unsigned>(((zero >> (l.f - 1)) * static_cast<Word>(l.gather)) >> (3 * l.f)) &
         0xF;
}

template <class Word>
inline Word fields_of(Word w, const auto& l) {
  return w >> l.code_bits;
}

template <class Word>
inline std::uint32_t field(Word fields, unsigned j, const auto& l) {
  return static_cast<std::uint32_t>(fields >> (j * l.f)) & l.fmax;
}

// Slots whose tag is alive (whatever their fingerprint).
template <class Codec>
inline unsigned young4(typename Codec::Word w, const auto& l, const Age& a) {
  if constexpr (Codec::kSorted) {
    return a.young[static_cast<std::uint32_t>(w) & 0xFFF];
  } else {
    unsigned m = 0;
    for (unsigned j = 0; j < kSlots; ++j) {
      const auto tag = static_cast<std::uint32_t>(w >> (j * l.t)) & l.tag_mask;
      m |= static_cast<unsigned>(((a.now_tag - tag) & l.tag_mask) <= a.window) << j;
    }
    return m;
  }
}

template <class Codec>
inline std::uint32_t tag_at(typename Codec::Word w, unsigned j, const auto& l) {
  if constexpr (Codec::kSorted) {
    return (kTags.decode[static_cast<std::uint32_t>(w) & 0xFFF] >> (4 * j)) & 0xF;
  } else {
    return static_cast<std::uint32_t>(w >> (j * l.t)) & l.tag_mask;
  }
}

// Live slots holding `fp`. The fingerprint test comes first: for a new
// identity it almost never matches, and the tags are then not looked at.
template <class Codec>
inline unsigned holding(typename Codec::Word w, std::uint32_t fp, const auto& l, const Age& a) {
  using Word = typename Codec::Word;
  const unsigned m = zero_fields(fields_of(w, l) ^ (static_cast<Word>(l.low_bits) * fp), l);
  return m == 0 ? 0 : m & young4<Codec>(w, l, a);
}

// Slots a new entry may take: empty or dead.
template <class Codec>
inline unsigned free4(typename Codec::Word w, const auto& l, const Age& a) {
  return (zero_fields(fields_of(w, l), l) | ~young4<Codec>(w, l, a)) & 0xF;
}

// The bucket with slot j replaced by (tag, fp). With sorted tags the entry
// moves to its place among the other three (after equal tags): the tag
// nibbles and fingerprint fields between the two positions shift by one.
template <class Codec>
[[gnu::always_inline]] inline typename Codec::Word with_slot(typename Codec::Word w, unsigned j,
                                                             std::uint32_t tag, std::uint32_t fp,
                                                             const auto& l) {
  using Word = typename Codec::Word;
  if constexpr (Codec::kSorted) {
    const std::uint32_t tags = kTags.decode[static_cast<std::uint32_t>(w) & 0xFFF];
    const std::uint32_t below_j = (1U << (4 * j)) - 1;
    const std::uint32_t rest = (tags & below_j) | ((tags >> 4) & ~below_j & 0xFFF);
    const unsigned p = ((rest & 0xF) <= tag) + (((rest >> 4) & 0xF) <= tag) + ((rest >> 8) <= tag);
    const std::uint32_t below_p = (1U << (4 * p)) - 1;
    const std::uint32_t sorted = (rest & below_p) | tag << (4 * p) | (rest & ~below_p) << 4;
    const Word fields = fields_of(w, l);
    const Word field_j = (Word{1} << (j * l.f)) - 1;
    const Word others = (fields & field_j) | ((fields >> l.f) & ~field_j);
    const Word field_p = (Word{1} << (p * l.f)) - 1;
    const Word moved = (others & field_p) | Word{fp} << (p * l.f) | (others & ~field_p) << l.f;
    return Word{kTags.encode(sorted)} | moved << l.code_bits;
  } else {
    const unsigned tag_bit = j * l.t;
    const unsigned fp_bit = l.code_bits + j * l.f;
    w &= ~(Word{l.tag_mask} << tag_bit);
    w &= ~(Word{l.fmax} << fp_bit);
    return w | Word{tag} << tag_bit | Word{fp} << fp_bit;
  }
}

// True if `fp` is alive in the table at its two buckets.
template <class Codec>
inline bool probe_table(const std::uint8_t* data, std::uint64_t blocks, const auto& l,
                        std::uint64_t pos, std::uint32_t fp, const Age& a) {
  using Word = typename Codec::Word;
  const Place p = place_of(pos, reflection(fp, l.per_block), blocks, l.per_block);
  const std::uint8_t* block = data + p.block * l.block_bytes;
  return (holding<Codec>(load_bucket<Word>(block, p.b1, l.bucket_bits), fp, l, a) |
          holding<Codec>(load_bucket<Word>(block, p.b2, l.bucket_bits), fp, l, a)) != 0;
}

}  // namespace

// --- construction ----------------------------------------------------------------

CompactFilter::CompactFilter(const FilterConfig& config)
    : config_(config), waiting_(new Stashed[kStash]), view_(std::make_unique<View>()) {}
CompactFilter::~CompactFilter() = default;

Result<std::unique_ptr<CompactFilter>> CompactFilter::make_empty(const FilterConfig& config) {
  if (config.type != FilterType::kCompact) {
    return fail("compact filter: config type is not compact");
  }
  const unsigned t = compact_tag_bits(config.ticks_per_window);
  if (config.ticks_per_window == 0 || t == 0) {
    return fail("compact filter: ticks_per_window " + std::to_string(config.ticks_per_window) +
                " out of range (1 .. " + std::to_string(kMaxCompactTicksPerWindow) + ")");
  }
  std::unique_ptr<CompactFilter> f(new CompactFilter(config));
  f->t_ = t;
  f->f_ = compact_fingerprint_bits(config.fpp);
  f->min_f_ = f->f_;
  f->target_ = config.fpp;
  const unsigned code_bits = t == 4 ? 12 : 4 * t;
  f->max_f_ = (121 - code_bits) / kSlots;  // a bucket fits a 16-byte load after a 7-bit shift
  if (f->f_ > f->max_f_) {
    return fail("compact filter: fpp " + std::to_string(config.fpp) + " needs " +
                std::to_string(f->f_) + "-bit fingerprints, too many with " + std::to_string(t) +
                "-bit tags");
  }
  f->period_ = (1U << t) - 2 - config.ticks_per_window;  // P = G - 1 >= 1
  f->tick_fpp_.assign(config.ticks_per_window + 2, 0.0);
  return f;
}

Result<std::unique_ptr<CompactFilter>> CompactFilter::create(const FilterConfig& config) {
  auto made = make_empty(config);
  if (!made) return tl::unexpected(made.error());
  std::unique_ptr<CompactFilter> f = std::move(*made);
  auto table = f->make_table(f->initial_shape(), f->f_, 0);
  if (!table) return fail("compact filter: cannot allocate the first table");
  f->tables_.push_back(std::move(table));
  f->refresh_limit();
  return f;
}

Result<std::unique_ptr<CompactFilter>> CompactFilter::create_presized(const FilterConfig& config) {
  auto made = make_empty(config);
  if (!made) return tl::unexpected(made.error());
  std::unique_ptr<CompactFilter> f = std::move(*made);
  auto table =
      f->make_table(f->shape_for(static_cast<double>(config.capacity), f->f_, false), f->f_, 0);
  if (!table) return fail("compact filter: cannot allocate the first table");
  f->tables_.push_back(std::move(table));
  f->refresh_limit();
  return f;
}

CompactFilter::Shape CompactFilter::initial_shape() const noexcept {
  // The hint may start the filter below the floor, never above it.
  const Shape hinted = shape_for(static_cast<double>(config_.capacity), f_, false);
  const Shape floor = shape_within(config_.min_bytes, f_);
  return bytes_of(hinted, f_) < bytes_of(floor, f_) ? hinted : floor;
}

std::uint64_t CompactFilter::initial_bytes() const noexcept {
  return bytes_of(initial_shape(), f_);
}

std::unique_ptr<CompactFilter::Table> CompactFilter::make_table(Shape shape, unsigned f,
                                                                Tick now) const {
  auto t = std::make_unique<Table>();
  t->layout = Layout::of(f, t_, shape.per_block);
  t->data.reset(allocate_blocks(shape.blocks * t->layout.block_bytes + kTailBytes));
  if (!t->data) return nullptr;
  t->blocks = shape.blocks;
  t->created = now;
  t->last_insert = now;
  t->alive.init(config_.ticks_per_window);
  return t;
}

CompactFilter::Shape CompactFilter::shape_for(double entries, unsigned f,
                                              bool bounded) const noexcept {
  // Buckets for `entries` at kTargetLoad (within min_bytes / max_bytes when
  // `bounded`), in as few blocks as hold them, the buckets spread evenly:
  // a table is sized to a cache line per block, not to whole 16 KiB blocks.
  const unsigned bits = Layout::bucket_bits_of(f, t_);
  double buckets = std::ceil(std::max(1.0, entries) / (kTargetLoad * kSlots));
  const double most_buckets =
      std::max(2.0, std::floor(static_cast<double>(config_.max_bytes) * 8 / bits));
  if (bounded) {
    const Shape floor = shape_within(config_.min_bytes, f);
    if (buckets <= static_cast<double>(floor.blocks * floor.per_block)) return floor;
  }
  buckets = std::clamp(buckets, 2.0, most_buckets);
  const double per = Layout::max_per_block(f, t_);
  const auto blocks = static_cast<std::uint64_t>(std::ceil(buckets / per));
  const auto per_block =
      static_cast<std::uint32_t>(std::ceil(buckets / static_cast<double>(blocks)));
  return {blocks, std::max<std::uint32_t>(2, per_block)};
}

CompactFilter::Shape CompactFilter::shape_within(std::uint64_t bytes, unsigned f) const noexcept {
  // Whole lines, spread evenly over as few blocks as hold them; each block
  // takes the buckets its lines hold.
  constexpr std::uint64_t kLinesPerBlock = CompactFilter::kBlockBytes / kLineBytes;
  const unsigned bits = Layout::bucket_bits_of(f, t_);
  const std::uint64_t lines = std::max<std::uint64_t>(1, bytes / kLineBytes);
  const std::uint64_t blocks = (lines + kLinesPerBlock - 1) / kLinesPerBlock;
  const std::uint64_t lines_per_block = lines / blocks;
  const auto per_block = static_cast<std::uint32_t>(lines_per_block * kLineBytes * 8 / bits);
  return {blocks, std::max<std::uint32_t>(2, per_block)};
}

std::uint64_t CompactFilter::bytes_of(Shape shape, unsigned f) const noexcept {
  return shape.blocks * Layout::of(f, t_, shape.per_block).block_bytes;
}

std::uint64_t CompactFilter::new_table_bytes(double entries, unsigned f) const noexcept {
  return bytes_of(shape_for(entries, f, true), f);
}

std::unique_ptr<CompactFilter::Table> CompactFilter::charged_table(Shape shape, unsigned f) {
  auto t = make_table(shape, f, clock_);
  if (t && budget_) {
    budget_->charge(t->bytes());
    t->charge = MemoryCharge(budget_, t->bytes());
  }
  return t;
}

// --- budget and sizing -------------------------------------------------------------

double CompactFilter::table_fpp(const Table& t) const {
  return fpp_at(static_cast<double>(t.alive.sum) / static_cast<double>(t.slots()), t.layout.f);
}

double CompactFilter::fpp_budget_used() const {
  double sum = 0;
  for (const auto& t : tables_) sum += table_fpp(*t);
  return sum;
}

unsigned CompactFilter::width_for(double budget) const {
  for (unsigned f = min_f_; f < max_f_; ++f) {
    if (fpp_at(kTargetLoad, f) <= budget) return f;
  }
  return max_f_;
}

void CompactFilter::refresh_limit() {
  double sealed = 0;
  for (std::size_t i = 0; i + 1 < tables_.size(); ++i) sealed += table_fpp(*tables_[i]);
  const Table& a = *tables_.back();
  const double budget = kBudgetShare * (target_ - sealed);
  // Overfull (no table could be added this tick): whatever the table takes.
  const double load =
      overfull_ ? kMaxLoad : std::min(kMaxLoad, budget > 0 ? load_for(budget, a.layout.f) : 0.0);
  active_limit_ = static_cast<std::uint64_t>(load * static_cast<double>(a.slots()));
  refresh_view();
}

void CompactFilter::refresh_view() {
  View& v = *view_;
  v.count = static_cast<std::uint32_t>(tables_.size());
  for (std::size_t i = 0; i < tables_.size(); ++i) {
    const Table& t = *tables_[tables_.size() - 1 - i];
    v.tables[i] = {t.data.get(), t.blocks, &t.layout};
  }
  const std::uint32_t tag_mask = (1U << t_) - 1;
  v.age.now_tag = static_cast<std::uint32_t>(clock_) & tag_mask;
  v.age.window = config_.ticks_per_window;
  v.age.young = t_ == 4 ? young_tables().page(v.age.window, v.age.now_tag) : nullptr;
  v.tick_slot = static_cast<std::uint32_t>(clock_ % (config_.ticks_per_window + 2));
  const std::uint64_t held = tables_.back()->alive.sum;
  v.room = active_limit_ > held ? active_limit_ - held : 0;
  // The stash filter counts entries of tables as wide as the active one;
  // the others (rare: a stash across a change of width) are always scanned.
  stash_bins_ = {};
  stash_others_ = 0;
  const unsigned f = tables_.back()->layout.f;
  auto note = [&](const Stashed& s) {
    if (tables_[s.table]->layout.f == f) {
      mark_stashed(s.fp);
    } else {
      ++stash_others_;
    }
  };
  for (std::size_t i = 0; i < wait_count_; ++i) note(waiting_[(wait_head_ + i) % kStash]);
  for (const Stashed& s : overflow_) note(s);
}

std::size_t CompactFilter::stash_size() const noexcept { return wait_count_ + overflow_.size(); }

bool CompactFilter::rate_known() const {
  // At least one whole tick of insertions behind the clock.
  return insertions_ > 0 && clock_ > first_tick_;
}

double CompactFilter::arrivals(Tick x) const {
  // Deliveries count the new identities the filter did not mistake for
  // duplicates: divided by 1 - (the estimate at that tick), they give the
  // new identities that arrived, whatever the filter's fpp was then (a
  // ramp-up's wider or fuller tables, a table under budget pressure).
  std::uint64_t n = 0;
  for (const auto& t : tables_) n += t->alive.at(x);
  return static_cast<double>(n) / (1.0 - std::min(0.5, tick_fpp_[x % tick_fpp_.size()]));
}

double CompactFilter::window_arrivals() const {
  const Tick from = clock_ - std::min<Tick>(clock_, config_.ticks_per_window);
  double sum = 0;
  for (Tick x = from; x <= clock_; ++x) sum += arrivals(x);
  return sum;
}

double CompactFilter::recent_rate(Tick horizon, bool rising) const {
  // New identities per tick: the mean of the last `horizon` whole ticks
  // (since the first insertion if later); with `rising`, the current tick's
  // so far when that is more.
  const Tick history = insertions_ == 0 ? 0 : clock_ - std::min(clock_, first_tick_);
  const Tick span = std::min(horizon, history);
  double whole = 0;
  for (Tick x = clock_ - span; x < clock_; ++x) whole += arrivals(x);
  const double mean = span > 0 ? whole / static_cast<double>(span) : 0.0;
  return rising ? std::max(mean, arrivals(clock_)) : mean;
}

double CompactFilter::growth_rate() const {
  // Over a quarter of the window (at least 2 ticks), and never less than
  // the current tick so far: a rising rate is seen at once.
  const std::uint32_t window = config_.ticks_per_window;
  return recent_rate(std::min<Tick>(window, std::max<Tick>(2, (window + 1) / 4)), true);
}

double CompactFilter::delivered_share() const {
  // A right-sized table at kTargetLoad delivers this share of the new
  // identities (at fpp 10% a few % fewer than arrive).
  return 1.0 - fpp_at(kTargetLoad, min_f_);
}

double CompactFilter::growth_target() const {
  // The recent rate over a whole window once one whole tick has been seen
  // (a burst inside the current tick is never extrapolated to a window);
  // before that, geometric growth (scalable Bloom filters).
  if (rate_known()) return growth_rate() * (config_.ticks_per_window + 1) * delivered_share();
  return kMaxGrowthStep *
         static_cast<double>(std::max<std::uint64_t>(1, tables_.back()->alive.sum));
}

bool CompactFilter::seal_and_grow(Seal why, double want) {
  // The new table holds `want` entries at kTargetLoad with the narrowest
  // fingerprints the budget left by the tables sealed now allows: after a
  // full table that is a few bits wider, and once alone it is replaced by a
  // right-sized table at the base width (maybe_replace). A replacement
  // takes the narrowest width that fits the target by itself: the table it
  // replaces drains while it fills, and the room rule keeps the sum within
  // the target at every tick meanwhile.
  if (want <= 0) want = growth_target();
  const double left = why == Seal::kReplace ? target_ : target_ - fpp_budget_used();
  const unsigned f = width_for(kBudgetShare * left);
  // A table that could not take a single identity within the fpp left (the
  // table cap; the sealed tables' share after the level fell) is no use
  // unless the active is full.
  const bool useless = tables_.size() >= kMaxTables || fpp_at(kTargetLoad, f) > kBudgetShare * left;
  std::unique_ptr<Table> t;
  if (tables_.size() < kHardMaxTables && (why == Seal::kFull || !useless)) {
    t = reserve_table(why, want, f);
  }
  if (!t && why == Seal::kFull) {
    // Refused while the active cannot take more: an older table with room
    // takes the new identities (its fpp rises, as an overfull active's
    // would), else a floor table at the narrowest width the level allows
    // (the fewest bytes for the identities it must take) is charged past
    // the limit rather than evict a live entry.
    if (reopen_sealed()) return true;
    if (tables_.size() < kHardMaxTables) {
      t = charged_table(shape_within(config_.min_bytes, min_f_), min_f_);
    }
  }
  if (!t) {
    // Refused, out of memory or of no use: the active takes new identities
    // up to kMaxLoad until the next tick, when growth is asked for again.
    if (why != Seal::kReplace) {
      overfull_ = true;
      refresh_limit();
    }
    return false;
  }
  tables_.push_back(std::move(t));
  refresh_limit();
  return true;
}

std::unique_ptr<CompactFilter::Table> CompactFilter::reserve_table(Seal why, double want,
                                                                   unsigned f) {
  Shape shape = shape_for(want, f, true);
  const Shape floor = shape_within(config_.min_bytes, f);
  const std::uint64_t least = bytes_of(floor, f);
  std::uint64_t bytes = bytes_of(shape, f);
  if (!budget_) return make_table(shape, f, clock_);
  if (bytes <= least) return charged_table(floor, f);  // the floor is never refused
  if (budget_->max_bytes() != 0 && budget_->demand(0) > budget_->max_bytes() &&
      demand_.at_target() > 0) {
    // Over budget, each filter holds at most its share of it, in proportion
    // to what it needs at the target (so every partition's fpp rises alike).
    const double part = static_cast<double>(budget_->max_bytes()) *
                        static_cast<double>(demand_.at_target()) /
                        static_cast<double>(budget_->demand(0));
    double held = 0;
    for (const auto& t : tables_) held += static_cast<double>(t->bytes());
    const auto room = static_cast<std::uint64_t>(std::max(0.0, part - held));
    if (room < bytes) {
      shape = room > least ? shape_within(room, f) : floor;
      bytes = bytes_of(shape, f);
    }
  }
  // A growth table may get part of what it asks for (no less than a
  // quarter, or the floor: much smaller tables fill at once); a replacement
  // must be right-sized.
  const std::uint64_t ask =
      why == Seal::kReplace ? bytes : std::min(bytes, std::max(least, bytes / 4));
  const std::uint64_t granted = budget_->reserve_up_to(ask, bytes);
  if (granted == 0) return nullptr;  // refused
  if (granted < bytes) shape = shape_within(granted, f);
  auto t = make_table(shape, f, clock_);
  const std::uint64_t used = t ? t->bytes() : 0;
  if (granted > used) budget_->release(granted - used);
  if (t) t->charge = MemoryCharge(budget_, used);
  return t;
}

bool CompactFilter::reopen_sealed() {
  // The sealed table with the most room below kMaxLoad, if that is at least
  // an eighth of its slots (less would be sealed again at once), becomes the
  // active one again: it moves to the back, and the stash's entries follow
  // their tables.
  std::size_t best = tables_.size();
  double most = 0;
  for (std::size_t i = 0; i + 1 < tables_.size(); ++i) {
    const auto slots = static_cast<double>(tables_[i]->slots());
    const double room = kMaxLoad * slots - static_cast<double>(tables_[i]->alive.sum);
    if (room >= slots / 8 && room > most) {
      best = i;
      most = room;
    }
  }
  if (best == tables_.size()) return false;
  const auto last = static_cast<std::uint32_t>(tables_.size() - 1);
  auto moved = [&](std::uint32_t i) { return i < best ? i : i == best ? last : i - 1; };
  for (std::size_t i = 0; i < wait_count_; ++i) {
    Stashed& s = waiting_[(wait_head_ + i) % kStash];
    s.table = moved(s.table);
  }
  for (Stashed& s : overflow_) s.table = moved(s.table);
  std::rotate(tables_.begin() + static_cast<std::ptrdiff_t>(best),
              tables_.begin() + static_cast<std::ptrdiff_t>(best) + 1, tables_.end());
  overfull_ = true;  // it takes identities up to kMaxLoad until the next tick
  refresh_limit();
  return true;
}

void CompactFilter::maybe_replace() {
  // Two rules. After a fall of the rate (a burst's end), the active table
  // is replaced as soon as it is kFallFactor times too big for the recent
  // rate of new identities (the mean of the last R whole ticks, R = a
  // quarter of the window, at least 2), alone or not. And a lone table that
  // has seen a whole window is right-sized when it is more than
  // kShrinkFactor times too big for the window's exact live count, or wider
  // than the target requires (after a growth phase's tightening): the live
  // count is steady where the rate is not (on a stream with repeats, the
  // rate of new identities dips after a burst and climbs back over a
  // window, and a small threshold on it would replace table after table).
  // The new table only takes what arrives from then on; the old one keeps
  // its entries and drains within a window. A table younger than R ticks is
  // left alone: its rate is still being measured.
  const Table& active = *tables_.back();
  const std::uint32_t window = config_.ticks_per_window;
  const Tick young = std::max<Tick>(2, (window + 1) / 4);
  if (clock_ - active.created <= young) return;
  const double share = delivered_share();
  const double rate_need = recent_rate(young, false) * (window + 1) * share;
  if (static_cast<double>(active.bytes()) >
      kFallFactor * static_cast<double>(new_table_bytes(rate_need, active.layout.f))) {
    (void)seal_and_grow(Seal::kReplace, rate_need);
    return;
  }
  if (tables_.size() != 1 || clock_ - active.created <= window) return;
  // Called as the clock moves: the new tick holds no insertions yet, so the
  // live count covers W ticks, and a table must hold W + 1 at the tick's end.
  const double want = window_arrivals() * (window + 1) / window * share;
  const bool narrower = width_for(kBudgetShare * target_) < active.layout.f;
  const bool smaller = static_cast<double>(active.bytes()) >
                       kShrinkFactor * static_cast<double>(new_table_bytes(want, active.layout.f));
  if (narrower || smaller) (void)seal_and_grow(Seal::kReplace, want);
}

// --- the memory budget -------------------------------------------------------------

void CompactFilter::set_memory_budget(std::shared_ptr<MemoryBudget> budget) {
  budget_ = std::move(budget);
  demand_ = MemoryDemand(budget_);
  level_widths_.clear();
  for (std::uint32_t l = 0; l < demand_.levels(); ++l) {
    level_widths_.push_back(compact_fingerprint_bits(
        filter::effective_fpp(config_.fpp, std::ldexp(1.0, static_cast<int>(l)))));
  }
  for (auto& t : tables_) {
    t->charge = MemoryCharge();
    if (budget_) {
      budget_->charge(t->bytes());
      t->charge = MemoryCharge(budget_, t->bytes());
    }
  }
  budget_level_ = budget_ ? budget_->level() : 0;
  level_since_ = clock_;
  set_target(filter::effective_fpp(config_.fpp, std::ldexp(1.0, static_cast<int>(budget_level_))));
  refresh_limit();
}

void CompactFilter::set_target(double fpp) {
  target_ = fpp;
  min_f_ = std::min(f_, compact_fingerprint_bits(fpp));
}

std::uint32_t CompactFilter::budget_vote() const noexcept {
  const double settle = MemoryBudget::kSettleShare * config_.ticks_per_window;
  return static_cast<double>(clock_ - level_since_) >= std::max(1.0, settle) ? budget_level_
                                                                             : MemoryBudget::kHold;
}

void CompactFilter::observe_budget() {
  if (!budget_) return;
  budget_->settle(budget_vote());  // the load may have fallen
  const std::uint32_t level = budget_->level();
  if (level == budget_level_) return;
  budget_level_ = level;
  level_since_ = clock_;
  set_target(filter::effective_fpp(config_.fpp, std::ldexp(1.0, static_cast<int>(level))));
}

void CompactFilter::publish_demand() {
  if (level_widths_.empty()) return;
  // The new identities that arrived in the window (arrivals(): a saturated
  // filter inserts only those it does not mistake for duplicates), or what
  // the current rate brings in one if more, in a right-sized table at each
  // level's base width.
  const double rate = rate_known() ? growth_rate() : 0.0;
  const double holds = std::max(window_arrivals(), rate * (config_.ticks_per_window + 1));
  std::vector<std::uint64_t> bytes(level_widths_.size());
  for (std::size_t l = 0; l < level_widths_.size(); ++l) {
    bytes[l] = new_table_bytes(holds, level_widths_[l]);
  }
  demand_.publish(bytes);
}

// --- the stash -------------------------------------------------------------------------

// The stash filter: entries per bin of 256 by fingerprint (for entries of
// the active table's width), so that a query scans the stash only on a hit.
namespace {
inline unsigned stash_bin(std::uint32_t fp) { return static_cast<unsigned>(fp * kAltMul >> 56); }
}  // namespace

void CompactFilter::mark_stashed(std::uint32_t fp) { ++stash_bins_[stash_bin(fp)]; }

bool CompactFilter::maybe_stashed(std::uint32_t fp) const {
  return stash_bins_[stash_bin(fp)] != 0;
}

void CompactFilter::unmark(const Stashed& s) {
  if (tables_[s.table]->layout.f == tables_.back()->layout.f) {
    --stash_bins_[stash_bin(s.fp)];
  } else {
    --stash_others_;
  }
}

void CompactFilter::push_waiting(const Stashed& s) {
  waiting_[(wait_head_ + wait_count_) % kStash] = s;
  ++wait_count_;
  if (tables_[s.table]->layout.f == tables_.back()->layout.f) {
    mark_stashed(s.fp);
  } else {
    ++stash_others_;
  }
}

bool CompactFilter::in_stash(const Key& k, std::uint32_t now_tag, std::uint32_t max_age) const {
  // A stashed entry is the query's identity (up to its fingerprint) when it
  // belongs to one of the query's buckets in its table and is alive.
  const std::uint32_t mask = (1U << t_) - 1;
  auto same = [&](const Stashed& s) {
    const Table& t = *tables_[s.table];
    const std::uint32_t fp = fp_of(k.mixed, t.layout.fmax);
    if (s.fp != fp || ((now_tag - s.tag) & mask) > max_age) return false;
    const Place p =
        place_of(k.pos, reflection(fp, t.layout.per_block), t.blocks, t.layout.per_block);
    return p.block == s.block && (p.b1 == s.to || p.b2 == s.to);
  };
  for (std::size_t i = 0; i < wait_count_; ++i) {
    if (same(waiting_[(wait_head_ + i) % kStash])) return true;
  }
  return std::any_of(overflow_.begin(), overflow_.end(), same);
}

[[gnu::noinline]] void CompactFilter::step_stash(std::uint64_t count) {
  switch (tables_[waiting_[wait_head_].table]->layout.codec) {
    case Sorted64::kId:
      return step_in<Sorted64>(count);
    case Sorted128::kId:
      return step_in<Sorted128>(count);
    default:
      return step_in<Plain128>(count);
  }
}

template <class Codec>
void CompactFilter::step_in(std::uint64_t count) {
  // Moves the oldest waiting entry into its bucket, or displaces an entry
  // there, which waits in turn. `count` is the insertion count so far. A
  // failed chain in the active table sets seal_due_: the caller seals it
  // once the current insertion is booked.
  using Word = typename Codec::Word;
  const Stashed s = waiting_[wait_head_];
  wait_head_ = (wait_head_ + 1) % kStash;
  --wait_count_;
  unmark(s);
  Table& table = *tables_[s.table];
  const Layout& l = table.layout;
  std::uint8_t* block = table.block(s.block);
  const Word w = load_bucket<Word>(block, s.to, l.bucket_bits);
  const unsigned free = free4<Codec>(w, l, view_->age);
  if (free != 0) {
    const auto j = static_cast<unsigned>(std::countr_zero(free));
    table.nonempty += field(fields_of(w, l), j, l) == 0;
    store_bucket<Word>(block, s.to, l.bucket_bits, with_slot<Codec>(w, j, s.tag, s.fp, l));
  } else {
    const auto j =
        static_cast<unsigned>((std::uint64_t{s.fp} * kKickMul + s.kicks * kPosMul) >> 62);
    Stashed next = s;
    next.fp = field(fields_of(w, l), j, l);
    next.tag = tag_at<Codec>(w, j, l);
    next.to = other(reflection(next.fp, l.per_block), s.to, l.per_block);
    next.kicks = s.kicks + 1;
    next.ready = count + kStashDelay;
    store_bucket<Word>(block, s.to, l.bucket_bits, with_slot<Codec>(w, j, s.tag, s.fp, l));
    if (next.kicks <= kMaxKicks) {
      prefetch_bucket(block, next.to, l.bucket_bits);
      push_waiting(next);
    } else {
      // No room within kMaxKicks: the entry stays in the stash until it
      // expires. One such chain at a high load is bad luck; kOverflowSeal of
      // them in the active table mean it is full: it takes no more new
      // identities.
      overflow_.push_back(next);
      refresh_view();  // recounts the stash filter
      const auto in_active = static_cast<std::size_t>(
          std::count_if(overflow_.begin(), overflow_.end(),
                        [&](const Stashed& o) { return o.table + 1 == tables_.size(); }));
      if (s.table + 1 == tables_.size() && in_active >= kOverflowSeal &&
          tables_.size() < kHardMaxTables && overflow_.size() < kMaxOverflow) {
        seal_due_ = true;
      }
    }
  }
}

template <class Codec>
[[gnu::noinline]] void CompactFilter::kick(const Layout& l, std::uint8_t* block, std::uint32_t from,
                                           typename Codec::Word w, std::uint64_t pos,
                                           std::uint32_t fp, std::uint64_t count) {
  // Both buckets of a new identity are full of live entries: it displaces
  // one, chosen by bits of its position (deterministic, and independent of
  // the bucket contents), which waits in the stash for its other bucket.
  // `count` is the insertion count before this one.
  using Word = typename Codec::Word;
  const auto j = static_cast<unsigned>(pos * kKickMul >> 61) & 3;
  Stashed s;
  s.table = static_cast<std::uint32_t>(tables_.size() - 1);
  s.block = static_cast<std::uint64_t>(block - tables_.back()->data.get()) / l.block_bytes;
  s.fp = field(fields_of(w, l), j, l);
  s.tag = tag_at<Codec>(w, j, l);
  s.to = other(reflection(s.fp, l.per_block), from, l.per_block);
  s.kicks = 1;
  s.ready = count + kStashDelay;
  store_bucket<Word>(block, from, l.bucket_bits, with_slot<Codec>(w, j, view_->age.now_tag, fp, l));
  prefetch_bucket(block, s.to, l.bucket_bits);
  while (wait_count_ == kStash) step_stash(count);  // lines had time to arrive
  push_waiting(s);
}

// --- the insert path -----------------------------------------------------------------

template <class Word>
struct CompactFilter::Slots {
  // The active table's two buckets of an identity, as read by its test.
  std::uint8_t* block = nullptr;
  std::uint32_t fp = 0;
  std::uint32_t b1 = 0;
  std::uint32_t b2 = 0;
  Word w1 = 0;
  Word w2 = 0;
};

template <class Codec>
[[gnu::always_inline]] inline bool CompactFilter::seen(const View& v, const Layout& l, const Key& k,
                                                       Slots<typename Codec::Word>& at) const {
  // True when the identity is alive in some table or the stash. Leaves its
  // buckets in the active table (`l`, the active layout) for add(). The
  // active table first: it holds the most recent, most often repeated
  // identities, and its buckets are where a new one goes.
  using Word = typename Codec::Word;
  at.fp = fp_of(k.mixed, l.fmax);
  const Place p = place_of(k.pos, reflection(at.fp, l.per_block), v.tables[0].blocks, l.per_block);
  at.block = v.tables[0].data + p.block * l.block_bytes;
  at.b1 = p.b1;
  at.b2 = p.b2;
  at.w1 = load_bucket<Word>(at.block, p.b1, l.bucket_bits);
  at.w2 = load_bucket<Word>(at.block, p.b2, l.bucket_bits);
  if ((holding<Codec>(at.w1, at.fp, l, v.age) | holding<Codec>(at.w2, at.fp, l, v.age)) != 0) {
    return true;
  }
  if (v.count > 1 && seen_elsewhere(v, k)) return true;
  // The stash from the filter, not the view: a kick earlier in the run may
  // have added to it.
  return (stash_others_ != 0 || maybe_stashed(at.fp)) && in_stash(k, v.age.now_tag, v.age.window);
}

bool CompactFilter::seen_elsewhere(const View& v, const Key& k) const {
  // The sealed tables, in their own formats.
  for (std::uint32_t s = 1; s < v.count; ++s) {
    const View::Cells& c = v.tables[s];
    const Layout& l = *c.layout;
    const std::uint32_t fp = fp_of(k.mixed, l.fmax);
    bool hit = false;
    switch (l.codec) {
      case Sorted64::kId:
        hit = probe_table<Sorted64>(c.data, c.blocks, l, k.pos, fp, v.age);
        break;
      case Sorted128::kId:
        hit = probe_table<Sorted128>(c.data, c.blocks, l, k.pos, fp, v.age);
        break;
      default:
        hit = probe_table<Plain128>(c.data, c.blocks, l, k.pos, fp, v.age);
        break;
    }
    if (hit) return true;
  }
  return false;
}

template <class Codec>
[[gnu::always_inline]] inline std::uint32_t CompactFilter::add(
    const View& v, const Layout& l, const Key& k, const Slots<typename Codec::Word>& at,
    std::uint64_t count) {
  // A new identity into the active table: a free slot (empty or dead) of the
  // emptier of its buckets, or a kick. `count` is the insertion count before
  // this one. Returns 1 when the slot taken was empty.
  using Word = typename Codec::Word;
  const unsigned free1 = free4<Codec>(at.w1, l, v.age);
  const unsigned free2 = free4<Codec>(at.w2, l, v.age);
  if ((free1 | free2) != 0) [[likely]] {
    const bool second = kBitCount[free2] > kBitCount[free1];
    const Word w = second ? at.w2 : at.w1;
    const auto j = static_cast<unsigned>(std::countr_zero(second ? free2 : free1));
    store_bucket<Word>(at.block, second ? at.b2 : at.b1, l.bucket_bits,
                       with_slot<Codec>(w, j, v.age.now_tag, at.fp, l));
    return field(fields_of(w, l), j, l) == 0;
  }
  const bool second = (k.pos * kKickMul >> 63) != 0;
  kick<Codec>(l, at.block, second ? at.b2 : at.b1, second ? at.w2 : at.w1, k.pos, at.fp, count);
  return 0;
}

void CompactFilter::commit_pending() {
  // Books the insertions of a run (or of one call) into the active table.
  const std::uint64_t n = pending_inserts_;
  if (n == 0) return;
  Table& a = *tables_.back();
  a.alive.ring[view_->tick_slot] += static_cast<std::uint32_t>(n);
  a.alive.sum += n;
  a.inserts += n;
  a.nonempty += pending_filled_;
  a.last_insert = clock_;
  if (insertions_ == 0) first_tick_ = clock_;
  insertions_ += n;
  view_->room = view_->room > n ? view_->room - n : 0;
  pending_inserts_ = 0;
  pending_filled_ = 0;
}

void CompactFilter::count_refresh() {
  // insert() renewed a live copy: counted as an insertion at this tick (the
  // live count may then overestimate, never underestimate).
  pending_inserts_ = 1;
  pending_filled_ = 0;
  commit_pending();
}

template <class Codec>
Decision CompactFilter::decide(const Fingerprint& x) {
  const Key k = key_of<Key>(x);
  Slots<typename Codec::Word> at;
  if (seen<Codec>(*view_, tables_.back()->layout, k, at)) return Decision::kDuplicate;
  if (view_->room == 0 && tables_.back()->inserts > 0 && grow_for_insert()) {
    write_any(k);  // the buckets read belong to the sealed table now
  } else {
    write<Codec>(k, &at);
  }
  return Decision::kDistinct;
}

void CompactFilter::write_any(const Key& k) {
  switch (tables_.back()->layout.codec) {
    case Sorted64::kId:
      return write<Sorted64>(k, nullptr);
    case Sorted128::kId:
      return write<Sorted128>(k, nullptr);
    default:
      return write<Plain128>(k, nullptr);
  }
}

template <class Codec>
void CompactFilter::write(const Key& k, const Slots<typename Codec::Word>* read) {
  // A new identity into the active table (of format Codec), then one step
  // of the stash when its oldest entry is ready, then the seal a failed
  // kick chain asked for. `read`: its buckets if the caller read them.
  using Word = typename Codec::Word;
  const View& v = *view_;
  const Layout& l = tables_.back()->layout;
  Slots<Word> at;
  if (read == nullptr) {
    at.fp = fp_of(k.mixed, l.fmax);
    const Place p =
        place_of(k.pos, reflection(at.fp, l.per_block), v.tables[0].blocks, l.per_block);
    at.block = v.tables[0].data + p.block * l.block_bytes;
    at.b1 = p.b1;
    at.b2 = p.b2;
    at.w1 = load_bucket<Word>(at.block, p.b1, l.bucket_bits);
    at.w2 = load_bucket<Word>(at.block, p.b2, l.bucket_bits);
    read = &at;
  }
  pending_filled_ = add<Codec>(v, l, k, *read, insertions_);
  pending_inserts_ = 1;
  commit_pending();
  if (wait_count_ > 0 && waiting_[wait_head_].ready <= insertions_) step_stash(insertions_);
  if (seal_due_) {
    seal_due_ = false;
    (void)seal_and_grow(Seal::kFull);
  }
}

bool CompactFilter::grow_for_insert() {
  // The active has no room left for the next identity: its fpp share ran
  // out, or, overfull, it is at kMaxLoad.
  return seal_and_grow(overfull_ ? Seal::kFull : Seal::kBudget);
}

template <class Codec>
bool CompactFilter::refresh(const Key& k) {
  // insert(): a live copy in the active table's buckets takes the clock's tag.
  using Word = typename Codec::Word;
  const View& v = *view_;
  const Layout& l = tables_.back()->layout;
  const std::uint32_t fp = fp_of(k.mixed, l.fmax);
  const Place p = place_of(k.pos, reflection(fp, l.per_block), v.tables[0].blocks, l.per_block);
  std::uint8_t* block = v.tables[0].data + p.block * l.block_bytes;
  for (const std::uint32_t b : {p.b1, p.b2}) {
    const Word w = load_bucket<Word>(block, b, l.bucket_bits);
    const unsigned m = holding<Codec>(w, fp, l, v.age);
    if (m == 0) continue;
    const auto j = static_cast<unsigned>(std::countr_zero(m));
    store_bucket<Word>(block, b, l.bucket_bits, with_slot<Codec>(w, j, v.age.now_tag, fp, l));
    return true;
  }
  for (std::size_t i = 0; i < wait_count_; ++i) {
    Stashed& s = waiting_[(wait_head_ + i) % kStash];
    if (s.fp == fp && s.table + 1 == tables_.size() && s.block == p.block &&
        (s.to == p.b1 || s.to == p.b2)) {
      s.tag = v.age.now_tag;
      return true;
    }
  }
  return false;
}

// --- the clock ---------------------------------------------------------------------

template <class Codec>
void CompactFilter::scrub(Table& t, std::uint64_t count, Tick ref, std::uint64_t extra_age) {
  // Empties the slots that are dead at ref + extra_age, in `count` buckets
  // from the sweep position on. A slot's true age is its age at `ref` plus
  // extra_age: exact as long as no tag had wrapped at `ref` (the scrub
  // invariant).
  using Word = typename Codec::Word;
  const Layout& l = t.layout;
  const std::uint32_t window = config_.ticks_per_window;
  const bool all_dead = extra_age > window;
  Age a;
  a.now_tag = static_cast<std::uint32_t>(ref) & l.tag_mask;
  a.window = all_dead ? 0 : static_cast<std::uint32_t>(window - extra_age);
  if (t_ == 4) a.young = young_tables().page(a.window, a.now_tag);
  // Buckets share bytes with their neighbours (they are read and written as
  // whole words): a run is visited in `stride` interleaved passes, so that no
  // load overlaps the store just before it (a store-forwarding stall).
  const unsigned stride = (8 * (sizeof(Word) + 1) + l.bucket_bits - 1) / l.bucket_bits;
  const std::uint64_t buckets = t.buckets();
  std::uint64_t i = t.swept % buckets;
  std::uint64_t cleared = 0;
  for (std::uint64_t left = count; left > 0;) {
    const std::uint64_t block = i / l.per_block;
    const auto first = static_cast<std::uint32_t>(i % l.per_block);
    const auto end =
        static_cast<std::uint32_t>(first + std::min<std::uint64_t>(left, l.per_block - first));
    std::uint8_t* data = t.block(block);
    __builtin_prefetch(data + l.block_bytes, 1, 0);
    for (unsigned pass = 0; pass < stride; ++pass) {
      for (std::uint32_t b = first + pass; b < end; b += stride) {
        const Word w = load_bucket<Word>(data, b, l.bucket_bits);
        const unsigned full = ~zero_fields(fields_of(w, l), l) & 0xF;
        const unsigned dead = all_dead ? full : full & ~young4<Codec>(w, l, a);
        // Stored unconditionally: whether a bucket holds a dead entry is
        // close to a coin flip, and a mispredicted branch costs more.
        store_bucket<Word>(data, b, l.bucket_bits,
                           w & ~(static_cast<Word>(l.field_mask[dead]) << l.code_bits));
        cleared += kBitCount[dead];
      }
    }
    left -= end - first;
    i = i + (end - first) == buckets ? 0 : i + (end - first);
  }
  t.nonempty -= cleared;
  t.swept += count;
}

void CompactFilter::clear_all(Tick now) {
  // Every entry was inserted at or before the old clock, more than W ago:
  // nothing is alive, so the filter returns to its floor (a pause longer
  // than the window frees what the last load needed).
  wait_count_ = 0;
  overflow_.clear();
  std::fill(tick_fpp_.begin(), tick_fpp_.end(), 0.0);
  const Shape floor = shape_within(config_.min_bytes, min_f_);
  if (tables_.back()->bytes() > bytes_of(floor, min_f_)) {
    clock_ = now;  // the new table's creation tick
    if (auto t = charged_table(floor, min_f_)) {
      tables_.clear();
      tables_.push_back(std::move(t));
      return;
    }
    // Out of memory even for the floor: empty the active in place.
  }
  Table& active = *tables_.back();
  std::memset(active.data.get(), 0, active.bytes());
  active.nonempty = 0;
  active.swept = 0;
  active.created = now;
  active.last_insert = now;
  active.inserts = 0;
  active.alive.init(config_.ticks_per_window);
  std::unique_ptr<Table> keep = std::move(tables_.back());
  tables_.clear();
  tables_.push_back(std::move(keep));
}

void CompactFilter::drop_expired() {
  // Overflow entries whose tag left the window, then sealed tables whose
  // newest insertion did (their overflow entries are older still).
  const std::uint32_t window = config_.ticks_per_window;
  const std::uint32_t mask = (1U << t_) - 1;
  const auto now_tag = static_cast<std::uint32_t>(clock_) & mask;
  std::erase_if(overflow_, [&](const Stashed& s) { return ((now_tag - s.tag) & mask) > window; });
  std::vector<std::uint32_t> index(tables_.size(), 0);
  std::vector<std::unique_ptr<Table>> kept;
  for (std::size_t i = 0; i < tables_.size(); ++i) {
    const bool active = i + 1 == tables_.size();
    if (!active && (tables_[i]->inserts == 0 || clock_ - tables_[i]->last_insert > window)) {
      continue;
    }
    index[i] = static_cast<std::uint32_t>(kept.size());
    kept.push_back(std::move(tables_[i]));
  }
  for (Stashed& s : overflow_) s.table = index[s.table];
  tables_ = std::move(kept);
}

[[gnu::noinline]] void CompactFilter::move_clock(Tick now) {
  while (wait_count_ > 0) step_stash(insertions_);  // waiting entries never cross a tick
  if (seal_due_) {
    seal_due_ = false;
    (void)seal_and_grow(Seal::kFull);
  }
  const Tick old = clock_;
  const std::uint32_t window = config_.ticks_per_window;
  // The estimate during the tick that ends: the mean of its start and end;
  // 0 for ticks without insertions (arrivals() never reads them), so that
  // the state does not depend on which clock values were visited.
  const std::size_t ring = tick_fpp_.size();
  std::uint64_t inserted = 0;
  for (const auto& t : tables_) inserted += t->alive.at(old);
  double& during = tick_fpp_[old % ring];
  during = inserted > 0 ? 0.5 * (during + fpp_budget_used()) : 0.0;
  for (Tick x = old + 1; x < now && x - old < ring; ++x) tick_fpp_[x % ring] = 0.0;
  if (now - old > window) {
    clear_all(now);
    clock_ = now;
  } else {
    for (auto& t : tables_) {
      // By clock `now` the schedule requires required(now) buckets; a jump
      // longer than one sweep visits every bucket once.
      const std::uint64_t need = t->required(now, period_);
      if (need <= t->swept) continue;
      const std::uint64_t todo = std::min(need - t->swept, t->buckets());
      switch (t->layout.codec) {
        case Sorted64::kId:
          scrub<Sorted64>(*t, todo, old, now - old);
          break;
        case Sorted128::kId:
          scrub<Sorted128>(*t, todo, old, now - old);
          break;
        default:
          scrub<Plain128>(*t, todo, old, now - old);
          break;
      }
      t->swept = std::max(t->swept, need);
    }
    for (auto& t : tables_) t->alive.advance(old, now, window);
    clock_ = now;
    drop_expired();
  }
  tick_fpp_[clock_ % tick_fpp_.size()] = fpp_budget_used();  // at the new tick's start
  overfull_ = false;
  observe_budget();
  publish_demand();
  refresh_view();
  maybe_replace();
  refresh_limit();  // and the view
}

void CompactFilter::advance(Tick now) {
  if (now > clock_) move_clock(now);
}

// --- the interface -------------------------------------------------------------------

Decision CompactFilter::test_and_insert(const Fingerprint& fp, Tick now) {
  if (now > clock_) move_clock(now);
  switch (tables_.back()->layout.codec) {
    case Sorted64::kId:
      return decide<Sorted64>(fp);
    case Sorted128::kId:
      return decide<Sorted128>(fp);
    default:
      return decide<Plain128>(fp);
  }
}

template <class Codec>
void CompactFilter::run_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                              std::span<Decision> out, std::size_t& i) {
  // Decisions are made strictly in order, by the one-by-one path's functions,
  // so they and the state equal the one-by-one calls. The work is split into
  // runs of elements at one clock value: inside a run the active table's
  // layout is a local copy and insertions are booked once at its end (the
  // stash's clock counts them as they happen). A run ends early when the
  // active table is full (that element goes through the one-by-one path,
  // which seals it) or a failed kick chain sealed it; the caller then picks
  // the new active table's format. The buckets of every table are
  // prefetched kPrefetchDistance elements ahead (a table added mid-batch
  // only misses a hint).
  using Word = typename Codec::Word;
  const std::size_t n = fps.size();
  // always_inline, as prefetch_bucket is.
  auto prefetch = [&](const View& v, const Fingerprint& x) __attribute__((always_inline)) {
    const Key k = key_of<Key>(x);
    for (std::uint32_t s = 0; s < v.count; ++s) {
      const Layout& l = *v.tables[s].layout;
      const std::uint32_t fp = fp_of(k.mixed, l.fmax);
      const Place p = place_of(k.pos, reflection(fp, l.per_block), v.tables[s].blocks, l.per_block);
      const std::uint8_t* block = v.tables[s].data + p.block * l.block_bytes;
      prefetch_bucket(block, p.b1, l.bucket_bits);
      prefetch_bucket(block, p.b2, l.bucket_bits);
    }
  };
  for (std::size_t j = i; j < std::min(n, i + kPrefetchDistance); ++j) prefetch(*view_, fps[j]);
  while (i < n) {
    if (ticks[i] > clock_) move_clock(ticks[i]);
    if (tables_.back()->layout.codec != Codec::kId) return;
    const View& v = *view_;
    const Layout l = tables_.back()->layout;
    const std::uint64_t base = insertions_;
    std::uint64_t inserted = 0, filled = 0;
    bool full = false;  // element i is new and the active table must be sealed first
    bool sealed = false;
    for (; i < n && ticks[i] <= clock_; ++i) {
      if (i + kPrefetchDistance < n) prefetch(v, fps[i + kPrefetchDistance]);
      const Key k = key_of<Key>(fps[i]);
      Slots<Word> at;
      if (seen<Codec>(v, l, k, at)) {
        out[i] = Decision::kDuplicate;
        continue;
      }
      if (inserted >= v.room) {
        full = true;
        break;
      }
      filled += add<Codec>(v, l, k, at, base + inserted);
      out[i] = Decision::kDistinct;
      ++inserted;
      if (wait_count_ > 0 && waiting_[wait_head_].ready <= base + inserted) [[unlikely]] {
        step_stash(base + inserted);
      }
      if (seal_due_) [[unlikely]] {  // a kick chain failed: book the run, then seal
        ++i;
        break;
      }
    }
    pending_inserts_ = inserted;
    pending_filled_ = filled;
    commit_pending();
    if (seal_due_) {
      seal_due_ = false;
      (void)seal_and_grow(Seal::kFull);
      sealed = true;
    }
    if (full) {
      out[i] = decide<Codec>(fps[i]);
      ++i;
      sealed = true;
    }
    if (sealed) return;  // the caller picks the format of the new active table
  }
}

void CompactFilter::test_and_insert_batch(std::span<const Fingerprint> fps,
                                          std::span<const Tick> ticks, std::span<Decision> out) {
  std::size_t done = 0;
  while (done < fps.size()) {
    if (ticks[done] > clock_) move_clock(ticks[done]);
    switch (tables_.back()->layout.codec) {
      case Sorted64::kId:
        run_batch<Sorted64>(fps, ticks, out, done);
        break;
      case Sorted128::kId:
        run_batch<Sorted128>(fps, ticks, out, done);
        break;
      default:
        run_batch<Plain128>(fps, ticks, out, done);
        break;
    }
  }
}

void CompactFilter::insert(const Fingerprint& x, Tick now) {
  if (now > clock_) move_clock(now);
  const Key k = key_of<Key>(x);
  bool refreshed = false;
  switch (tables_.back()->layout.codec) {
    case Sorted64::kId:
      refreshed = refresh<Sorted64>(k);
      break;
    case Sorted128::kId:
      refreshed = refresh<Sorted128>(k);
      break;
    default:
      refreshed = refresh<Plain128>(k);
      break;
  }
  if (refreshed) return count_refresh();
  if (view_->room == 0 && tables_.back()->inserts > 0) (void)grow_for_insert();
  write_any(k);
}

bool CompactFilter::contains(const Fingerprint& x, Tick now) const {
  // Ages at `now` are the ages at the clock plus the difference (exact: the
  // scrub keeps every tag unwrapped at the clock).
  const Tick later = now > clock_ ? now - clock_ : 0;
  if (later > config_.ticks_per_window) return false;
  View v = *view_;
  v.age.window = static_cast<std::uint32_t>(config_.ticks_per_window - later);
  if (t_ == 4) v.age.young = young_tables().page(v.age.window, v.age.now_tag);
  const Key k = key_of<Key>(x);
  for (std::uint32_t s = 0; s < v.count; ++s) {
    const View::Cells& c = v.tables[s];
    const Layout& l = *c.layout;
    const std::uint32_t fp = fp_of(k.mixed, l.fmax);
    bool hit = false;
    switch (l.codec) {
      case Sorted64::kId:
        hit = probe_table<Sorted64>(c.data, c.blocks, l, k.pos, fp, v.age);
        break;
      case Sorted128::kId:
        hit = probe_table<Sorted128>(c.data, c.blocks, l, k.pos, fp, v.age);
        break;
      default:
        hit = probe_table<Plain128>(c.data, c.blocks, l, k.pos, fp, v.age);
        break;
    }
    if (hit) return true;
  }
  return in_stash(k, v.age.now_tag, v.age.window);
}

// --- stats and snapshots --------------------------------------------------------------

FilterStats CompactFilter::stats() const {
  FilterStats st;
  double none = 1.0;
  for (const auto& t : tables_) {
    st.bytes += t->bytes() + t->alive.ring.size() * sizeof(std::uint32_t);
    st.cells += t->slots();
    st.live_cells += t->nonempty;
    none *= 1.0 - table_fpp(*t);
  }
  st.bytes += (kStash + overflow_.capacity()) * sizeof(Stashed);
  st.live_cells += stash_size();
  st.subfilters = static_cast<std::uint32_t>(tables_.size());
  st.insertions = insertions_;
  st.fpp_estimate = 1.0 - none;
  return st;
}

std::vector<std::uint64_t> CompactFilter::table_bytes() const {
  std::vector<std::uint64_t> out;
  for (const auto& t : tables_) out.push_back(t->bytes());
  return out;
}

std::vector<unsigned> CompactFilter::table_fingerprint_bits() const {
  std::vector<unsigned> out;
  for (const auto& t : tables_) out.push_back(t->layout.f);
  return out;
}

namespace {

constexpr std::size_t kStashedBytes = 4 + 8 + 4 + 4 + 4 + 4 + 8;

void put_stashed(ByteWriter& w, const auto& s) {
  w.put<std::uint32_t>(s.table);
  w.put<std::uint64_t>(s.block);
  w.put<std::uint32_t>(s.to);
  w.put<std::uint32_t>(s.fp);
  w.put<std::uint32_t>(s.tag);
  w.put<std::uint32_t>(s.kicks);
  w.put<std::uint64_t>(s.ready);
}

}  // namespace

std::string CompactFilter::serialize() const {
  // The payload is written once, after room for the envelope header, into a
  // buffer reserved at its final size (the tables are nearly all the bytes).
  std::uint64_t tail = 8 + stash_size() * kStashedBytes + tick_fpp_.size() * 8;
  for (const auto& t : tables_) tail += 53 + t->alive.ring.size() * 4 + t->bytes();
  std::string out(kEnvelopeHeaderBytes, '\0');
  ByteWriter w(out);
  write_config(w, config_);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(f_));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(t_));
  w.put<Tick>(clock_);
  w.put<Tick>(first_tick_);
  w.put<std::uint64_t>(insertions_);
  for (double p : tick_fpp_) w.put<double>(p);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(tables_.size()));
  out.reserve(out.size() + tail + kEnvelopeTrailerBytes);
  for (const auto& t : tables_) {
    w.put<std::uint8_t>(static_cast<std::uint8_t>(t->layout.f));
    w.put<std::uint32_t>(t->layout.per_block);
    w.put<std::uint64_t>(t->blocks);
    w.put<Tick>(t->created);
    w.put<std::uint64_t>(t->swept);
    w.put<Tick>(t->last_insert);
    w.put<std::uint64_t>(t->inserts);
    w.put<std::uint64_t>(t->nonempty);
    for (std::uint32_t c : t->alive.ring) w.put<std::uint32_t>(c);
    w.put_bytes(std::string_view(reinterpret_cast<const char*>(t->data.get()), t->bytes()));
  }
  w.put<std::uint32_t>(static_cast<std::uint32_t>(stash_size()));
  w.put<std::uint32_t>(static_cast<std::uint32_t>(wait_count_));
  for (std::size_t i = 0; i < wait_count_; ++i) {
    put_stashed(w, waiting_[(wait_head_ + i) % kStash]);
  }
  for (const Stashed& s : overflow_) put_stashed(w, s);
  return seal_envelope_in_place(static_cast<std::uint16_t>(FilterType::kCompact), kVersion,
                                std::move(out));
}

template <class Codec>
bool CompactFilter::buckets_consistent(const Table& t) const {
  // Every bucket's tag code is one the format produces, the bits after a
  // block's last bucket are zero, and the non-empty slots add up to the
  // recorded count.
  using Word = typename Codec::Word;
  const Layout& l = t.layout;
  const std::uint64_t used_bits = std::uint64_t{l.per_block} * l.bucket_bits;
  std::uint64_t nonempty = 0;
  for (std::uint64_t b = 0; b < t.blocks; ++b) {
    const std::uint8_t* data = t.block(b);
    for (std::uint32_t i = 0; i < l.per_block; ++i) {
      const Word w = load_bucket<Word>(data, i, l.bucket_bits);
      if constexpr (Codec::kSorted) {
        if ((static_cast<std::uint32_t>(w) & 0xFFF) >= SortedTags::kCodes) return false;
      }
      nonempty += 4 - kBitCount[zero_fields(fields_of(w, l), l)];
    }
    for (std::uint64_t bit = used_bits; bit < l.block_bytes * 8; ++bit) {
      if ((data[bit >> 3] >> (bit & 7) & 1) != 0) return false;
    }
  }
  return nonempty == t.nonempty;
}

Result<std::unique_ptr<SlidingFilter>> CompactFilter::restore(std::string_view payload,
                                                              std::uint16_t version) {
  auto bad = [](const std::string& what) { return fail("compact filter state: " + what); };
  if (version != kVersion) return bad("unsupported format version " + std::to_string(version));
  ByteReader r(payload);
  auto config = read_config(r);
  if (!config) return tl::unexpected(config.error());
  if (config->type != FilterType::kCompact) return bad("wrong filter type in config");
  auto f_bits = r.get<std::uint8_t>("fingerprint bits");
  auto t_bits = r.get<std::uint8_t>("tag bits");
  auto clock = r.get<Tick>("clock");
  auto first_tick = r.get<Tick>("first tick");
  auto insertions = r.get<std::uint64_t>("insertions");
  if (!f_bits || !t_bits || !clock || !first_tick || !insertions) return bad("truncated header");
  if (config->ticks_per_window > kMaxCompactTicksPerWindow) return bad("ticks_per_window");
  std::vector<double> tick_fpp(std::uint64_t{config->ticks_per_window} + 2);
  for (double& p : tick_fpp) {
    auto v = r.get<double>("tick estimates");
    if (!v) return bad("truncated tick estimates");
    if (!(*v >= 0.0 && *v <= 1.0)) return bad("tick estimate out of range");
    p = *v;
  }
  auto count = r.get<std::uint32_t>("table count");
  if (!count) return bad("truncated header");
  if (*count == 0 || *count > kHardMaxTables) {
    return bad("table count " + std::to_string(*count) + " out of range");
  }
  if (*first_tick > *clock) return bad("first tick after clock");
  // Rebuild the empty shell from the config, then check the derived fields.
  auto made = make_empty(*config);
  if (!made) return bad(made.error().message);
  std::unique_ptr<CompactFilter> f = std::move(*made);
  if (*f_bits != f->f_ || *t_bits != f->t_) return bad("bit widths do not match the config");
  // Tables may be as narrow as the highest budget pressure allows.
  const unsigned narrowest = compact_fingerprint_bits(std::max(config->fpp, kMaxEffectiveFpp));
  f->clock_ = *clock;
  f->first_tick_ = *first_tick;
  f->insertions_ = *insertions;
  f->tick_fpp_ = std::move(tick_fpp);
  const std::uint32_t window = config->ticks_per_window;
  for (std::uint32_t i = 0; i < *count; ++i) {
    auto width = r.get<std::uint8_t>("table fingerprint bits");
    auto per_block = r.get<std::uint32_t>("buckets per block");
    auto blocks = r.get<std::uint64_t>("blocks");
    auto created = r.get<Tick>("created");
    auto swept = r.get<std::uint64_t>("swept");
    auto last_insert = r.get<Tick>("last insert");
    auto inserts = r.get<std::uint64_t>("inserts");
    auto nonempty = r.get<std::uint64_t>("nonempty");
    if (!width || !per_block || !blocks || !created || !swept || !last_insert || !inserts ||
        !nonempty) {
      return bad("truncated table header");
    }
    if (*width < narrowest || *width > f->max_f_) return bad("table fingerprint bits out of range");
    if (*per_block < 2 || *per_block > Layout::max_per_block(*width, f->t_)) {
      return bad("buckets per block out of range");
    }
    const Layout layout = Layout::of(*width, f->t_, *per_block);
    if (*blocks == 0 || *blocks > r.remaining() / layout.block_bytes) {
      return bad("table size exceeds input");
    }
    if (*created > *clock || *last_insert > *clock || *last_insert < *created) {
      return bad("table ticks inconsistent with the clock");
    }
    auto t = std::make_unique<Table>();
    t->layout = layout;
    t->blocks = *blocks;
    if (*nonempty > t->slots()) return bad("live slot count exceeds slots");
    t->alive.init(window);
    if (t->alive.ring.size() > r.remaining() / 4) return bad("window counts exceed input");
    for (std::uint32_t& c : t->alive.ring) {
      c = *r.get<std::uint32_t>("window counts");
      t->alive.sum += c;
    }
    if (t->alive.sum > *inserts) return bad("window count exceeds insertions");
    if (t->alive.at(*clock + 1) != 0) return bad("window counts do not match the clock");
    for (Tick x = *clock - std::min<Tick>(*clock, window); x < *created; ++x) {
      if (t->alive.at(x) != 0) return bad("window counts before the table was created");
    }
    auto cells = r.get_bytes(t->bytes(), "buckets");
    if (!cells) return bad("truncated buckets");
    t->data.reset(allocate_blocks(t->bytes() + kTailBytes));
    if (!t->data) return bad("cannot allocate " + std::to_string(t->bytes()) + " bytes");
    std::memcpy(t->data.get(), cells->data(), cells->size());
    t->created = *created;
    t->swept = *swept;
    t->last_insert = *last_insert;
    t->inserts = *inserts;
    t->nonempty = *nonempty;
    if (t->swept < t->required(*clock, f->period_) ||
        t->swept > t->required(*clock + 1, f->period_)) {
      return bad("scrub position inconsistent with the clock");
    }
    bool ok = false;
    switch (t->layout.codec) {
      case Sorted64::kId:
        ok = f->buckets_consistent<Sorted64>(*t);
        break;
      case Sorted128::kId:
        ok = f->buckets_consistent<Sorted128>(*t);
        break;
      default:
        ok = f->buckets_consistent<Plain128>(*t);
        break;
    }
    if (!ok) return bad("buckets inconsistent with the recorded live slots");
    f->tables_.push_back(std::move(t));
  }
  auto stashed = r.get<std::uint32_t>("stash size");
  auto waiting = r.get<std::uint32_t>("stash waiting");
  if (!stashed || !waiting) return bad("truncated stash");
  if (*stashed > kMaxOverflow + kStash || *waiting > *stashed || *waiting > kStash) {
    return bad("stash sizes out of range");
  }
  if (*stashed > r.remaining() / kStashedBytes) return bad("stash exceeds input");
  const std::uint32_t tag_mask = (1U << f->t_) - 1;
  for (std::uint32_t i = 0; i < *stashed; ++i) {
    Stashed s;
    s.table = *r.get<std::uint32_t>("stash table");
    s.block = *r.get<std::uint64_t>("stash block");
    s.to = *r.get<std::uint32_t>("stash bucket");
    s.fp = *r.get<std::uint32_t>("stash fingerprint");
    s.tag = *r.get<std::uint32_t>("stash tag");
    s.kicks = *r.get<std::uint32_t>("stash kicks");
    s.ready = *r.get<std::uint64_t>("stash ready");
    const bool waits = i < *waiting;
    const bool table_ok = s.table < f->tables_.size();
    const Table* t = table_ok ? f->tables_[s.table].get() : nullptr;
    if (!table_ok || s.block >= t->blocks || s.to >= t->layout.per_block || s.fp == 0 ||
        s.fp > t->layout.fmax || s.tag > tag_mask || ((*clock - s.tag) & tag_mask) > window ||
        s.kicks == 0 || s.kicks > kMaxKicks + 1 || waits != (s.kicks <= kMaxKicks) ||
        s.ready > *insertions + kStashDelay) {
      return bad("stash entry " + std::to_string(i) + " inconsistent");
    }
    if (waits) {
      f->waiting_[f->wait_count_++] = s;
    } else {
      f->overflow_.push_back(s);
    }
  }
  if (auto end = r.expect_end("compact filter state"); !end) return tl::unexpected(end.error());
  f->refresh_limit();
  return std::unique_ptr<SlidingFilter>(std::move(f));
}

}  // namespace kdedup::filter
