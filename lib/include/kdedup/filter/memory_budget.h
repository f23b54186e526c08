#pragma once
// MemoryBudget: the instance-wide memory budget (`memory.max_bytes`) that the
// filters of every partition of one process share (DESIGN.md "Memory follows
// load").
//
// What is counted: the bytes of filter state proper (timer sub-filter cells,
// aging slice bits, the exact filter's table), the figure each filter
// reports as FilterStats::bytes less its small fixed bookkeeping. Everything
// else a process holds (client buffers, RocksDB, the audit shadow sets) is
// the fixed overhead on top of the budget.
//
// The contract for a filter type (timer, aging, exact; any type added later
// implements SlidingFilter::set_memory_budget the same way):
//   - Who reserves: the filter itself, on the thread that owns it, whenever
//     it allocates or frees a part (a sub-filter, a slice, a table resize),
//     never per record. A MemoryCharge member per part does it: it releases
//     on destruction, so a part can never leak its reservation.
//   - What it may not do without: the part it starts with (its floor) and
//     the state it holds when the budget is attached (a restored snapshot)
//     are charged with charge(), which counts past the limit. Those are the
//     only bytes a budget ever admits past its limit.
//   - Growth: every other new part is asked for with try_reserve() (or
//     reserve_up_to(), which grants half of what is free when the whole does
//     not fit, down to a minimum, so one request never leaves the others
//     nothing). While the total demand (below) exceeds the limit, a filter
//     that can size its parts asks for no more than its share of the limit,
//     in proportion to its own demand at level 0. When a request fails the
//     filter must not allocate: it keeps working with the parts it
//     has (the timer filter keeps inserting into its active sub-filter, the
//     aging filter keeps its current generation open), which raises its
//     false-positive rate but never causes a false negative and never evicts
//     a live entry, and it asks again at its next tick, not at its next
//     record.
//   - The fpp it aims for: fpp_scale() = 2^level() multiplies every
//     filter's target false-positive probability (effective_fpp()), for
//     every filter at once: each sizes its next parts for the higher target
//     and lets its current parts hold more, so the partitions degrade
//     evenly instead of the last one to ask losing.
//   - What sets the level: demand. Once per tick a filter publishes, through
//     its MemoryDemand, the bytes it would need at every level for what its
//     window holds and its insertion rate brings; a filter whose partition
//     went quiet (its clock stands still) lowers it to what it holds
//     (SlidingFilter::quiet(), MemoryDemand::cap()). The level is the lowest
//     one at which the sum over all filters fits in kFitShare of the limit:
//     settle() (every filter calls it once per tick of its clock; the
//     process that owns the filters also once a second by the wall clock,
//     with a BudgetLevel of its own in milliseconds: event-time clocks stand
//     still once every partition went quiet) raises it to that
//     level at once (a load that keeps rising would outrun one step at a
//     time: the filters overfill what they hold while the level climbs) and
//     lowers it one step at a time, and only after the caller has run
//     kSettleShare of its window at the level it saw (it passes kHold
//     before that), so that each change takes effect before the next. It
//     falls back only once the level below fits in kLowerShare
//     (hysteresis) and no reservation was refused since the caller's
//     previous settle() (a saturated filter inserts little and
//     under-reports its need; refuse() counts a filter that did not ask
//     because it holds its share): when the load falls, the fpp returns to
//     target. A refused filter makes do with what it holds until its next
//     tick (a timer filter fills its active up to the effective target,
//     then rejects new identities).
// A budget without a limit (max_bytes 0) never refuses and stays at level 0;
// it still counts, for kdedup_memory_used_bytes. A filter that cannot trade
// accuracy for memory (exact) charges what it holds and publishes it as its
// demand at every level: it is counted, never limited.
//
// Thread-safe: atomics only (a compare-and-swap per reservation, a few adds
// per published demand, no lock), shared through std::shared_ptr by every
// Slice of a process. on_change runs on the thread whose settle() changed
// the level.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace kdedup::filter {

/// The largest false-positive probability budget pressure raises a target
/// to (a filter configured above it keeps its own target).
inline constexpr double kMaxEffectiveFpp = 0.25;

/// `fpp` raised by `scale` (>= 1), at most max(fpp, kMaxEffectiveFpp).
[[nodiscard]] double effective_fpp(double fpp, double scale) noexcept;

class MemoryBudget {
 public:
  /// A change of the pressure level.
  struct Change {
    std::uint32_t level = 0;     ///< new level; 0 = every filter at its target
    std::uint32_t previous = 0;  ///< level before
    double scale = 1.0;          ///< fpp_scale() at the new level
    std::uint64_t used = 0;      ///< bytes reserved when it changed
    std::uint64_t max_bytes = 0;
    /// Not a change of level: at max_level() the published demand still
    /// exceeds max_bytes, which raising the fpp cannot mend (the filters'
    /// floors alone may not fit). Reported once each time it starts.
    bool unmet = false;
    /// The filters' published demand at `level`, and how many filters share
    /// the budget.
    std::uint64_t demand = 0;
    std::uint32_t filters = 0;
  };

