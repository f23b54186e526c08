#pragma once
// CompactFilter: a bucketized cuckoo table of short fingerprints whose slots
// carry a wrapping tick tag. The least memory per in-window identity of the
// filter family, with the timer filter's window edge of one tick.
//
// Table (cuckoo filter: Fan, Andersen, Kaminsky, Mitzenmacher, "Cuckoo
// Filter: Practically Better Than Bloom", CoNEXT 2014). Buckets of four slots;
// a slot holds an f-bit fingerprint (0 = empty) and a t-bit tag. An identity
// has two candidate buckets; the second is derived from the first and the
// stored fingerprint (partial-key cuckoo hashing), so an entry can move
// between them knowing only what its slot holds. Both buckets of an identity
// lie in one 16 KiB block (the alternate is the reflection
// (c(fp) - b) mod buckets-per-block, an involution), so a table of any
// number of blocks works. A block of ~2500 buckets is large enough that its
// random load stays within a percent of the table's: with 4 KiB blocks the
// fullest blocks passed 0.95 at a mean load of 0.9 and kick chains failed;
// with one or two cache lines per block, lines would overflow constantly.
// Reading the two lines within 4 KiB, 16 KiB or anywhere costs the same on
// the machine measured (bench/filter_bench.cc).
//
// Tags (seed 000 §4: store the insertion tick, judge age at read time). A
// tag is the tick mod M, M = 2^t; a slot is alive at `now` iff it holds a
// fingerprint and (now - tag) mod M <= W (W = ticks_per_window), so an
// identity is remembered at least `window` and at most `window + one tick`
// (sliding_filter.h). A dead slot is free: an insertion takes a dead or
// empty slot before it displaces anything. The tag width follows from W
// (W <= M - 3 leaves the scrub a margin):
//   t = 4: W <= 13 (default W = 10: one tick is 10% of the window),
//   t = 5: W <= 29, t = 6: W <= 61, t = 7: W <= 125, t = 8: W <= 253.
// Finer ticks cost tag bits: with t = 4 the four tags of a bucket are stored
// sorted, as the index of their multiset (C(19, 4) = 3876 < 2^12), so a
// slot costs f + 3 bits ("semi-sorting", Fan et al. §5.2, applied to the
// tags); with t >= 5 tags are stored as they are, f + t bits a slot: one tick
// of 1/14 .. 1/253 of the window costs 2 .. 5 more bits per identity.
//
// Scrub (why a wrapping tag never resurrects an entry; the timer filter's
// argument, timer_filter.h). A slot written at tick s reads its true age
// while now - s <= M - 1 and is dead from s + W + 1: it must be emptied
// during the G = M - 1 - W clock values in between. Each table sweeps its
// buckets in memory order on a schedule that visits every bucket at least
// once every G ticks (P = G - 1 ticks per sweep; a quarter of the table per
// tick at the default), when the clock moves; a jump longer than W empties
// everything. The sweep only zeroes dead fingerprints.
//
// False positives. A query compares its fingerprint with the live slots of
// its two buckets: 8 * alpha slots at live load alpha, so a table's
// false-positive probability is p(alpha) = 1 - (1 - 1 / (2^f - 1))^(8 alpha).
// The base width f is the smallest whose table may fill to a load of
// kFingerprintLoad within kBudgetShare of the target: 7 bits at 10%, 10 at
// 1%, 14 at 0.1%, 17 at 1e-4, 20 at 1e-5. At the target load of 0.9 that
// is about 11.1, 14.4, 18.9, 22.2 and 25.6 bits per identity in the window
// with 4-bit tags (docs/performance.md, seed 002 Table 2).
//
// Insertion (never a false negative inside the window). A new identity
// takes a free slot in the emptier of its two buckets. When both are full,
// an entry of one is displaced for it and must move to its other bucket,
// possibly displacing another (a cuckoo kick). A displaced entry waits in a
// small stash (kStash entries), searched by every query, while the cache
// line of its next bucket is fetched; one waiting entry moves per later
// insertion, so a chain of kicks costs prefetched reads instead of cache
// misses in a row. Waiting entries never cross a clock move. An entry that
// finds no room within kMaxKicks moves stays in the stash until it expires
// (cuckoo hashing with a stash: Kirsch, Mitzenmacher, Wieder 2009) and the
// table is sealed: no live entry is ever evicted.
//
// Memory follows load (DESIGN.md; growth by adding filters: seed 001,
// seed 000 §5; the tightening of scalable Bloom filters; the rate-based size
// of seed 002 eq. 6). `capacity` is a hint: the first table holds at most
// the floor min_bytes (less when the hint needs less), whatever the hint.
// New identities go to the newest (active) table; queries read every
// table. Budget rule (the timer filter's): with f* the effective target
// (config.fpp, raised by a shared MemoryBudget under pressure) and S the
// summed p(alpha) of the sealed tables, the active one may hold a live load
// whose p stays at or under kBudgetShare * (f* - S); live loads come from
// exact per-tick insertion counts of the last W + 1 ticks, so S only falls
// between seals and the union bound sum p <= f* holds while the filter can
// grow. The active table is sealed when its live load would pass kMaxLoad
// or its budget, or when a kick chain fails. The table added then is sized
// by new_table_bytes() for the recent rate of new identities over a window
// at kTargetLoad (before one whole tick has been seen, kMaxGrowthStep times
// what the sealed one held), and gets the narrowest fingerprints whose p at
// kTargetLoad fits the budget the sealed tables leave: a table added while
// others still hold most of the budget is wider (a few bits a slot) instead
// of many times larger. A sealed table is freed once its newest insertion
// is older than the window. The active table is replaced by a right-sized
// one at the narrowest width f* allows as soon as it is kFallFactor times
// too big for the recent rate (the mean of the last W / 4 ticks; nothing
// arriving: the floor), and, once alone for a whole window, when it is
// kShrinkFactor times too big for the window's live count or wider than f*
// requires; the new table only takes what arrives from then on, and the
// old one drains within a window (so after a burst of distinct identities
// memory is back within about a window and a half). A clock jump past
// the window returns the filter to its floor at once. So an idle filter
// holds one table of at most min_bytes. Rates and loads count new
// identities that arrived: a tick's deliveries divided by 1 - the estimate
// during that tick (kept per tick), so that a ramp-up's fuller tables,
// whose false positives delivered fewer, do not undersize the table that
// follows; a table is sized for the share of them that a table at
// kTargetLoad delivers.
//
// Memory budget (memory_budget.h). The tables held when a budget is
// attached (a restored snapshot) and a floor table are charged; every other
// table is reserved before it is allocated (reserve_up_to: a growth table
// may get less than it asked for, and fills sooner), and each table releases
// its bytes when it is freed. Under pressure the effective target f* rises
// for every filter at once: new and replacement tables take the narrowest
// fingerprints f* allows (a lone table is replaced by a narrower one, so the
// filter shrinks), and the active may fill further before it is sealed.
// While the total demand exceeds the limit, a new table is no larger than
// this filter's share of the limit (in proportion to its demand at the
// target). Unlike a Bloom or timer filter, a cuckoo table cannot take more
// than kMaxLoad: when a growth table is refused (or the table cap, or a
// budget the sealed tables have used up after the level fell, leaves no fpp
// for one) the active fills up to kMaxLoad until the next tick, which
// raises the fpp past f* and is reported by the estimate; if it is full
// before then, the sealed table with the most room (an eighth of its slots
// or more) becomes the active one again, and only when none has room is a
// floor-sized table charged past the limit rather than evict a live entry.
// Those floor tables and the floor itself are the only bytes the compact
// filter holds past the limit. The compact filter trades little memory for
// fpp: its slot is f + 3 bits and f falls by one bit per doubling of the
// target, so at fpp 1% the highest pressure (0.25) saves 5 of 13 bits;
// a budget shorter than that saturates it (docs/performance.md).
//
// Serialized form: envelope kind FilterType::kCompact, version 1,
// checksummed; restore validates every field (sizes, widths, tick order,
// scrub position, each bucket's tag code, live counts against the slots,
// stash entries).
//
// Threading: owned by one thread (the worker owning its Slice); no method is
// thread-safe.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/filter/memory_budget.h"
#include "kdedup/filter/sliding_filter.h"

