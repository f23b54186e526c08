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
//   - Growth: every other new part is asked for with try_reserve(). When it
//     fails the filter must not allocate: it keeps working with the parts it
//     has (the timer filter keeps inserting into its active sub-filter, the
//     aging filter keeps its current generation open), which raises its
//     false-positive rate but never causes a false negative and never evicts
//     a live entry, and it asks again at its next tick, not at its next
//     record.
//   - The fpp it aims for: fpp_scale() multiplies every filter's target
//     false-positive probability (effective_fpp()). A failed reservation
//     raises the pressure level one step (the scale doubles), for every
//     filter at once: each sizes its next parts for the higher target and
//     lets its current parts hold more, so the partitions degrade evenly
//     instead of the last one to ask losing. A filter reads the level once
//     per tick and passes the level it saw to try_reserve() and release(),
//     so one round of failures raises it one step, not one step per filter.
//   - When the load falls: while the used bytes stay under kLowerBelow of
//     the limit, the level falls one step per round (hysteresis: one step up
//     frees 15-30% of the bytes at the usual targets, so the level comes
//     back down only once it would fit again). A filter calls settle() with
//     the level it saw once per tick, and release() does the same; back at
//     level 0 every filter sizes for its configured fpp again.
// A budget without a limit (max_bytes 0) never refuses and stays at level 0;
// it still counts, for kdedup_memory_used_bytes.
//
// Thread-safe: atomics only (a compare-and-swap per reservation, no lock),
// shared through std::shared_ptr by every Slice of a process. on_change
// runs on the thread whose reservation or release changed the level.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

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
  };

  struct Options {
    std::uint64_t max_bytes = 0;  ///< 0 = no limit (count only)
    /// The filters' configured fpp: bounds the level, so that the scale
    /// stops where effective_fpp() stops (kMaxEffectiveFpp).
    double fpp = 0.01;
    /// Called once per change of level (any thread; must be thread-safe).
    std::function<void(const Change&)> on_change;
  };

  /// The pressure level falls one step when a release leaves less than this
  /// share of max_bytes reserved.
  static constexpr double kLowerBelow = 0.6;

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

  /// Reserves `bytes` when they fit under max_bytes and returns true.
  /// Otherwise reserves nothing, raises the level one step if it still is
  /// `seen_level` (the level the caller sized its request at), and returns
  /// false: the caller must not allocate.
  [[nodiscard]] bool try_reserve(std::uint64_t bytes, std::uint32_t seen_level) noexcept;
  /// Counts `bytes` whatever the limit (a filter's floor, restored state).
  void charge(std::uint64_t bytes) noexcept;
  /// Returns `bytes` reserved or charged earlier. Lowers the level one step
  /// if it still is `seen_level` and less than kLowerBelow of max_bytes stays
  /// reserved.
  void release(std::uint64_t bytes, std::uint32_t seen_level) noexcept;
  /// release() without lowering the level (a filter detaching).
  void release(std::uint64_t bytes) noexcept;
  /// Lowers the level one step if it still is `seen_level` (> 0) and less
  /// than kLowerBelow of max_bytes is reserved. Cheap (two relaxed loads);
  /// a filter calls it once per tick.
  void settle(std::uint32_t seen_level) noexcept;

 private:
  void change_level(std::uint32_t from, std::uint32_t to) noexcept;

  Options options_;
  std::uint32_t max_level_ = 0;
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint32_t> level_{0};
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
  /// Releases what is held; `seen_level` as for MemoryBudget::release (by
  /// default the level is left alone).
  void reset(std::uint32_t seen_level = kNoLevel) noexcept;
  /// Replaces the held amount with `bytes` (charged past the limit when
  /// larger): for parts that resize in place (the exact filter's table).
  void resize(std::uint64_t bytes) noexcept;
  /// Releases all but `bytes` (<= bytes()); `seen_level` as for
  /// MemoryBudget::release: a part that shrank in place.
  void shrink_to(std::uint64_t bytes, std::uint32_t seen_level) noexcept;

  static constexpr std::uint32_t kNoLevel = ~std::uint32_t{0};

 private:
  std::shared_ptr<MemoryBudget> budget_;
  std::uint64_t bytes_ = 0;
};

}  // namespace kdedup::filter
