#pragma once
// TimerFilter: the default sliding filter of kdedup (seed 000 §4–5).
//
// Cells hold small wrapping timers instead of bits. The filter never
// decrements every cell each tick (seed 000 §4's formulation): a cell stores
// the insertion tick, wrapped into the nonzero codes 1..M with M = 2^b - 1
// (0 = empty), and its age is judged when it is read:
//   code(t) = t mod M + 1,   age = (code(now) - code) mod M,
//   alive  <=>  code != 0 and age <= W          (W = ticks_per_window)
// so an identity is remembered at least `window` and at most `window + one
// tick` (sliding_filter.h).
//
// Scrub (why the wrapping clock never resurrects an entry). A cell inserted
// at t reads its true age only while now - t <= M - 1; it is dead from
// t + W + 1 on. It must therefore be cleared during the G = M - 1 - W clock
// values t + W + 1 .. t + M - 1. Each sub-filter sweeps its lines in order
// on a schedule: by clock c it must have visited
//   R(c) = floor((c - created) * lines / P) lines,   P = G - 1,
// and it may run at most one tick ahead (R(c + 1)). The work is done when the
// clock advances, in one sequential, vectorised sweep of the lines now due
// (the insert path carries no scrub state; states written by versions that
// scrubbed one line per insert, up to R(c + 1), still restore), so two
// visits of a line are at most P + 1 = G ticks apart and every dead cell is
// cleared inside its safe interval. A clock jump of d <= W ticks first
// catches up with ages taken relative to the old clock plus d (exact, since
// no cell had aliased yet); a jump larger than one sweep sweeps everything
// once; a jump larger than W clears the whole filter (everything in it is
// dead). Scrub cost: lines / P sequential line visits per tick.
//
// Precision vs timer width: W <= M - 3 (normalize() checks this).
//   b = 4:  M = 15,    W <= 12    (default 8: a tick is 1/8 of the window)
//   b = 8:  M = 255,   W <= 252   (default 192)
//   b = 16: M = 65535, W <= 65532 (default 4096)
// A larger W means finer expiry (one tick = window / W) but a smaller scrub
// margin G and so more scrub work per tick; 4-bit timers trade precision
// (an identity may be remembered up to window * (1 + 1/W)) for half the
// memory of 8-bit ones.
//
// Layout (blocked, Putze-Sanders-Singler 2007). Cells are grouped in 64-byte
// lines of B = 512 / b cells (128, 64 or 32). Fingerprint.hi picks the line
// (multiply-high range reduction); Fingerprint.lo gives k probe positions of
// log2(B) bits each inside the line (a colliding position moves to the next
// free cell, so the k cells are distinct). One cache miss per sub-filter per
// operation.
//
// Insert path. test_and_insert_batch() works in runs of elements at one clock
// value: the clock's live codes, the sub-filters' lines and the room left in
// the active one are copied into a TickView once per run, the insertion
// counters are booked once per run, and the k of the usual targets (5..8)
// have their loops unrolled. Per element that leaves the k positions (taken
// straight from the fingerprint bits unless two collide, ~15% at k = 5), k
// table reads for the age test (4- and 8-bit timers) and k writes when new.
// On CPUs with AVX2 or AVX-512 (simd.h), 8-bit timers without equal timers
// take a vector path instead: the k positions become a 64-bit mask, a few
// instructions over the whole line give the mask of its live cells, and the
// k cells are written in one go (a masked store; a blend on AVX2); the scrub
// clears a line in a handful of instructions. All paths give the same
// decisions and bytes. The
// batch path prefetches each element's lines kPrefetchDistance elements
// ahead (32: measured faster than 16 and no slower than 48 or 64 at 64 MiB,
// bench/filter_bench.cc).
//
// Sizing. The false-positive probability of a blocked filter at lambda live
// elements per line is the Poisson mixture
//   fpp(lambda) = sum_x Pois(x; lambda) * q_k(x)
// with q_k(x) the exact probability that k distinct probes all hit cells set
// by x elements in the same line (see sizing.h). k and cells per element are
// chosen by solving fpp(lambda) = target numerically for each k and keeping
// the k with the largest lambda (fewest cells per element). Sub-filters are
// sized at 0.9 x fpp (see the budget rule below); at fpp 1% that is k = 5 and
// 12.2 cells (98 bits) per element with 8-bit timers, k = 6 and 11.0 cells
// (44 bits) with 4-bit timers (the classic 1.44 log2(1/p) would say 9.8).
//
// Equal-timers heuristic (seed 000 §4, config.equal_timers = k'): a
// duplicate needs all k timers alive and at least k' of them equal (set at
// the same tick, most likely by the same element). Cuts false positives in a
// crowded filter; may add false negatives when two elements share a line.
//
// Dynamic size (seed 000 §5): memory follows the load. `capacity` is a hint:
// the filter starts with one sub-filter of min(what `capacity` needs, the
// floor min_bytes), so an idle partition holds the floor whatever the hint.
// Inserts go to the newest (active) sub-filter; lookups check all. Each
// sub-filter's false-positive probability f_i is estimated from the model at
// its load lambda_i = (elements inserted in the last W + 1 ticks) / lines;
// that count is exact (a ring of per-tick insertion counts), so the estimate
// falls as the window slides. The model takes insertions as independent of
// the cells, which they are not near saturation (only an identity with an
// empty cell is inserted): from an estimate of 5% on, stats() also reads the
// sub-filter's cells and reports the larger (reported_fpp()). Budget rule:
// with f* the effective target (config.fpp, raised by a shared MemoryBudget
// under memory pressure, see memory_budget.h) and S the sum of f_i over
// sealed sub-filters, the active one may hold at most
//   f_active <= 0.9 * (f* - S)
// (Growth::kDensity: by its live load; Growth::kCardinality: by its insert
// count since creation, which never decreases, seed 000 §5). S only falls
// between seals, so the union bound sum f_i <= f* holds at all times. When
// the next insertion would cross that, the active is sealed and a new one is
// added, sized from the measured insertion rate:
// - the rate is the insertions per tick over the last complete ticks (W / 8
//   of them, or since the first insertion), never less than the current
//   tick's count so far, and the new sub-filter holds 1.25 x rate x (W + 1);
// - that extrapolation is trusted only up to kMaxGrowthStep (4) x what the
//   window holds now; beyond it (a burst inside a tick, the first ticks of a
//   stream, traffic resuming after a pause) growth is geometric and the new
//   sub-filter is a probe: it may take only kProbeShare of f*, so that the
//   sub-filter sized once the rate is known still gets most of the budget;
//   once the first window has turned over (where W / 8 spans two ticks or
//   more, and not over a memory budget), a seal's successor holds at most
//   kSealStep (1.5) x the window: whether the step that filled the active
//   lasts a tick or a window cannot be told at the seal, and a burst
//   within a tick held 3.6x the memory its window needed beside a
//   successor 4x the window. A step that lasts fills that one within W / 8
//   ticks of its being added (over complete ticks): the rate has outrun
//   the bound for its whole life, and its successor is sized from that
//   rate uncapped (seal_target());
// - a rate-sized sub-filter is sized for a share of at least kPlanShare of
//   f* even when the sealed ones hold more right now: their entries expire
//   within a window and their f_i falls faster than their load (f is a
//   steep power of the load), so its limit rises to the full budget long
//   before it fills.
// Growth in place (expansion). Sealing holds the full active and its
// successor together for a window: with N_fill what the window held when the
// active filled and N_peak what it reaches, at least N_fill + 1.25 N_peak
// in pre-sized units, over 2x on a gentle climb. Once the stream's first
// window has turned over, an active that would fill within kExpandAhead
// ticks at the current rate (or, on a climb, kGentleAheadShare x W / 8 if
// more: the room left when it is copied is multiplied too, and a climb to
// twice the rate expanded with none left needed a factor of 3), while the
// entries leaving it do not keep up with that rate (or this tick may not
// fit), is instead copied, at the start of a tick, into m times its
// lines: a fingerprint in line j of L lines (multiply-high range
// reduction) is in one of lines j m .. j m + m - 1 of m L, and its
// probe cells do not depend on the line count, so a copy of line j in
// each of them keeps every live entry where a query looks (no false
// negative), and only the new array is held once the copy is done. Each
// entry held then is now in m lines, and the fpp model counts it
// m times (counted(): the per-tick counts before the expansion's tick,
// times the product of the factors of the expansions after it) until it
// expires; new insertions count once. So the expanded active starts as
// full as it was, and each expiring copied entry makes room for m
// insertions: m (5-smooth, at least 2) is the least that keeps up with the
// current rate over the next W / 8 ticks, in which the oldest entries
// leave, and, with 10% over, over a window (where no domain caps the
// window, also followed tick by tick: schedule_factor()). It expands only
// when that holds less than sealing would (m - 1 times its lines at most
// what a new rate-sized sub-filter would get), and never a probe; up to
// kMaxSplits expansions may have live copies, and a fold or shrink waits
// until they have expired. (That sub-filter is not capped at
// kMaxGrowthStep x the window here: on a step to several times the load
// the cap turned down the expansion the step needed, and a later
// expansion, or a seal, held twice the memory.) The window can hold no
// more than the stream's domain: on a burst of repeats, new identities
// arrive fast at first (those outside the window) and fewer as the domain
// fills, so the rate over a window is capped
// by domain_bound(), what the window holds over the share of the last W / 8
// ticks' queries that were repeats (the domain, for uniform draws; below
// what a skewed stream's window reaches, and a second expansion may
// follow). Both tests read the worst of such a burst (the rate holding for
// W / 8 ticks; the window reaching the domain while every copy is held):
// the expansion waits while the window followed tick by tick fits the
// room within kGrowthHeadroom (schedule_factor(): q queries a tick bring
// q (1 - N / D) new identities as the window's content N grows, and each
// bucket's copies leave a window after it), as long as the room lasts
// kExpandAhead ticks at the climb's rate and no sealed sub-filter waits
// for the room to fold. On a steep climb (the rate would bring more than
// kSteepClimb x what the window holds) it expands once the room left would
// last fewer than W / 8 ticks, not kExpandAhead: the more room left when
// the lines are copied, the smaller the factor; and its window test reads
// the rate of the last two buckets too (the climb's own; the W / 8
// ticks' rate still holds the ticks before it). And within a window of an
// expansion's copies expiring, the active does not shrink by less than 2x
// (below): what it made room for leaves together then, and on a stream that
// recurs comes straight back (the echo), which a shrink would meet with
// another expansion. A shrunk sub-filter (below) keeps its shape: m L lines
// over m times its (even) hash range, whose doubled lines are the copies of
// its doubled lines, so the same estimate counts them. A step in the rate
// that fills the active within a tick still seals it. The rate here is read
// over at least two ticks: with a window of a few ticks one tick can insert
// a quarter more than the others (the stream's first tick, all new, echoes
// every window), and a steady active doubled on it.
// Sealed sub-filters are freed once their newest insertion is older than the
// window. Until then each one, as it drains, folds (or shrinks in place,
// below, once that frees kDrainStep of its lines) to what its live entries
// need at their share of the target in proportion to them, as over a
// budget (below), but only from room the active will not need: the active
// keeps the room the current rate asks of it until that one has drained,
// and the sealed ones together stay within (1 - kPlanShare) of the target,
// what a rate-sized successor leaves them (fold_drained()).
// Shrink (fold): once the window has turned over at the current rate
// (the active holds at most kSettled x what the rate over the last W / 4
// ticks brings in a window) and the active is at least twice what 1.1 x
// max(what it holds, that rate x (W + 1)) needs, it folds in place by an
// integer factor d that divides its line count: new line j merges old lines
// j*d .. j*d + d - 1 cell by cell, keeping the youngest live code. A
// fingerprint's line in L / d lines is floor(line in L / d) (multiply-high
// range reduction), and its probe cells do not depend on L, so the folded
// sub-filter is exactly the one that would exist had the identities been
// inserted into L / d lines from the start: every live entry stays (no false
// negative), the estimate stays exact, and no second copy is held while the
// window turns over. New sub-filters get 8 x a 5-smooth number of lines, so
// that a divisor lies within a few percent of any smaller need. An active
// with nothing alive returns to the floor whatever its size.
// Shrink by less than 2x (linear hashing, Litwin, VLDB 1980, contraction): a
// sub-filter keeps its hash range of `span` lines and holds fewer lines L,
// span / 2 <= L <= span; hash line v >= L shares the line v - span / 2 with
// the hash line there. Dropping the last line merges it, cell by cell (the
// youngest live code), into the line half the range back, so any L can be
// reached in place and every live entry stays. The span - L doubled lines
// carry twice the load and take 2 (span - L) / span of the queries; the fpp
// estimate and the load limit count them so. A lone active that cannot
// fold by an integer factor, has lived a whole window and could hold more
// than kShrinkFrom x 1.25 x what it must keep (what it holds at the tick's
// end at the current rate) shrinks to the fewest lines that hold 1.1 x that
// within its budget, once the load has fallen and settled: what it must keep
// is between 1 and kSettled x what the rate brings in a window (a rising
// rate's need is not known yet); one shrunk before shrinks again from
// kShrinkFrom x that. An active younger than a window, sized from a rate
// that has fallen since (the stream's first ticks bring only new
// identities, whose rate falls through its first window as identities
// recur), shrinks once the stream has lived a window, once: to what a new
// sub-filter would get for what it will hold when its own first entries
// leave, while the sealed ones (which leave before that) still drain, and
// not below what holds its content until the last of them leaves at the
// share of the target they leave it now. (Growth::
// kCardinality cannot fold, its count never decreases: a lone active twice
// what the rate needs is sealed and a rate-sized one started.) A restored
// snapshot folds the same way when it is restored. A clock jump past the
// window empties the filter and returns it to the floor. At most 32
// sub-filters exist. At that cap, or when the MemoryBudget refuses a new one,
// a sealed sub-filter with room at the current target becomes the active
// again: its lines were sized for a lower target (the budget's level rose
// since) and would otherwise sit idle until it expires.
// Inserting into any sub-filter keeps every entry (the query reads them
// all), and the fpp sum rule above still bounds the one taking insertions.
// Over the limit, a filter holding more than its share of it (the limit in
// proportion to its published demand) folds its sealed sub-filters to the
// load the effective target allows them, and its active down to what is
// left of the share (give_back(), once per tick): a filter that grew before
// the others' load was known gives the room back.
// When none has room and the budget refuses a new one (or the filter holds
// its share already: refused without asking), the active takes inserts up
// to the load at which it alone reaches the effective target, then rejects
// new identities until the next tick, when it asks again: a rejected
// identity is judged a duplicate (one false positive, never a false
// negative) and counted in stats().fpp_estimate, where an overfilled
// sub-filter would make every query of its window a false positive for a
// whole window. While it overfills or rejects, its published demand counts
// every query, not only what it inserted. Without a budget (at the cap of
// sub-filters), the active absorbs every insert as before.
//
// Serialized form: envelope kind FilterType::kTimer, checksummed; version 1,
// version 2 (each sub-filter's hash range after its line count) when a
// sub-filter is shrunk, version 3 (also each sub-filter's expansions with
// live copies: tick and factor) when one has such, or version 4 (version 3
// and what the growth rules remember beyond the cells: each sub-filter's
// echo hold and share of the target, the queries per window bucket, the
// arrival and rejection rates, the current tick's counts) once the filter
// has taken a record. A filter restored from version 4 grows, shrinks and
// decides as the one it was taken from; every field is validated on
// restore.
//
// Threading: owned by one thread (the worker owning its Slice); no method is
// thread-safe.

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/filter/memory_budget.h"
#include "kdedup/filter/sizing.h"
#include "kdedup/filter/sliding_filter.h"