namespace kdedup::filter {

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

/// Base fingerprint bits of the compact filter at target `fpp` (see above).
[[nodiscard]] unsigned compact_fingerprint_bits(double fpp);

class CompactFilter final : public SlidingFilter {
 public:
  /// Slots per bucket.
  static constexpr unsigned kSlots = 4;
  /// Most bytes of a block: both buckets of an identity lie in one block.
  static constexpr std::uint64_t kBlockBytes = 16384;
  /// Live load new tables are sized for.
  static constexpr double kTargetLoad = 0.9;
  /// Live load at which the active table is sealed (kicks grow long past it).
  static constexpr double kMaxLoad = 0.95;
  /// Load the base width f is chosen for (within kBudgetShare of the
  /// target): a lone table may fill to kMaxLoad on its budget.
  static constexpr double kFingerprintLoad = kMaxLoad;
  /// Share of the remaining fpp budget the active table may use.
  static constexpr double kBudgetShare = 0.9;
  /// A lone table this many times too big for its live count is replaced
  /// (the cost: one window with both).
  static constexpr double kShrinkFactor = 1.08;
  /// An active table this many times too big for the recent rate is
  /// replaced at once (after a burst).
  static constexpr double kFallFactor = 2.0;
  /// A new table holds this many times what the sealed one held until one
  /// whole tick of insertions has been seen.
  static constexpr double kMaxGrowthStep = 4.0;
  /// Tables beyond which only a failed kick chain adds one.
  static constexpr std::size_t kMaxTables = 32;
  /// Displaced entries waiting for their next bucket.
  static constexpr std::size_t kStash = 16;
  /// Insertions a displaced entry waits before it moves (its line arrives).
  static constexpr std::uint64_t kStashDelay = 8;
  /// Moves of one displaced entry before it gives up (and stays stashed).
  static constexpr std::uint32_t kMaxKicks = 500;
  /// Entries that gave up in the active table before it is declared full.
  static constexpr std::size_t kOverflowSeal = 8;
  /// Elements ahead that the batch path prefetches.
  static constexpr std::size_t kPrefetchDistance = 16;
  /// Smallest fpp (base fingerprints of at most 27 bits with 4-bit tags).
  static constexpr double kMinFpp = 1e-7;