  struct Options {
    std::uint64_t max_bytes = 0;  ///< 0 = no limit (count only)
    /// The filters' configured fpp: bounds the level, so that the scale
    /// stops where effective_fpp() stops (kMaxEffectiveFpp).
    double fpp = 0.01;
    /// Called once per change of level, and when the demand starts to
    /// exceed max_bytes at the top level (Change::unmet) (any thread; must be
    /// thread-safe).
    std::function<void(const Change&)> on_change;
  };

  /// The level is the lowest at which the demand fits in this share of
  /// max_bytes (room for the parts a window still holds while it turns over).
  static constexpr double kFitShare = 0.85;
  /// It falls one step only once the level below fits in this share.
  static constexpr double kLowerShare = 0.75;
  /// Share of its window a filter runs at a level before it may move it.
  static constexpr double kSettleShare = 1.0 / 8;
  /// As `seen_level`: reserve, release or settle without moving the level.
  static constexpr std::uint32_t kHold = ~std::uint32_t{0};
  /// Levels a budget may reach (fpp >= 1e-9 needs at most 28).
  static constexpr std::uint32_t kMaxLevels = 32;

  explicit MemoryBudget(Options options);
  /// No limit, counting only.
  MemoryBudget() : MemoryBudget(Options{}) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  [[nodiscard]] std::uint64_t max_bytes() const noexcept { return options_.max_bytes; }
  [[nodiscard]] std::uint64_t used() const noexcept {
    return used_.load(std::memory_order_relaxed);
  }
  /// Pressure level: the filters' targets are multiplied by 2^level.
  [[nodiscard]] std::uint32_t level() const noexcept {
    return level_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint32_t max_level() const noexcept { return max_level_; }
  /// 2^level(): the factor on every filter's target fpp.
  [[nodiscard]] double fpp_scale() const noexcept;
  /// effective_fpp(options.fpp, fpp_scale()): what the filters size for now.
  [[nodiscard]] double effective_fpp() const noexcept;

  /// Reserves `bytes` when they fit under max_bytes and returns true;
  /// otherwise reserves nothing and returns false: the caller must not
  /// allocate.
  [[nodiscard]] bool try_reserve(std::uint64_t bytes) noexcept;
  /// Reserves `want` if it fits, else half of what is free (at least
  /// `least` <= want), and returns it; 0 when not even `least` fits. A part
  /// that can be smaller than it would like (a timer sub-filter) takes part
  /// of what is left, and leaves the rest to the other filters.
  [[nodiscard]] std::uint64_t reserve_up_to(std::uint64_t least, std::uint64_t want) noexcept;
  /// Counts `bytes` whatever the limit (a filter's floor, restored state).
  void charge(std::uint64_t bytes) noexcept;
  /// Counts a refusal without a reservation: a filter that needs a part it
  /// does not ask for (it holds its share of the limit already, or as many
  /// parts as it may), so that the level does not fall meanwhile.
  void refuse() noexcept { refusals_.fetch_add(1, std::memory_order_relaxed); }
  /// Returns `bytes` reserved or charged earlier.
  void release(std::uint64_t bytes) noexcept;
  /// Raises the level to the lowest one at which the published demand fits,
  /// or lowers it one step towards it (see the file comment), if it still
  /// is `seen_level`; kHold does nothing. `refusals_seen` is the caller's
  /// own: the refusal count at its previous settle(), updated; it lowers
  /// the level only if no reservation was refused since (so that a caller
  /// settling more often than the others cannot hide a refusal from them).
  /// A few relaxed loads; a filter calls it once per tick.
  void settle(std::uint32_t seen_level, std::uint64_t& refusals_seen) noexcept;
  /// Total demand published for `level`, in bytes.
  [[nodiscard]] std::uint64_t demand(std::uint32_t level) const noexcept {
    return demand_[level].load(std::memory_order_relaxed);
  }
  /// The demand at level 0 with every filter sharing the budget that has not
  /// published one yet (its first tick has not come) counted as needing
  /// `mine`: a filter sizing a part before the others have spoken (the first
  /// tick of a process) takes no more than its share of the limit.
  [[nodiscard]] std::uint64_t expected_demand(std::uint64_t mine) const noexcept;

 private:
  friend class MemoryDemand;
  void change_level(std::uint32_t from, std::uint32_t to) noexcept;
  [[nodiscard]] Change change(std::uint32_t from, std::uint32_t to) const noexcept;
  void note_unmet(bool unmet) noexcept;

  Options options_;
  std::uint32_t max_level_ = 0;
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint32_t> level_{0};
  std::array<std::atomic<std::uint64_t>, kMaxLevels + 1> demand_{};
  std::atomic<std::uint32_t> members_{0};     // MemoryDemands attached
  std::atomic<std::uint32_t> publishers_{0};  // ... of which have published
  std::atomic<std::uint64_t> refusals_{0};    // reservations refused
  std::atomic<bool> unmet_{false};            // Change::unmet reported, still so
};

/// One filter's place on the budget's levels: the level it sizes for and
/// the tick it first saw it. Once a tick it votes in MemoryBudget::settle()
/// (its level once it ran kSettleShare of its window at it, kHold before)
/// and follows the budget's level. Not thread-safe: the filter's own.
class BudgetLevel {
 public:
  /// Follows `level` from tick `now` on (a budget attached or restored).
  void reset(std::uint32_t level, std::uint64_t now) noexcept {
    level_ = level;
    since_ = now;
  }
  /// Votes and follows; true when the level changed.
  bool follow(MemoryBudget& budget, std::uint64_t now, std::uint32_t ticks_per_window);
  [[nodiscard]] std::uint32_t level() const noexcept { return level_; }
  /// `fpp` raised by this level (effective_fpp(fpp, 2^level)).
  [[nodiscard]] double raise(double fpp) const noexcept;

