#pragma once
// CompactFilter: a table of 64-byte lines of short fingerprints (quotient
// and remainder) whose entries carry a wrapping tick tag. The least memory
// per in-window identity of the filter family, with the timer filter's
// window edge of one tick, and no cuckoo kicks.
//
// Lines (the block store of Morton filters: Breslow and Jayasena, "Morton
// Filters: Faster, Space-Efficient Cuckoo Filters via Biasing, Compression,
// and Decoupled Logical Sparsity", PVLDB 11(9), 2018; the mini-filters of
// vector quotient filters: Pandey, Conway, Durie, Bender, Farach-Colton,
// Johnson, "Vector Quotient Filters", SIGMOD 2021). A line holds up to S
// entries in B logical buckets: an identity's bucket q (its quotient) is not
// stored, only a unary count per bucket (B + S code bits), and an entry
// keeps an r-bit remainder and a t-bit tag. A bucket holds as many entries as
// the line has room for, so a line fills evenly whatever its buckets draw.
// Bit layout and invariants: lib/src/filter/compact_line.h.
//
// Two choices, no kicks (Azar, Broder, Karlin, Upfal, "Balanced
// Allocations", SIAM J. Comput. 29(1), 1999; as in vector quotient filters).
// An identity has two candidate lines anywhere in the table and goes to the
// one with fewer live entries. The fullest lines stay a few entries above
// the mean, whatever the table's size: a table filled within one tick first
// finds both lines of an identity full at a load of 0.949 at fpp 1% (37
// slots), 0.924 at 0.1% (29 slots). In the sliding-window steady state a
// table is sized for the load safe_load() gives (compact_line.h): 0.9 up
// to three slots short of full at the default ten ticks, about four slots
// short with long windows, where the load stays at its peak (below 0.9 for
// lines of fewer than 30 slots or windows over 13 ticks). The previous
// cuckoo table (four-slot buckets) moved an entry for a third of its
// insertions at 0.9. An insertion that does find both lines full goes to a
// small overflow list searched by queries; kOverflowSeal of them, plus one
// per kOverflowPer live entries, mean the table is full. A live entry is
// never evicted.
//
// Tags (seed 000 §4: store the insertion tick, judge age at read time). A
// tag is the tick mod M, M = 2^t; an entry is alive at `now` iff
// (now - tag) mod M <= W (W = ticks_per_window), so an identity is
// remembered at least `window` and at most `window + one tick`
// (sliding_filter.h). The tag width follows from W (W <= M - 3 leaves the
// scrub a margin): t = 4 for W <= 13 (default W = 10: one tick is 10% of
// the window), t = 5 .. 8 up to W = 253.
//
// Compaction. A line's stamp (t bits) is the tag of the tick it was last
// compacted at: compaction removes its dead entries. The active table
// compacts a line the first time an operation touches it in a tick, so
// every entry the hot path sees is alive and a line's entry count is its
// live count: the two-choice rule compares exact loads and queries never
// look at tags. Sealed tables are only read, with the tags of matching
// entries checked. A busy active table (at least one insertion per line in
// the tick that ended) has every line compacted when the clock moves, in
// memory order: it would have nearly all of them compacted on first touch
// anyway, and there whether a line is stale is a branch the hot path
// mispredicts about once in six touches.
//
// Scrub (why a wrapping tag never resurrects an entry; the timer filter's
// argument, timer_filter.h). An entry written at tick s reads its true age
// while now - s <= M - 1 and is dead from s + W + 1: it must be removed
// during the G = M - 1 - W clock values in between. Each table compacts its
// lines in memory order on a schedule that visits every line at least once
// every G ticks (P = G - 1 ticks per sweep), when the clock moves; a jump
// longer than W empties everything. The same bound keeps a stamp from
// aliasing: a line is compacted at least every M - 1 ticks.
//
// False positives. A query compares its remainder with the entries of its
// bucket in its two lines, 2 S alpha / B of them at live load alpha, so a
// table's false-positive probability is
//   p(alpha) = 1 - (1 - 2^-r)^(2 S alpha / B).
// A table's shape (r, S, B) is the one with the most slots per line (the
// fewest bits per entry) whose p at kFingerprintLoad is within kBudgetShare
// of its target; with 4-bit tags (docs/performance.md, seed 002 Table 2):
//   fpp 10%:  r = 4,  S = 49, B = 67:  11.6 bits per in-window identity
//   fpp 1%:   r = 7,  S = 37, B = 64:  15.4
//   fpp 0.1%: r = 11, S = 29, B = 44:  19.6
// at the target load of 0.9 (512 bits / (S x 0.9)); at 0.1% safe_load()
// gives 0.897 (19.7 bits).
//
// Vector path. On x86-64 CPUs with AVX-512 (F, BW, VL, VBMI, VBMI2) and
// BMI2, a line is one register: its entries' remainders (and tags) are
// unpacked into byte lanes (remainders of at most 8 bits) or 16-bit lanes by
// a byte permute and a multishift and compared with the query's all at
// once, the bucket is found with pdep on the code, and an insertion is a
// funnel shift of the code and entry regions (w <= 16 bits an entry; wider
// entries take the portable path). Both paths give the
// same decisions and bytes (tests/unit/filter/compact_filter_test.cc);
// KDEDUP_SIMD / set_simd() below avx512 selects the portable one (simd.h).
//
// Memory follows load (DESIGN.md; growth by adding filters: seed 001,
// seed 000 §5; the tightening of scalable Bloom filters; the rate-based size
// of seed 002 eq. 6). `capacity` is not used: the first table is the floor
// min_bytes whatever the hint (a smaller one fills within its first tick
// and holds most of the fpp budget while its successor fills).
// New identities go to the newest (active) table; queries read every table.
// Budget rule (the timer filter's): with f* the effective target (config.fpp,
// raised by a shared MemoryBudget under pressure) and S the summed p(alpha)
// of the sealed tables, the active one may hold a live load whose p stays at
// or under kBudgetShare * (f* - S); live loads come from exact per-tick
// insertion counts of the last W + 1 ticks, so S only falls between seals
// and the union bound sum p <= f* holds while the filter can grow (for an
// active that took over at a tick's start, the share applies to S as it
// will be at the next tick, capped by f* - S now: a table is not sealed for
// a budget its predecessors free a tick later).
// The active table is sealed when its live load would pass kMaxLoad or its
// budget, or when its overflow entries reach the bound above. The table
// added then is sized by new_table_bytes() for the recent rate of new
// identities over a window at target_load() (before one whole tick has been
// seen, kMaxGrowthStep times what the sealed one held; at most that when
// the sealed one was added in this tick and filled in it too while the tick
// brought more than the recent mean: a surge within the tick is not
// extrapolated to a window, and a step that lasts is sized from its whole
// ticks a table later), with the coarsest
// shape whose p at kTargetLoad fits the budget the sealed tables leave: a
// table added while others still hold most of the budget has wider
// remainders instead of many times more lines. Once the rate is known, that
// budget is planned over the window the new table fills in, as the sealed
// tables drain (planned_budget(): at each of its ticks the room rule must
// hold; the tick in progress may bring kMaxGrowthStep ticks' worth when it
// already brought more than the recent mean), which often allows the base
// shape: a finer table, once alone, is replaced (below), and the two are
// held together for a window. A table added before the rate was known (the
// floor, a probe) is sealed at the first tick the rate is known if a window
// at that rate needs more than it may hold, so that it holds one tick's
// entries and little of the budget. Neither plan applies under memory
// budget pressure (tables then get less than they ask for and fill sooner).
// A sealed table is freed once its newest insertion is older than the
// window. The active table is folded in place, or else replaced by a
// right-sized one at the coarsest shape f* allows, as soon as it is
// kFallFactor times too big for the recent rate (the mean of the last W / 4
// ticks; nothing arriving: the floor); one that still holds half of what it
// may waits until it folds or holds less. After a burst of repeats the rate
// of new identities dips and climbs back over a window (the burst's
// identities leave it), so this rule waits while the last tick brought
// kClimbFactor times the new identities of the one before, and when the
// ticks of its mean straddle the fall (one brought kFallFactor times
// another) the replacement holds kFoldHeadroom times the mean, and at least
// a window at the busiest of those ticks' rate. A fold by a factor
// f dividing the line count merges lines fj .. fj + f - 1 into line j: an
// entry in line x = mulhi(h, L) of either choice belongs in mulhi(h, L / f)
// = floor(x / f), and its bucket and remainder do not depend on L, so
// nothing but the lines is needed (the timer filter's fold, seed 000 §5).
// It is taken when the table then holds kFoldHeadroom times its live count
// or the recent rate's window and no merged line has more live entries
// than slots. Every new table's line count is a multiple of kLineGrain, so
// that folds by 2, 4, 8 and 16 divide it (unless a budget granted it less). And,
// once alone for a whole window, when it is kShrinkFactor times too big for
// the window's live count (kRefitShrinkFactor for a table already sized for
// a measured rate, a replacement or a folded table: a second replacement
// holds two tables for a window to save a few percent) while the recent
// rate needs at least 1 / kSteadyRate of that count (it lags a burst
// leaving the window; the new table holds the recent rate's window instead
// when that is kClimbFactor times the count, which lags a climbing rate,
// and a table sized after a fall gets kFoldHeadroom over both while the last
// tick brought kClimbFactor times the new identities of the tick R before),
// or finer than f* requires (a table the growth added only when the
// coarser replacement saves kShrinkFactor too; for its shape alone, a
// refitted table's successor keeps kFoldHeadroom over the live count, which
// lags a rate climbing back after a burst); the new table only takes what
// arrives from then on, and
// the old one drains within a window. A clock jump past the window returns
// the filter to its floor at once. Rates and loads count new identities
// that arrived: a tick's deliveries divided by 1 - the estimate during that
// tick (kept per tick), so that a ramp-up's fuller tables do not undersize
// the table that follows.
//
// Memory budget (memory_budget.h). The tables held when a budget is
// attached (a restored snapshot) and the floor table of a filter that
// starts or returns to its floor are charged; every other table is reserved
// before it is allocated (reserve_up_to: a growth table may get less than
// it asked for, and fills sooner), and each table releases its bytes when it
// is freed. Under pressure the effective target f* rises for every filter
// at once: new and replacement tables take the coarsest shape f* allows (a
// lone table is replaced by a coarser one, so the filter shrinks), and the
// active may fill further before it is sealed. While the total demand
// exceeds the limit, a new table is no larger than this filter's share of
// the limit (in proportion to its demand at the target), the filters that
// have not published a demand yet counted as needing what this one does: a
// compact table is not given back before it drains, so the first partition
// to grow at startup must not take the others' share. When the active
// table is full and the budget refuses a new one, the filter trades
// accuracy for room without asking for memory: first a sealed table with an
// eighth of its slots free becomes the active one again; then the active
// table is narrowed in place (its remainders lose their top bits, the fewest
// that give a line an eighth more slots: at fpp 1%, 2 bits for 19% more
// room at 4x the false-positive rate; shorter fingerprints for more
// entries, as filters that grow without knowing their size do: Pagh, Segev,
// Wieder, "How to Approximate a Set Without Knowing Its Size in Advance",
// FOCS 2013; InfiniFilter, Dayan et al., SIGMOD 2023); at the narrowest
// shape (2-bit remainders) a new identity that finds no room is judged a
// duplicate (a false positive: nothing to remember, so no false negative),
// and the share so judged within the window is added to the estimate. So
// the compact filter never holds more than the budget and its floor, and
// its estimate covers what it does (docs/performance.md, "Memory budget").
//
// Serialized form: envelope kind FilterType::kCompact, version 2 (lines;
// version 1, the cuckoo buckets, is refused: config_fingerprint() differs
// too, so a snapshot store turns it down as a changed configuration before
// reading it), checksummed; restore validates every field (shapes and sizes,
// tick order, scrub position, each line's code and unused bits, a fresh
// stamp only over live entries, live counts against the entries, overflow
// entries).
//
// Threading: owned by one thread (the worker owning its Slice); no method is
// thread-safe.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/filter/memory_budget.h"
#include "kdedup/filter/sliding_filter.h"