namespace kdedup::filter {

struct WindowCount;

/// Largest ticks_per_window that leaves the scrub a margin with b-bit timers.
constexpr std::uint32_t max_timer_ticks_per_window(std::uint8_t timer_bits) {
  return static_cast<std::uint32_t>((1ULL << timer_bits) - 1) - 3;
}

class TimerFilter final : public SlidingFilter {
 public:
  /// Share of the remaining fpp budget the active sub-filter may use.
  static constexpr double kBudgetShare = 0.9;
  /// New sub-filters hold this many times the rate's insertions per window.
  static constexpr double kGrowthHeadroom = 1.25;
  /// A new sub-filter holds at most this many times what the window holds
  /// (geometric growth while the rate cannot be extrapolated).
  static constexpr double kMaxGrowthStep = 4.0;
  /// After the first window, a seal's successor holds at most this many
  /// times what the window holds where the growth horizon spans two ticks
  /// or more (seal_target(): one that fills within it is followed by one
  /// sized from the rate).
  static constexpr double kSealStep = 1.5;
  /// Share of the effective target a probe sub-filter (sized without a
  /// trusted rate) may take.
  static constexpr double kProbeShare = 0.1;
  /// A rate-sized sub-filter is sized for at least this share of the target.
  static constexpr double kPlanShare = 0.75;
  /// Share of the window (in ticks, at least one) whose complete ticks give
  /// the insertion rate that sizes a new sub-filter.
  static constexpr double kGrowthHorizonShare = 0.125;
  /// Share of the window whose complete ticks give the rate a fold keeps.
  static constexpr double kFoldHorizonShare = 0.25;
  /// A folded sub-filter holds this many times what it must keep.
  static constexpr double kFoldHeadroom = 1.1;
  /// The window has turned over at the current rate (a fold may follow)
  /// once it holds at most this many times what the rate brings in one.
  static constexpr double kSettled = 1.05;
  /// An active that cannot fold shrinks once it could hold this many times
  /// kGrowthHeadroom x what it must keep (x 1 once shrunk).
  static constexpr double kShrinkFrom = 1.2;
  /// New sub-filters get this many lines times a 5-smooth number, so that
  /// they can fold to within a few percent of any smaller size.
  static constexpr std::uint64_t kFoldGrain = 8;
  static constexpr std::size_t kMaxSubfilters = 32;
  /// Expansions in place whose copies may be alive at once, per sub-filter.
  static constexpr std::size_t kMaxSplits = 4;
  /// A draining sealed sub-filter shrinks in place once that frees at least
  /// this share of its lines.
  static constexpr double kDrainStep = 0.25;
  /// The active expands in place when the room it has left would last
  /// fewer than this many ticks at the current rate (on a steep climb, the
  /// growth horizon's, if more).
  static constexpr double kExpandAhead = 2.0;
  /// On a climb short of a steep one (the rate would bring more than
  /// kGrowthHeadroom x what the window holds), the active expands once its
  /// room would last fewer than this share of the growth horizon's ticks
  /// (at least kExpandAhead).
  static constexpr double kGentleAheadShare = 0.25;
  /// A climb is steep when the current rate would bring this many times
  /// what the window holds.
  static constexpr double kSteepClimb = 2.0;
  /// Rejecting at least this share of what arrives, a filter's demand
  /// counts what arrives (publish_demand()).
  static constexpr double kRejectedShare = 0.01;
  /// Elements ahead that the batch path prefetches.
  static constexpr std::size_t kPrefetchDistance = 32;

