#pragma once
// The interface every sliding-window duplicate filter implements.
//
// Time is measured in ticks: window / ticks_per_window. An entry inserted at
// tick t is alive at tick `now` iff now - t <= ticks_per_window. With ticks
// of length L = window / W this gives the documented guarantee: an identity
// delivered at time t is remembered for at least `window` and at most
// `window + L` (floor(t/L) loses less than one tick on either side).
//
// Decisions follow first-test-then-set (seed 000 §4): a fingerprint is
// inserted only when the filter judges it distinct, so duplicates never
// extend their own lifetime (unless the caller asks for that with
// test_and_refresh_batch, `on_duplicate: refresh`).
//
// Threading: a filter instance is owned by one thread (the worker that owns
// its Slice). No method is thread-safe; stats() and serialize() must be
// called from the owning thread too.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kdedup/common/result.h"
#include "kdedup/filter/fingerprint.h"

namespace kdedup::filter {

class MemoryBudget;

using Tick = std::uint64_t;

enum class Decision : std::uint8_t { kDistinct = 0, kDuplicate = 1 };

enum class FilterType : std::uint8_t { kTimer = 1, kAging = 2, kExact = 3, kCompact = 4 };

/// How the timer filter decides to grow (seed 000 §5).
enum class Growth : std::uint8_t {
  kDensity = 0,      ///< seal when the last window's exact insert count passes the fpp budget
  kCardinality = 1,  ///< seal when the insert count since creation passes the fpp budget
};

/// Everything that shapes a filter's decisions. Two filters built from equal
/// configs make the same decisions for the same input. Which fields a filter
/// type uses is documented on the field.
struct FilterConfig {
  FilterType type = FilterType::kTimer;
  std::uint32_t ticks_per_window = 0;  ///< W; 0 = the type's default
  double fpp = 0.01;                   ///< target false-positive probability
  /// Expected distinct ids per window: a starting hint only. A filter
  /// starts with at most what min_bytes holds and then sizes itself from the
  /// measured insertion rate (DESIGN.md "Memory follows load").
  std::uint64_t capacity = 100'000;
  // timer filter
  std::uint8_t timer_bits = 8;    ///< 4, 8 or 16
  std::uint8_t equal_timers = 0;  ///< k' of the equal-timers heuristic; 0 = off
  Growth growth = Growth::kDensity;
  /// The floor: what an idle filter holds at most (timer: its first
  /// sub-filter; aging: its first k + l slices together; compact: its first
  /// table), and the smallest new timer sub-filter or compact table.
  std::uint64_t min_bytes = 64 * 1024;
  std::uint64_t max_bytes = 1024ULL << 20;  ///< largest new sub-filter / table (timer, compact)
};

/// Counters and sizes a filter reports; cheap to compute.
struct FilterStats {
  std::uint64_t bytes = 0;  ///< memory held by filter state
  std::uint64_t cells = 0;  ///< cells (timer) / bits (aging) / entries (exact) / slots (compact)
  std::uint64_t live_cells = 0;   ///< cells currently non-empty
  std::uint32_t subfilters = 0;   ///< sub-filters (timer), slices (aging) or tables (compact)
  std::uint64_t insertions = 0;   ///< distinct decisions since creation
  double fpp_estimate = 0.0;      ///< estimated false-positive probability now
  std::uint64_t slice0_bits = 0;  ///< aging: size of the newest slice; 0 otherwise
  /// The most `bytes` held as a tick closed (from a tick's last element to
  /// the next tick's first, which may free or fold a part), since the filter
  /// was made or restored; at least `bytes`.
  std::uint64_t bytes_peak = 0;
};

class SlidingFilter {
 public:
  virtual ~SlidingFilter() = default;

  [[nodiscard]] virtual FilterType type() const noexcept = 0;
  [[nodiscard]] virtual const FilterConfig& config() const noexcept = 0;

  /// Tests `fp` at tick `now`; inserts it when distinct. `now` must not go
  /// backwards across calls (the partition clock is monotonic).
  virtual Decision test_and_insert(const Fingerprint& fp, Tick now) = 0;

  /// Same decisions, in order, as calling test_and_insert on each element;
  /// ticks[i] is the clock for fps[i] and must be non-decreasing.
  /// `out` must be as long as `fps`. Implementations may prefetch ahead.
  virtual void test_and_insert_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                                     std::span<Decision> out);