namespace kdedup {
class ByteReader;
}  // namespace kdedup

namespace kdedup::filter {

namespace compact {
/// The shape of a compact table's lines: remainder bits, slots and buckets
/// per line (the tag width is the filter's). lib/src/filter/compact_line.h
/// has the bit layout.
struct Shape {
  unsigned r = 0;
  unsigned S = 0;
  unsigned B = 0;
  friend bool operator==(const Shape&, const Shape&) = default;
};
struct Key;
struct Age;
struct Line;
struct Layout;
}  // namespace compact

/// Largest ticks_per_window of the compact filter (8-bit tags).
constexpr std::uint32_t kMaxCompactTicksPerWindow = 253;

/// Tag bits the compact filter uses for `ticks_per_window` (4 .. 8), or 0
/// when it is out of range.
[[nodiscard]] constexpr unsigned compact_tag_bits(std::uint32_t ticks_per_window) {
  for (unsigned t = 4; t <= 8; ++t) {
    if (ticks_per_window <= (1U << t) - 3) return t;
  }
  return 0;
}

/// Remainder bits of the compact filter's base shape at target `fpp` with
/// `tag_bits`-bit tags (see above).
[[nodiscard]] unsigned compact_fingerprint_bits(double fpp, unsigned tag_bits = 4);

/// True when some line shape reaches `fpp` with `tag_bits`-bit tags.
[[nodiscard]] bool compact_fpp_supported(double fpp, unsigned tag_bits);

/// Format version of the compact filter's serialized state.
inline constexpr std::uint16_t kCompactStateVersion = 2;

class CompactFilter final : public SlidingFilter {
 public:
  /// Live load new tables are sized for, at most (target_load()).
  static constexpr double kTargetLoad = 0.9;
  /// Live load at which the active table is sealed.
  static constexpr double kMaxLoad = 0.95;
  /// Load the base shape is chosen for (within kBudgetShare of the target):
  /// a lone table may fill to kMaxLoad on its budget.
  static constexpr double kFingerprintLoad = kMaxLoad;
  /// Share of the remaining fpp budget the active table may use.
  static constexpr double kBudgetShare = 0.9;
  /// A lone table this many times too big for its live count is replaced
  /// (the cost: one window with both). 1.04: at fpp 1% a table sized while
  /// a stream's distinct rate still fell ends within 16 bits an identity.
  static constexpr double kShrinkFactor = 1.04;
  /// The same for a table already sized for a measured rate (added to
  /// replace one, or folded): replacing it again holds two tables for a
  /// window, which a saving of a third pays back within three windows; and
  /// 1.5x is as far as memory may stay from the load (docs/performance.md).
  static constexpr double kRefitShrinkFactor = 1.5;
  /// An active table this many times too big for the recent rate is
  /// replaced at once (after a burst).
  static constexpr double kFallFactor = 2.0;
  /// A folded table holds this many times what it must hold at its target
  /// load (the larger of its live count and the recent rate's window).
  static constexpr double kFoldHeadroom = 1.25;
  /// Fold factors tried at most, largest first (each one a pass over the
  /// table's live counts).
  static constexpr int kFoldTries = 4;
  /// A lone table is right-sized for its live count only while the recent
  /// rate needs at least 1 / kSteadyRate of it (the count lags a falling
  /// rate).
  static constexpr double kSteadyRate = 1.25;
  /// A rate climbing: the last tick brought this many times the new
  /// identities of the one before (the fall rule waits) or of the one R
  /// ticks before (a lone table sized after a fall and right-sized then
  /// keeps the fold's headroom), or the recent rate needs this many times
  /// the window's live count (a lone table right-sized then is sized for
  /// the rate).
  static constexpr double kClimbFactor = 1.1;
  /// A new table holds this many times what the sealed one held until one
  /// whole tick of insertions has been seen.
  static constexpr double kMaxGrowthStep = 4.0;
  /// Tables beyond which only a full active table adds one.
  static constexpr std::size_t kMaxTables = 32;
  /// Insertions that found no room in the active table before it is full,
  /// plus one per kOverflowPer live entries (two choices miss rarely, in
  /// proportion to the insertions: a large table must not seal on chance).
  static constexpr std::size_t kOverflowSeal = 8;
  static constexpr std::uint64_t kOverflowPer = 65536;
  /// A new table's line count is a multiple of this (lines_for()): it can
  /// fold by 2, 4, 8 and 16. A table a memory budget grants less than it
  /// asked for takes what it was granted.
  static constexpr std::uint64_t kLineGrain = 16;
  /// Elements ahead that the batch path prefetches.
  static constexpr std::size_t kPrefetchDistance = 16;
  /// Smallest fpp.
  static constexpr double kMinFpp = 1e-7;
  /// Narrowest remainder budget pressure narrows a table to.
  static constexpr unsigned kMinRemainderBits = 2;