  /// Builds an empty filter. `config` must be normalized (normalize()).
  /// Its first table holds min(config.capacity, what the floor min_bytes
  /// holds).
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
  /// Same decisions and state as the one-by-one calls; prefetches the
  /// buckets of every table kPrefetchDistance elements ahead.
  void test_and_insert_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                             std::span<Decision> out) override;
  /// Gives a live copy of the identity in the active table (or the stash)
  /// the clock's tag; otherwise inserts it as test_and_insert would.
  void insert(const Fingerprint& fp, Tick now) override;
  void advance(Tick now) override;
  FilterStats stats() const override;
  std::string serialize() const override;
  /// Charges the tables held now, then reserves every new table and
  /// releases every freed one (memory_budget.h, and "Memory budget" above).
  void set_memory_budget(std::shared_ptr<MemoryBudget> budget) override;

  /// True if `fp` would be judged a duplicate at `now` (at the clock if
  /// `now` is earlier), without inserting it.
  [[nodiscard]] bool contains(const Fingerprint& fp, Tick now) const;

  /// Base f: fingerprint bits per slot of a table that needs no tightening,
  /// at config.fpp.
  [[nodiscard]] unsigned fingerprint_bits() const noexcept { return f_; }
  /// The false-positive target the filter sizes for now: config.fpp, raised
  /// by its MemoryBudget's pressure (memory_budget.h).
  [[nodiscard]] double effective_fpp() const noexcept { return target_; }
  /// t: tag bits per slot (3 per slot when stored sorted, t = 4).
  [[nodiscard]] unsigned tag_bits() const noexcept { return t_; }
  /// Bytes of a table of `f`-bit fingerprints added now to hold `entries`
  /// live identities at kTargetLoad: the one sizing rule (to a cache line
  /// per block, within min_bytes / max_bytes).
  [[nodiscard]] std::uint64_t new_table_bytes(double entries, unsigned f) const noexcept;
  /// Bytes and fingerprint bits of each live table, oldest first (the last
  /// one is active).
  [[nodiscard]] std::vector<std::uint64_t> table_bytes() const;
  [[nodiscard]] std::vector<unsigned> table_fingerprint_bits() const;
  /// Bytes of the table a fresh filter starts with (create()).
  [[nodiscard]] std::uint64_t initial_bytes() const noexcept;
  /// Sum over tables of the estimated fpp (the quantity kept <=
  /// effective_fpp() while the filter can grow).
  [[nodiscard]] double fpp_budget_used() const;
  /// Displaced entries waiting in the stash (overflow entries included).
  [[nodiscard]] std::size_t stash_size() const noexcept;