  /// Records `fp` as delivered at tick `now` whatever the filter says about
  /// it: its lifetime (re)starts at `now`, as if test_and_insert had judged
  /// it distinct. Used where the decision was already made elsewhere: a
  /// rebuild from the records a previous owner delivered (recovery), and
  /// `on_duplicate: refresh` (a duplicate renews its identity). Same clock
  /// rule as test_and_insert.
  virtual void insert(const Fingerprint& fp, Tick now) = 0;

  /// Moves the clock to `now` without a record (idle partitions still expire).
  virtual void advance(Tick now) = 0;

  [[nodiscard]] virtual FilterStats stats() const = 0;

  /// Shares an instance-wide memory budget from now on (memory_budget.h has
  /// the contract): the filter charges the bytes it holds now, reserves
  /// before every new part and releases every part it frees, and sizes for
  /// the budget's effective fpp. Called once, by whoever builds the Slice,
  /// before the first record (a restored filter right after restore). The
  /// default does nothing: a filter type that does not override it is
  /// neither counted nor limited.
  virtual void set_memory_budget(std::shared_ptr<MemoryBudget> budget);

  /// The partition went quiet (no record for a while by the wall clock: the
  /// caller's judgement; the filter's clock is event time and stands still
  /// meanwhile). Until its clock next moves the filter allocates nothing, so
  /// the demand it published into its memory budget (what it would need for
  /// its window at each pressure level) is lowered to what it holds: a
  /// partition that went quiet after a burst does not keep every other
  /// partition's effective fpp raised. Its next tick publishes its demand
  /// afresh. The default does nothing (no budget, or a filter that
  /// publishes what it holds).
  virtual void quiet() {}

  /// Called about once a second by the owner, busy or idle: a wrapper that
  /// reports on the filter now and then, after a batch, reports what the
  /// last batch left unreported (a partition's last batch before it goes
  /// quiet). The default does nothing.
  virtual void flush() {}

  /// Full state in a versioned, checksummed envelope (kdedup/common/bytes.h).
  [[nodiscard]] virtual std::string serialize() const = 0;

  /// A wrapper (the pipeline's instrumentation) wraps `inner` from now on
  /// and returns the filter it wrapped. With `inner` null it wraps nothing
  /// and takes no other call until it is given a filter again (a parked
  /// partition, pipeline/slice.h). A filter that wraps none returns `inner`.
  virtual std::unique_ptr<SlidingFilter> exchange_wrapped(std::unique_ptr<SlidingFilter> inner) {
    return inner;
  }

 protected:
  /// A filter calls this as its clock leaves a tick, with the bytes its
  /// stats() would give then, before it frees or folds anything.
  void close_tick(std::uint64_t bytes) noexcept { closed_peak_ = std::max(closed_peak_, bytes); }
  /// FilterStats::bytes_peak for `bytes` held now.
  [[nodiscard]] std::uint64_t peak_with(std::uint64_t bytes) const noexcept {
    return std::max(closed_peak_, bytes);
  }

 private:
  std::uint64_t closed_peak_ = 0;
};

/// `on_duplicate: refresh`: the decisions test_and_insert makes, with every
/// duplicate also renewing its identity (insert at its tick) before the next
/// element is decided, so a later copy in the same batch sees the renewal.
/// An identity then stays a duplicate while it keeps occurring at least once
/// per window, and is forgotten one window after its LAST occurrence (not its
/// last delivery). Same clock rule and `out` length as test_and_insert_batch.
void test_and_refresh_batch(SlidingFilter& filter, std::span<const Fingerprint> fps,
                            std::span<const Tick> ticks, std::span<Decision> out);

/// Fills in defaults (ticks_per_window by type) and checks ranges; the error
/// names the offending field.
[[nodiscard]] Result<FilterConfig> normalize(FilterConfig config);

/// Builds an empty filter of config.type.
[[nodiscard]] Result<std::unique_ptr<SlidingFilter>> make_filter(const FilterConfig& config);

/// Rebuilds a filter from serialize() output. Rejects truncated or corrupted
/// input and state of another type or config with an error.
[[nodiscard]] Result<std::unique_ptr<SlidingFilter>> restore_filter(std::string_view blob);

/// Stable 64-bit digest of every config field that shapes decisions; stored
/// with snapshots to detect a changed filter configuration.
[[nodiscard]] std::uint64_t config_fingerprint(const FilterConfig& config);

[[nodiscard]] const char* to_string(FilterType type) noexcept;
[[nodiscard]] Result<FilterType> parse_filter_type(std::string_view name);

}  // namespace kdedup::filter