  /// Builds an empty filter. `config` must be normalized (normalize()).
  /// Its first table is the floor (min_bytes), whatever config.capacity.
  [[nodiscard]] static Result<std::unique_ptr<CompactFilter>> create(const FilterConfig& config);

  /// An empty filter whose first table is sized for config.capacity (up to
  /// max_bytes), whatever the floor: the pre-sized reference of benchmarks
  /// and tests. It is still replaced once the load says it is too big.
  [[nodiscard]] static Result<std::unique_ptr<CompactFilter>> create_presized(
      const FilterConfig& config);

  /// Payload of an envelope of kind kCompact (called by restore_filter).
  [[nodiscard]] static Result<std::unique_ptr<SlidingFilter>> restore(std::string_view payload,
                                                                      std::uint16_t version);

  ~CompactFilter() override;
  CompactFilter(const CompactFilter&) = delete;
  CompactFilter& operator=(const CompactFilter&) = delete;

  FilterType type() const noexcept override { return FilterType::kCompact; }
  const FilterConfig& config() const noexcept override { return config_; }
  Decision test_and_insert(const Fingerprint& fp, Tick now) override;
  /// Same decisions and state as the one-by-one calls; prefetches the lines
  /// of every table kPrefetchDistance elements ahead.
  void test_and_insert_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                             std::span<Decision> out) override;
  /// Gives a live copy of the identity in the active table (or the
  /// overflow list) the clock's tag; otherwise inserts it as
  /// test_and_insert would.
  void insert(const Fingerprint& fp, Tick now) override;
  void advance(Tick now) override;
  FilterStats stats() const override;
  std::string serialize() const override;
  /// Charges the tables held now, then reserves every new table and
  /// releases every freed one (memory_budget.h, and "Memory budget" above).
  void set_memory_budget(std::shared_ptr<MemoryBudget> budget) override;
  void quiet() override;