 private:
  struct Layout;
  struct Table;
  struct Stashed;
  struct View;
  struct Sorted64;
  struct Sorted128;
  struct Plain128;
  // The hot path (compact_filter.cc). Codec: the active table's bucket
  // format; Key: an identity's position and the product its stored
  // fingerprints are taken from; Slots: its two buckets in the active table
  // as read by its test.
  struct Key {
    std::uint64_t pos = 0;
    std::uint64_t mixed = 0;
  };
  template <class Word>
  struct Slots;

  explicit CompactFilter(const FilterConfig& config);
  template <class Codec>
  [[nodiscard]] bool seen(const View& v, const Layout& active, const Key& k,
                          Slots<typename Codec::Word>& at) const;
  [[nodiscard]] bool seen_elsewhere(const View& v, const Key& k) const;
  template <class Codec>
  std::uint32_t add(const View& v, const Layout& active, const Key& k,
                    const Slots<typename Codec::Word>& at, std::uint64_t count);
  template <class Codec>
  void kick(const Layout& active, std::uint8_t* block, std::uint32_t from, typename Codec::Word w,
            std::uint64_t pos, std::uint32_t fp, std::uint64_t count);
  void step_stash(std::uint64_t count);
  template <class Codec>
  void step_in(std::uint64_t count);
  template <class Codec>
  Decision decide(const Fingerprint& x);
  template <class Codec>
  void write(const Key& k, const Slots<typename Codec::Word>* read);
  void write_any(const Key& k);
  /// Seals the active before a new identity when it has no room left;
  /// true when a table was added.
  bool grow_for_insert();
  template <class Codec>
  [[nodiscard]] bool refresh(const Key& k);
  template <class Codec>
  void run_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                 std::span<Decision> out, std::size_t& done);
  template <class Codec>
  void scrub(Table& t, std::uint64_t count, Tick ref, std::uint64_t extra_age);
  template <class Codec>
  [[nodiscard]] bool buckets_consistent(const Table& t) const;
  [[nodiscard]] bool in_stash(const Key& k, std::uint32_t now_tag, std::uint32_t max_age) const;
  void push_waiting(const Stashed& s);
  void mark_stashed(std::uint32_t fp);
  void unmark(const Stashed& s);
  [[nodiscard]] bool maybe_stashed(std::uint32_t fp) const;
  void commit_pending();
  void count_refresh();
  void move_clock(Tick now);
  void clear_all(Tick now);
  void drop_expired();
  void maybe_replace();
  /// Why a table is added (see "Memory follows load" and "Memory budget").
  enum class Seal : std::uint8_t {
    kBudget,   ///< the active's fpp room ran out: may be refused
    kFull,     ///< the active cannot take more (kMaxLoad, failed kicks): never refused
    kReplace,  ///< the right-sized replacement of a lone table: may be refused
  };
  /// Seals the active table and adds one for `want` entries (0: by the
  /// rate). Returns false when no table was added: the active then takes
  /// identities up to kMaxLoad until the next tick (overfull_).
  bool seal_and_grow(Seal why, double want = 0);
  /// The new table of seal_and_grow() and its reservation.
  [[nodiscard]] std::unique_ptr<Table> reserve_table(Seal why, double want, unsigned f);
  /// Makes the sealed table with the most room the active one again (the
  /// budget refused a table while the active is full); false if none has
  /// room.
  bool reopen_sealed();
  /// Narrowest fingerprint bits (at least min_f_) whose table at
  /// kTargetLoad fits `budget`.
  [[nodiscard]] unsigned width_for(double budget) const;
  /// Reads the budget's pressure level (once per tick) and retargets.
  void observe_budget();
  void set_target(double fpp);
  /// Publishes what the filter would need at each level (once per tick).
  void publish_demand();
  /// budget_level_ once the filter has run long enough at it to move it
  /// (MemoryBudget::kSettleShare), else MemoryBudget::kHold.
  [[nodiscard]] std::uint32_t budget_vote() const noexcept;
  [[nodiscard]] double growth_target() const;
  [[nodiscard]] bool rate_known() const;
  /// New identities that arrived at tick `x` (inside the window), from
  /// its deliveries and the estimate at that tick.
  [[nodiscard]] double arrivals(Tick x) const;
  /// The same, summed over the window up to the clock.
  [[nodiscard]] double window_arrivals() const;
  /// New identities per tick over the last `horizon` whole ticks; with
  /// `rising`, at least the current tick's so far.
  [[nodiscard]] double recent_rate(Tick horizon, bool rising) const;
  /// recent_rate() over the horizon that sizes growth tables.
  [[nodiscard]] double growth_rate() const;
  [[nodiscard]] double delivered_share() const;
  [[nodiscard]] double table_fpp(const Table& t) const;
  void refresh_limit();
  void refresh_view();
  /// Blocks and buckets per block of a table.
  struct Shape {
    std::uint64_t blocks = 1;
    std::uint32_t per_block = 2;
  };
  [[nodiscard]] Shape shape_for(double entries, unsigned f, bool bounded) const noexcept;
  /// The largest table of `f`-bit fingerprints within `bytes` (at least one
  /// line per block): the floor is shape_within(min_bytes, f).
  [[nodiscard]] Shape shape_within(std::uint64_t bytes, unsigned f) const noexcept;
  [[nodiscard]] std::uint64_t bytes_of(Shape shape, unsigned f) const noexcept;
  [[nodiscard]] Shape initial_shape() const noexcept;
  [[nodiscard]] std::unique_ptr<Table> make_table(Shape shape, unsigned f, Tick now) const;
  /// make_table() with its bytes charged in the budget, if any (past the
  /// limit: a floor, or a table the filter cannot do without).
  [[nodiscard]] std::unique_ptr<Table> charged_table(Shape shape, unsigned f);
  [[nodiscard]] static Result<std::unique_ptr<CompactFilter>> make_empty(
      const FilterConfig& config);

  FilterConfig config_;
  std::shared_ptr<MemoryBudget> budget_;  // null: not accounted; outlives tables_
  std::uint32_t budget_level_ = 0;        // the budget's level seen at the last tick
  Tick level_since_ = 0;                  // tick budget_level_ was first seen
  MemoryDemand demand_;                   // what it would need at each level
  std::vector<unsigned> level_widths_;    // base fingerprint bits at each level's target
  double target_ = 0;                     // effective fpp: config_.fpp raised by the budget
  bool overfull_ = false;     // no table could be added this tick: the active fills to kMaxLoad
  unsigned min_f_ = 0;        // base fingerprint bits at target_ (narrowest new tables)
  unsigned f_ = 0;            // base fingerprint bits at config_.fpp
  unsigned t_ = 0;            // tag bits
  unsigned max_f_ = 0;        // widest fingerprints the bucket format holds
  std::uint32_t period_ = 0;  // P: ticks per scrub sweep
  std::vector<std::unique_ptr<Table>> tables_;  // oldest first; back() is active
  std::unique_ptr<Stashed[]> waiting_;          // ring of kStash entries waiting to move
  std::size_t wait_head_ = 0;                   // oldest waiting entry
  std::size_t wait_count_ = 0;
  std::vector<Stashed> overflow_;                // entries that found no room, until they expire
  std::array<std::uint16_t, 256> stash_bins_{};  // stashed entries as wide as the active's, by bin
  std::uint32_t stash_others_ = 0;               // stashed entries of tables of another width
  std::uint64_t active_limit_ = 0;               // live entries the active may hold now
  std::vector<double> tick_fpp_;  // estimate during tick x at x % (W + 2) (arrivals())
  Tick clock_ = 0;
  Tick first_tick_ = 0;                // tick of the first insertion (rate estimate)
  std::uint64_t insertions_ = 0;       // distinct decisions and inserts since creation
  std::uint64_t pending_inserts_ = 0;  // insertions not yet booked (commit_pending)
  std::uint64_t pending_filled_ = 0;   // of which went into empty slots
  bool seal_due_ = false;              // a kick chain failed in the active table
  std::unique_ptr<View> view_;
};

}  // namespace kdedup::filter