  /// Builds an empty filter. `config` must be normalized (normalize()).
  /// Its first sub-filter holds min(config.capacity, the floor min_bytes).
  [[nodiscard]] static Result<std::unique_ptr<TimerFilter>> create(const FilterConfig& config);

  /// An empty filter whose first sub-filter is sized for config.capacity
  /// (up to max_bytes), whatever the floor: the pre-sized reference of
  /// benchmarks and tests. It still folds once the load says it is too big.
  [[nodiscard]] static Result<std::unique_ptr<TimerFilter>> create_presized(
      const FilterConfig& config);

  /// Payload of an envelope of kind kTimer (called by restore_filter).
  [[nodiscard]] static Result<std::unique_ptr<SlidingFilter>> restore(std::string_view payload,
                                                                      std::uint16_t version);

  ~TimerFilter() override;
  TimerFilter(const TimerFilter&) = delete;
  TimerFilter& operator=(const TimerFilter&) = delete;

  FilterType type() const noexcept override { return FilterType::kTimer; }
  const FilterConfig& config() const noexcept override { return config_; }
  Decision test_and_insert(const Fingerprint& fp, Tick now) override;
  void test_and_insert_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                             std::span<Decision> out) override;
  /// Writes the clock's code into the identity's k cells of the active
  /// sub-filter (sealing it first when full), without testing them.
  void insert(const Fingerprint& fp, Tick now) override;
  void advance(Tick now) override;
  FilterStats stats() const override;
  std::string serialize() const override;
  /// Charges the cells held now, then reserves every new sub-filter and
  /// releases every freed or folded one (memory_budget.h).
  void set_memory_budget(std::shared_ptr<MemoryBudget> budget) override;
  void quiet() override;