  /// True if `fp` would be judged a duplicate at `now` (at the clock if
  /// `now` is earlier), without inserting it.
  [[nodiscard]] bool contains(const Fingerprint& fp, Tick now) const;

  /// Remainder bits of the base shape (config.fpp).
  [[nodiscard]] unsigned fingerprint_bits() const noexcept;
  /// The false-positive target the filter sizes for now: config.fpp, raised
  /// by its MemoryBudget's pressure (memory_budget.h).
  [[nodiscard]] double effective_fpp() const noexcept { return target_; }
  /// t: tag bits per entry.
  [[nodiscard]] unsigned tag_bits() const noexcept { return t_; }
  /// Slots per line of the base shape.
  [[nodiscard]] unsigned slots_per_line() const noexcept;
  /// Bytes of a table of the base shape added now to hold `entries` live
  /// identities at target_load(): the one sizing rule (whole lines, within
  /// min_bytes / max_bytes).
  [[nodiscard]] std::uint64_t new_table_bytes(double entries) const noexcept;
  /// Bytes and remainder bits of each live table, oldest first (the last
  /// one is active).
  [[nodiscard]] std::vector<std::uint64_t> table_bytes() const;
  /// stats().bytes: the tables, their rings of counts, the overflow entries
  /// and the ring of rejections.
  [[nodiscard]] std::uint64_t state_bytes() const;
  [[nodiscard]] std::vector<unsigned> table_fingerprint_bits() const;
  /// Bytes of the table a fresh filter starts with (create()).
  [[nodiscard]] std::uint64_t initial_bytes() const noexcept;
  /// Sum over tables of the estimated fpp (the quantity kept <=
  /// effective_fpp() while the filter can grow).
  [[nodiscard]] double fpp_budget_used() const;
  /// Insertions that found no room, still in the overflow list.
  [[nodiscard]] std::size_t stash_size() const noexcept;
  /// Tables folded in place since this object was created (not part of the
  /// state: a restored filter counts from 0).
  [[nodiscard]] std::uint64_t folds() const noexcept { return folds_; }
  /// New identities judged duplicates for want of room within the window
  /// (budget saturation; 0 while the filter can grow).
  [[nodiscard]] std::uint64_t rejected_in_window() const;