 private:
  std::uint32_t level_ = 0;
  std::uint64_t since_ = 0;
  std::uint64_t refusals_seen_ = 0;  // MemoryBudget::settle()'s
};

/// What one filter would need at each pressure level, published into its
/// MemoryBudget (summed over filters there) and withdrawn on destruction.
/// Owned by the filter, used on its thread.
class MemoryDemand {
 public:
  MemoryDemand() = default;
  explicit MemoryDemand(std::shared_ptr<MemoryBudget> budget) : budget_(std::move(budget)) {
    if (budget_) budget_->members_.fetch_add(1, std::memory_order_relaxed);
  }
  ~MemoryDemand() { leave(); }
  MemoryDemand(MemoryDemand&& o) noexcept
      : budget_(std::move(o.budget_)),
        bytes_(std::move(o.bytes_)),
        published_(std::exchange(o.published_, false)) {}
  MemoryDemand& operator=(MemoryDemand&& o) noexcept {
    if (this != &o) {
      leave();
      budget_ = std::move(o.budget_);
      bytes_ = std::move(o.bytes_);
      published_ = std::exchange(o.published_, false);
    }
    return *this;
  }
  MemoryDemand(const MemoryDemand&) = delete;
  MemoryDemand& operator=(const MemoryDemand&) = delete;

  /// Levels the budget may reach (0 without a budget or a limit): the size
  /// publish() expects.
  [[nodiscard]] std::uint32_t levels() const noexcept;
  /// Replaces the published demand: bytes[L] is what the filter would need
  /// at level L (levels() values).
  void publish(std::span<const std::uint64_t> bytes) noexcept;
  /// Lowers the published demand at every level to at most `bytes` (a
  /// filter that will not allocate until its next tick: SlidingFilter::quiet()).
  void cap(std::uint64_t bytes);
  /// The published demand at level 0 (0 before the first publish()).
  [[nodiscard]] std::uint64_t at_target() const noexcept {
    return bytes_.empty() ? 0 : bytes_.front();
  }

 private:
  void withdraw() noexcept;
  void leave() noexcept;

  std::shared_ptr<MemoryBudget> budget_;
  std::vector<std::uint64_t> bytes_;
  bool published_ = false;  // counted in the budget's publishers_
};

/// Bytes one part of a filter holds against a MemoryBudget; released when
/// the charge is destroyed or reassigned. Movable, not copyable; a default
/// (empty) charge holds nothing. Lives in the filter that owns the part, on
/// that filter's thread.
class MemoryCharge {
 public:
  MemoryCharge() = default;
  /// Counts `bytes` already reserved (try_reserve) or charged in `budget`.
  MemoryCharge(std::shared_ptr<MemoryBudget> budget, std::uint64_t bytes) noexcept
      : budget_(std::move(budget)), bytes_(bytes) {}
  ~MemoryCharge() { reset(); }
  MemoryCharge(MemoryCharge&& o) noexcept
      : budget_(std::move(o.budget_)), bytes_(std::exchange(o.bytes_, 0)) {}
  MemoryCharge& operator=(MemoryCharge&& o) noexcept {
    if (this != &o) {
      reset();
      budget_ = std::move(o.budget_);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  MemoryCharge(const MemoryCharge&) = delete;
  MemoryCharge& operator=(const MemoryCharge&) = delete;

  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }
  /// Releases what is held.
  void reset() noexcept;
  /// Replaces the held amount with `bytes` (charged past the limit when
  /// larger): for parts that resize in place (the exact filter's table, a
  /// folded timer sub-filter).
  void resize(std::uint64_t bytes) noexcept;
  /// Adds `bytes` reserved in the budget already (try_reserve) to what is
  /// held: for a part that grows in place (an expanded timer sub-filter).
  void add_reserved(std::uint64_t bytes) noexcept { bytes_ += bytes; }

 private:
  std::shared_ptr<MemoryBudget> budget_;
  std::uint64_t bytes_ = 0;
};

}  // namespace kdedup::filter