  /// Probes per element (derived from fpp and timer_bits).
  [[nodiscard]] std::uint32_t k() const noexcept { return k_; }
  /// Cells per 64-byte line: 512 / timer_bits.
  [[nodiscard]] std::uint32_t cells_per_line() const noexcept { return cells_per_line_; }
  /// Bytes of the sub-filter a fresh filter starts with (capacity, at most the floor).
  [[nodiscard]] std::uint64_t initial_bytes() const noexcept;
  /// Bytes of a sub-filter sized for config.capacity (create_presized()).
  [[nodiscard]] std::uint64_t presized_bytes() const noexcept;
  /// The false-positive target the filter sizes for now: config.fpp, raised
  /// by its MemoryBudget's pressure (memory_budget.h).
  [[nodiscard]] double effective_fpp() const noexcept { return target_; }
  /// Bytes of each live sub-filter, oldest first (the last one is active).
  [[nodiscard]] std::vector<std::uint64_t> subfilter_bytes() const;
  /// Sum over sub-filters of the estimated fpp (the quantity kept <=
  /// effective_fpp() unless the filter could not grow).
  [[nodiscard]] double fpp_budget_used() const;

 private:
  struct SubFilter;
  class GrowthState;

  // What the insert path reads during one tick, as plain values: rebuilt by
  // refresh_view() whenever the clock moves or the sub-filters change. The
  // batch loop works on a local copy, so that its stores into the cells
  // (bytes, which may alias anything) do not force every constant to be
  // reloaded from the filter after each write.
  struct TickView {
    struct Cells {
      std::uint8_t* data = nullptr;
      std::uint64_t span = 0;   // range of the line hash
      std::uint64_t lines = 0;  // lines held: hash lines from here on ...
      std::uint64_t back = 0;   // ... are held this many lines back (span / 2)
    };
    std::array<Cells, kMaxSubfilters> subs{};  // newest (the active one) first
    std::uint32_t count = 0;                   // live sub-filters
    std::uint32_t k = 0;
    std::uint32_t equal = 0;     // config.equal_timers
    std::uint32_t now_code = 1;  // code(clock)
    // A code v is alive iff v != 0 and (v - live_lo) mod 2^b <= live_span
    // (see "Age test" in timer_filter.cc).
    std::uint32_t live_lo = 1;
    std::uint32_t live_span = 0;
    std::uint64_t room = 0;  // inserts the active may take before it must be sealed
    bool shrunk = false;     // some sub-filter holds fewer lines than its hash range
    // line_of() may meet a shrunk sub-filter (UnshrunkView: it cannot).
    static constexpr bool kMayBeShrunk = true;
    // 4- and 8-bit timers: alive / empty class of every code (timer_filter.cc).
    std::array<std::uint8_t, 256> code_class{};
  };