 private:
  struct Table;
  struct Where;
  struct Fill;
  struct View;
  struct Overflow;
  struct PortableLines;
  template <int Kind>
  struct VectorLines;
  enum class Seal : std::uint8_t;

  explicit CompactFilter(const FilterConfig& config);
  [[nodiscard]] static Result<std::unique_ptr<CompactFilter>> make_empty(
      const FilterConfig& config);

  // --- snapshots (compact_snapshot.cc) ---
  [[nodiscard]] static Result<std::unique_ptr<CompactFilter>> restore_header(ByteReader& r);
  [[nodiscard]] Result<std::unique_ptr<Table>> restore_table(ByteReader& r, std::uint32_t i) const;
  [[nodiscard]] Status restore_overflow(ByteReader& r);

  // --- the hot path (compact_filter.cc) ---
  [[nodiscard]] Where where_of(const compact::Key& k) const;
  template <class Lines>
  Decision decide(const Where& w);
  template <class Lines>
  Decision insert_new(const Where& w);
  template <class Lines>
  Decision insert_new(const Where& w, const Fill& f);
  Decision decide_vector(const Where& w);
  template <class Lines>
  [[nodiscard]] bool seen(const Where& w, Fill& f);
  template <class Lines>
  void active_counts(const Where& w, Fill& f);
  [[nodiscard]] bool seen_elsewhere(const compact::Key& k) const;
  [[nodiscard]] bool seek_line(const compact::Line& L, const compact::Layout& l, std::uint32_t q,
                               std::uint32_t rem, const compact::Age& a) const;
  static bool seek_vector(const compact::Line& L, const compact::Layout& l, std::uint32_t q,
                          std::uint32_t rem, const compact::Age& a);
  [[nodiscard]] bool in_overflow(const compact::Key& k, const compact::Age& a) const;
  template <class Lines>
  void place(const Where& w, const Fill& f);
  template <class Lines>
  void run_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                 std::span<Decision> out, std::size_t& i);
  void run_any(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
               std::span<Decision> out, std::size_t& i);
  void run_vector(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                  std::span<Decision> out, std::size_t& i);
  void run_bytes(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                 std::span<Decision> out, std::size_t& i);
  void run_words(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                 std::span<Decision> out, std::size_t& i);
  [[nodiscard]] bool vector_path() const noexcept;
  void commit_pending();
  void count_refresh();
  [[nodiscard]] bool renew(const compact::Key& k);
  void note_full();

  // --- the clock (compact_filter.cc) ---
  void move_clock(Tick now);
  void scrub(Table& t, std::uint64_t count, Tick ref, std::uint64_t extra_age);
  template <class Lines>
  void scrub_lines(Table& t, std::uint64_t count, Tick ref, std::uint64_t extra_age);
  void scrub_vector(Table& t, std::uint64_t count, Tick ref, std::uint64_t extra_age);
  void clear_all(Tick now);
  void drop_expired();
  void refresh_view();

  // --- growth, shrink and the budget (compact_growth.cc) ---
  /// Seals the active table and adds one for `want` entries (0: by the
  /// rate). Returns false when no table was added.
  bool seal_and_grow(Seal why, double want = 0);
  [[nodiscard]] std::unique_ptr<Table> reserve_table(Seal why, double want,
                                                     const compact::Shape& shape);
  bool reopen_sealed();
  bool narrow_active();
  bool fold_active(double need);
  bool fold(std::uint64_t factor, const compact::Age& a);
  bool grow_for_insert();
  void maybe_replace();
  [[nodiscard]] compact::Shape shape_for(double budget) const;
  void observe_budget();
  void set_target(double fpp);
  void publish_demand();
  [[nodiscard]] double growth_target() const;
  [[nodiscard]] bool rate_known() const;
  [[nodiscard]] double arrivals(Tick x) const;
  [[nodiscard]] double window_arrivals() const;
  [[nodiscard]] Tick recent_span() const noexcept;
  [[nodiscard]] double recent_rate(Tick horizon, bool rising) const;
  [[nodiscard]] bool surging() const;
  [[nodiscard]] std::optional<double> step_peak(Tick horizon) const;
  [[nodiscard]] bool climbing(Tick span = 1) const;
  [[nodiscard]] double growth_rate() const;
  [[nodiscard]] double delivered_share() const;
  [[nodiscard]] double table_fpp(const Table& t) const;
  [[nodiscard]] std::vector<double> sealed_fpp_ahead(std::size_t count, std::uint32_t ticks) const;
  [[nodiscard]] double planned_budget() const;
  [[nodiscard]] bool sealed_before(Tick start) const;
  [[nodiscard]] bool pressed() const;
  void end_probe();
  void refresh_limit();
  [[nodiscard]] double target_load(const compact::Shape& s) const noexcept;
  [[nodiscard]] std::uint64_t lines_for(double entries, const compact::Shape& s,
                                        bool bounded) const noexcept;
  /// Bytes of the tables held (what their charges count).
  [[nodiscard]] std::uint64_t held_bytes() const noexcept;
  [[nodiscard]] std::uint64_t floor_lines() const noexcept;
  [[nodiscard]] std::uint64_t initial_lines() const noexcept;
  [[nodiscard]] std::unique_ptr<Table> make_table(std::uint64_t lines, const compact::Shape& s,
                                                  Tick now) const;
  /// make_table() with its bytes charged in the budget, if any (past the
  /// limit: the floor).
  [[nodiscard]] std::unique_ptr<Table> charged_table(std::uint64_t lines, const compact::Shape& s);

  FilterConfig config_;
  std::shared_ptr<MemoryBudget> budget_;      // null: not accounted; outlives tables_
  BudgetLevel budget_level_;                  // the level this filter sizes for
  MemoryDemand demand_;                       // what it would need at each level
  std::vector<compact::Shape> level_shapes_;  // base shape at each level's target
  double target_ = 0;                         // effective fpp: config_.fpp raised by the budget
  bool overfull_ = false;     // no table could be added this tick: the active fills to kMaxLoad
  std::uint64_t folds_ = 0;   // see folds()
  bool saturated_ = false;    // full at the narrowest shape, nothing added: new ids are rejected
  bool refitted_ = false;     // the active table was added to replace one, or folded
  compact::Shape base_;       // shape at config_.fpp
  compact::Shape coarsest_;   // shape at target_ (the coarsest new tables take)
  unsigned t_ = 0;            // tag bits
  std::uint32_t period_ = 0;  // P: ticks per scrub sweep
  std::vector<std::unique_ptr<Table>> tables_;  // oldest first; back() is active
  std::vector<Overflow> overflow_;              // insertions that found no room, until they expire
  std::array<std::uint16_t, 256> overflow_bins_{};  // overflow entries by Key::bin()
  std::uint64_t active_limit_ = 0;                  // live entries the active may hold now
  std::vector<double> tick_fpp_;         // estimate during tick x at x % (W + 2) (arrivals())
  std::vector<std::uint32_t> rejected_;  // rejections at tick x at x % (W + 2)
  Tick clock_ = 0;
  Tick first_tick_ = 0;                // tick of the first insertion (rate estimate)
  std::uint64_t insertions_ = 0;       // distinct decisions and inserts since creation
  std::uint64_t pending_inserts_ = 0;  // insertions not yet booked (commit_pending)
  std::int64_t pending_filled_ = 0;    // change of the active's entry count not yet booked
  std::uint32_t pending_rejected_ = 0;
  bool seal_due_ = false;  // the active table ran out of room
  std::unique_ptr<View> view_;
};

}  // namespace kdedup::filter