  /// The view of a run in which no sub-filter is shrunk: the batch loops'
  /// line hash skips the shrunk mapping's compare (run_batch()).
  struct UnshrunkView : TickView {
    static constexpr bool kMayBeShrunk = false;
  };

  /// What a new sub-filter should hold, and whether it is a probe (sized
  /// without a rate that can be extrapolated, see "Dynamic size").
  struct GrowthTarget {
    double elements = 0;
    bool probe = false;
  };

  explicit TimerFilter(const FilterConfig& config);
  static Result<std::unique_ptr<TimerFilter>> make_empty(const FilterConfig& config);
  void move_clock(Tick now);
  /// Rebuilds view_ from clock_, subs_ and the active's counters.
  void refresh_view();
  /// Books `n` insertions into the active sub-filter at clock_, `filled` of
  /// whose cells were empty before.
  void commit_inserts(std::uint64_t n, std::uint64_t filled);
  void clear_all(Tick now);
  void catch_up(SubFilter& s, Tick old_clock, Tick now);
  template <unsigned Bits>
  void scrub_lines(SubFilter& s, std::uint64_t count, Tick ref, std::uint64_t extra_age);
  void refresh_threshold();
  /// Load per line the active sub-filter may reach now (the budget rule).
  [[nodiscard]] double active_lambda() const;
  /// Reads the budget's pressure level (once per tick) and retargets.
  void observe_budget();
  void set_target(double fpp);
  /// Folds the active sub-filter when it is at least twice what it needs,
  /// or shrinks it when it is kShrinkFrom x that and cannot fold.
  void maybe_fold();
  /// Shrinks an active younger than a window, once the stream has lived
  /// one, to what it will hold at `rate` when its first entries leave;
  /// `lambda` is the load per line it may reach now.
  void shrink_young(SubFilter& a, double rate, double lambda);
  /// Rebuilds `s` over a hash range of `span` lines (a divisor of its own)
  /// in `lines` held lines (span / 2 <= lines <= span), keeping every live
  /// entry: a fold (span = lines = s.span / d) or a shrink (span = s.span).
  template <unsigned Bits>
  void remap(SubFilter& s, std::uint64_t span, std::uint64_t lines);
  /// remap<timer_bits>(s, span, lines).
  void remap_by(SubFilter& s, std::uint64_t span, std::uint64_t lines);
  /// The lines `s` folds to for `need`: the smallest proper divisor of its
  /// hash range that is >= need, if fewer than it holds; 0 when none is.
  [[nodiscard]] static std::uint64_t fold_lines(const SubFilter& s, std::uint64_t need);
  /// Fewest held lines (at least the floor and half of s.span) at which `s`
  /// holding `holds` elements stays within the fpp of load `lambda`;
  /// s.lines when none is fewer.
  [[nodiscard]] std::uint64_t shrink_size(const SubFilter& s, double holds, double lambda) const;
  /// Estimated fpp of a sub-filter of `lines` held lines over a hash range
  /// of `span` holding `elements`.
  [[nodiscard]] double fpp_of(std::uint64_t span, std::uint64_t lines, double elements) const;
  /// Elements `s` holds when it reaches the fpp of load `lambda` (lambda x
  /// lines unless shrunk).
  [[nodiscard]] double capacity(const SubFilter& s, double lambda) const;
  /// The sealed sub-filters' fpp estimates summed (all but the active).
  [[nodiscard]] double sealed_fpp() const;
  /// The active's load per line when the sealed sub-filters' estimates sum
  /// to `sealed` (active_lambda()).
  [[nodiscard]] double lambda_for_sealed(double sealed) const;
  /// Over a budget's limit, while this filter holds more than its share of
  /// it: folds sealed sub-filters to the load the effective target allows
  /// them, then the active down to what is left of the share, so that the
  /// partitions that grew later get room.
  void give_back();
  /// What fold_drained() keeps for the active: the current rate, its room
  /// now, and the sealed sub-filters' fpp estimates summed.
  struct DrainGuard {
    double rate = 0;
    double room = 0;
    double sealed_fpp = 0;
  };
  /// Folds the sealed `s` to what its live entries need at their share (of
  /// `alive`, the filter's live entries) of the effective target; returns
  /// the lines freed. With a `guard`, shrinks it in place when no fold
  /// fits, and neither when that would fill the active before `s` drains.
  std::uint64_t fold_sealed(SubFilter& s, double alive, const DrainGuard* guard);
  /// Every sealed sub-filter, at every tick, as it drains (fold_sealed()).
  void fold_drained();
  /// This filter's share of the budget's limit (in proportion to its
  /// published demand at the target) while the total demand exceeds the
  /// limit; -1 otherwise (no limited budget, or everything fits).
  [[nodiscard]] double budget_part() const;
  /// Cell bytes of all sub-filters.
  [[nodiscard]] std::uint64_t held_bytes() const;
  /// stats().bytes: the cells and each sub-filter's ring of counts.
  [[nodiscard]] std::uint64_t state_bytes() const;
  /// Ticks (kFoldHorizonShare of the window, at least one) whose rate a
  /// fold keeps.
  [[nodiscard]] Tick fold_horizon() const;
  /// Ticks (kGrowthHorizonShare of the window, at least one) whose rate
  /// sizes growth.
  [[nodiscard]] Tick growth_horizon() const;
  /// Ticks of counts the growth rules can read: since the first insertion,
  /// or since the counts were cleared if later.
  [[nodiscard]] Tick history() const { return clock_ - std::max(first_tick_, history_from_); }
  /// Insertions per tick that size growth: the larger of the rates over the
  /// last growth_horizon() and a quarter of it, each over at least `least`
  /// ticks; -1 if there are none.
  [[nodiscard]] double growth_rate(Tick least = 1) const;
  /// Expands the active in place by an integer factor (every line copied
  /// into the lines that replace it) when it is about to fill, the window
  /// has turned over, and that holds less than sealing it and adding one
  /// sized by growth_target() would ("Growth in place"); true if it did.
  bool maybe_expand();
  /// Lines a new sub-filter sized by `want` gets (seal_and_grow()'s share
  /// of the target).
  [[nodiscard]] std::uint64_t growth_lines(const GrowthTarget& want) const;
  /// expand() within the memory budget: the extra lines reserved first and
  /// charged to `a`; false when the budget or the memory refuses them.
  bool expand_charged(SubFilter& a, std::uint64_t factor);
  /// Copies every line of `s` into `factor` lines, keeping its live codes;
  /// false when the memory for it cannot be had.
  template <unsigned Bits>
  bool expand(SubFilter& s, std::uint64_t factor);
  /// Live entries of `s` counted once per line holding a copy of each
  /// (SubFilter::copies_before): the load the fpp model sees.
  [[nodiscard]] double counted(const SubFilter& s) const;
  /// Seals the active sub-filter and adds one sized by growth_target(); at
  /// the sub-filter cap or when the budget refuses, a sealed one with room
  /// takes over, else enter_overfull().
  void seal_and_grow();
  /// Growth refused until the next tick: under a budget the active takes
  /// inserts up to the load at which it alone reaches the effective target,
  /// then rejects new identities; without one it takes every insert.
  void enter_overfull();
  /// Makes the sealed sub-filter with the most room under the fpp sum rule
  /// the active one (Growth::kDensity only); false when none has room.
  bool reactivate_roomiest();
  /// What a new sub-filter sized from the rate should hold; the rate is
  /// trusted up to `step` times what the window holds (kMaxGrowthStep for
  /// a sub-filter added by a seal; an expansion's worth check passes
  /// infinity: it weighs the expansion against what the rate needs).
  [[nodiscard]] GrowthTarget growth_target(double step = kMaxGrowthStep) const;
  /// What seal_and_grow() adds: growth_target() (at most kSealStep x the
  /// window past the first window, with a horizon of two ticks or more),
  /// or, when the active filled within the growth horizon of being added,
  /// the rate over its life uncapped (a climb that outran the cap).
  [[nodiscard]] GrowthTarget seal_target() const;
  /// Insertions per tick over the complete ticks of the last `horizon`
  /// ticks (since the first insertion if later); -1 if there are none.
  [[nodiscard]] double recent_rate(Tick horizon) const;
  /// The most the window can hold on a stream whose identities recur: what
  /// it holds now over the share of the queries of the last growth_horizon()
  /// ticks that were repeats (see "Growth in place"); +inf when none were
  /// or there were no queries.
  [[nodiscard]] double domain_bound() const;
  /// The least factor by which the active `a`, with `room` left, keeps up
  /// over the next window with new identities arriving at `rate` now and
  /// fewer as the domain of `bound` (domain_bound()) fills (see "Growth in
  /// place": the window's schedule).
  [[nodiscard]] double schedule_factor(const SubFilter& a, double room, double rate,
                                       double bound) const;
  /// Queries and insertions over the complete buckets of the last
  /// `horizon` ticks (since the first insertion if later), and their ticks.
  struct Recent {
    double inserted = 0;
    double queried = 0;
    double ticks = 0;
  };
  [[nodiscard]] Recent recent(Tick horizon) const;
  /// Lines holding `elements` at `lambda` elements per line, within
  /// min/max_bytes, rounded up to a multiple of kFoldGrain.
  [[nodiscard]] std::uint64_t lines_for(double elements, double lambda) const;
  /// A new sub-filter of `lines` created at the clock, its cells reserved in
  /// the budget (`required`: charged whatever the limit; otherwise as many
  /// lines as the budget has left, at least `least`, 0 = all); null when the
  /// budget refuses or memory is exhausted.
  [[nodiscard]] std::unique_ptr<SubFilter> new_subfilter(std::uint64_t lines, bool required,
                                                         std::uint64_t least = 0);
  /// Lines of the sub-filter a fresh filter starts with.
  [[nodiscard]] std::uint64_t floor_lines() const noexcept;
  [[nodiscard]] double subfilter_fpp(const SubFilter& s) const;
  /// What stats() reports for `s`: subfilter_fpp(), or near saturation the
  /// larger of it and the probability read from the cells themselves.
  [[nodiscard]] double reported_fpp(const SubFilter& s) const;
  template <unsigned Bits>
  [[nodiscard]] double cells_fpp(const SubFilter& s) const;
  [[nodiscard]] std::uint64_t alive_total() const;
  template <unsigned Bits>
  Decision decide(const Fingerprint& fp);
  template <unsigned Bits>
  void write(const Fingerprint& fp);
  /// The batch loop around one probe (`Prober::run`, see timer_filter.cc).
  template <unsigned Bits, class Prober>
  void run_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                 std::span<Decision> out);
  /// One run of run_batch: elements [i, end) at the clock, seen through a
  /// View copied from view_; returns the first element not decided.
  template <unsigned Bits, class Prober, class View>
  std::size_t run_tick(std::span<const Fingerprint> fps, std::span<Decision> out, std::size_t i,
                       std::size_t end, std::size_t prefetch_end);
  template <unsigned Bits, unsigned K>
  void decide_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                    std::span<Decision> out);
  /// 8-bit timers on AVX2 and AVX-512 CPUs (simd.h).
  template <unsigned K>
  void decide_batch_avx2(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                         std::span<Decision> out);
  template <unsigned K>
  void decide_batch_avx512(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                           std::span<Decision> out);
  template <unsigned Bits>
  void decide_batch_k(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                      std::span<Decision> out);

  FilterConfig config_;
  std::shared_ptr<MemoryBudget> budget_;  // null: not accounted; outlives subs_
  BudgetLevel budget_level_;              // the level this filter sizes for
  MemoryDemand demand_;                   // what it would need at each level
  std::vector<double> level_lambda_;      // load per line at each level's target
  std::vector<std::uint64_t> demand_bytes_;
  /// Publishes what the filter would need at each level (once per tick).
  void publish_demand();
  double target_ = 0;  // effective fpp: config_.fpp raised by the budget
  // Growth refused this tick: the active takes inserts up to the load of
  // overfull_limit_, then new identities are rejected (judged duplicates)
  // until the next tick.
  bool overfull_ = false;
  std::uint32_t cells_per_line_ = 0;
  std::uint32_t k_ = 0;
  std::uint32_t modulus_ = 0;  // M = 2^b - 1 nonzero codes
  std::uint32_t period_ = 0;   // P: ticks per full scrub sweep
  double lambda_full_ = 0;     // load per line at kBudgetShare * target_
  std::shared_ptr<const sizing::BlockedModel> model_;
  std::vector<std::unique_ptr<SubFilter>> subs_;  // oldest first; back() is active
  std::uint64_t active_limit_ = 0;                // elements the active may hold now
  Tick clock_ = 0;
  TickView view_;
  Tick first_tick_ = 0;             // tick of the first insertion (rate estimate)
  Tick history_from_ = 0;           // ticks before this have no counts (a clear)
  std::uint64_t tick_inserts_ = 0;  // insertions at the current clock value
  std::uint64_t insertions_ = 0;
  // Queries (test_and_insert), and their rate per tick: a moving average
  // over about kFoldHorizonShare of the window. An
  // overfull filter inserts only what it does not mistake for a duplicate,
  // so its demand comes from what arrives (publish_demand()).
  std::uint64_t arrivals_ = 0;
  std::uint64_t arrivals_booked_ = 0;  // ... counted into arrival_rate_
  double arrival_rate_ = 0;
  // New identities judged duplicates for want of room (overfull_ at its
  // limit), and their rate per tick, averaged as arrival_rate_.
  std::uint64_t rejected_ = 0;
  std::uint64_t rejected_booked_ = 0;
  double rejected_rate_ = 0;
  std::uint64_t overfull_limit_ = 0;  // elements the active may hold while overfull_
  // Queries per window bucket over the last growth_horizon() ticks and a
  // bucket more, at the tick they were made at (domain_bound()).
  std::unique_ptr<WindowCount> queries_;
  std::uint32_t queries_span_ = 0;  // ... in ticks
};

}  // namespace kdedup::filter
