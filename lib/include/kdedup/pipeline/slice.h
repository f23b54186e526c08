#pragma once
// Slice: everything kdedup keeps for one assigned input partition (one
// horizontal slice, seed 000 Definition 1): the partition clock, the sliding
// filter, the offset tracker and the counters.
//
// Ownership and threads: a Slice is created by the consumer thread when the
// partition is assigned, then handed to exactly one worker thread, which is
// the only thread that touches it until the partition is revoked and the
// worker destroys it. Nothing in it takes a lock on the per-record path.
//
// Recovery (snapshots, DESIGN.md "Recovery protocol"): a Slice can be built
// from an existing filter (restore_filter), a partition clock and the next
// input offset, which is exactly what a snapshot holds; filter(), clock() and
// next_offset() expose the same three things for taking one.
//
// Confirmed mode (SliceOptions::confirm, DESIGN.md "Confirmed mode"): the
// Slice attaches to its partition in the confirm store when it is built
// (continuing from the snapshot it was restored from, or starting the
// partition empty) and decide() confirms the filter's duplicates there
// (pipeline/confirm.h).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/filter/memory_budget.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/filter/tick_scale.h"
#include "kdedup/pipeline/offset_tracker.h"
#include "kdedup/pipeline/stats.h"

namespace kdedup::state {
class ConfirmStore;
}

namespace kdedup::pipeline {

class Confirmer;

/// An input partition.
struct PartitionId {
  std::string topic;
  std::int32_t partition = 0;
  friend auto operator<=>(const PartitionId&, const PartitionId&) = default;
  [[nodiscard]] std::string str() const { return topic + "[" + std::to_string(partition) + "]"; }
};

/// The event-time clock of one partition (DESIGN.md "Clock").
///
/// clock = max record timestamp seen, where a timestamp beyond wall clock +
/// max_future_skew counts as wall clock + max_future_skew (one bad producer
/// clock cannot expire the whole window at once). A record without a usable
/// timestamp (missing, zero or negative) does not move the clock and is
/// judged at the current clock. Records older than the clock are judged at
/// the clock too: time only moves forward, as the filters require.
class PartitionClock {
 public:
  enum class Reading : std::uint8_t {
    kTimestamp,    ///< a usable timestamp (it may be older than the clock)
    kCapped,       ///< a timestamp beyond wall clock + skew, capped
    kNoTimestamp,  ///< missing, zero or negative: judged at the current clock
  };

  explicit PartitionClock(std::int64_t max_future_skew_ms, std::int64_t start_ms = 0)
      : skew_ms_(max_future_skew_ms), now_ms_(start_ms) {}

  /// Folds one record's timestamp in. `timestamp_ms` <= 0 means none;
  /// `wall_ms` is the current wall clock.
  Reading observe(std::int64_t timestamp_ms, std::int64_t wall_ms) noexcept;

  [[nodiscard]] std::int64_t now_ms() const noexcept { return now_ms_; }

 private:
  std::int64_t skew_ms_;
  std::int64_t now_ms_;
};

/// What shapes every Slice of a pipeline.
struct SliceOptions {
  std::int64_t window_ms = 0;
  std::int64_t max_future_skew_ms = 60'000;
  bool filter_enabled = true;  ///< false = passthrough: every record is distinct
  /// on_duplicate: refresh: a duplicate renews its identity (decide() uses
  /// filter::test_and_refresh_batch).
  bool refresh = false;
  filter::FilterConfig filter;
  /// The process's memory budget, shared by every Slice's filter (attached
  /// when the Slice is built, new or restored); null = not accounted.
  std::shared_ptr<filter::MemoryBudget> memory;
  /// Confirmed mode: the exact store the filter's duplicates are confirmed
  /// against (filter.confirm_store, `kdedup filter --confirm-store`); null =
  /// the filter decides alone. Outlives every Slice.
  state::ConfirmStore* confirm = nullptr;
};

/// Where a Slice starts: a restored snapshot (filter, clock, next offset) or,
/// with `filter` null, a new empty filter (clock 0, next offset -1).
struct SliceStart {
  std::unique_ptr<filter::SlidingFilter> filter;
  std::int64_t clock_ms = 0;
  std::int64_t next_offset = -1;
};

/// What happens to each record of a recovering partition (DESIGN.md
/// "Recovery protocol", recovery.h). C is the committed offset, E the source
/// offsets found in the output (delivered by a previous owner or by this
/// member before a crash), `end` = rebuild_until:
///   offset <  C        restored snapshot (kSnapshot): kDecide, the filter
///                      decides it exactly like any record (the snapshot
///                      holds the state before it, so the decisions are the
///                      previous owner's), nothing is produced;
///                      rebuilt from the output (kDelivered): kLearn if in E
///                      (inserted at its tick as delivered, whatever the
///                      filter says), else kSkip (it was not delivered: a
///                      duplicate, or a record without identity; only the
///                      clock moves). Replaying decisions from one window
///                      back would not reproduce them: an identity delivered
///                      just before the replay's start and dropped after it
///                      would be taken as delivered at its first copy inside
///                      the replay, moving its lifetime;
///   C <= offset < end  kLearn if in E (already emitted: learned, not produced
///                      again); else, with output in input order
///                      (`output.partitioning: input`), kDropped: one
///                      producer delivers a partition's outputs in order, so
///                      a record below H missing from the output was dropped
///                      by the previous owner (a duplicate or a false
///                      positive): it stays a duplicate, and the filter is
///                      not asked again (a probabilistic filter rebuilt
///                      from the output could answer otherwise and emit it
///                      out of order); records without identity are
///                      processed (routed per on_invalid). With
///                      `partitioning: key` kProcess: X can be in the output
///                      while X-1 (sent to another output partition) never
///                      got there, and "everything up to H" would lose X-1;
///   offset >= end      kProcess (decided, routed, produced).
///
/// With `refresh` (on_duplicate: refresh) every occurrence of an identity,
/// delivered or dropped, renews it: an occurrence is a duplicate iff the
/// identity occurred within the window before it, so the filter state at C
/// is "every identity occurring in the last window before C, at its last
/// occurrence". A rebuild from the output (kDelivered) therefore learns
/// EVERY record below C (kLearn, not kSkip), and a kDropped record is
/// learned too (PartitionProcessor inserts it while routing it as a
/// duplicate).
class ReplayRule {
 public:
  enum class Action : std::uint8_t { kProcess, kDecide, kLearn, kSkip, kDropped };
  /// Where the filter's state below C comes from.
  enum class Below : std::uint8_t { kSnapshot, kDelivered };

  ReplayRule() = default;  ///< processes everything
  /// `emitted` need not be sorted; offsets at or after rebuild_until are
  /// ignored, and so are those below `committed` with kSnapshot.
  /// `ordered_output`: the outputs of this partition are in one output
  /// partition, in input order (partitioning: input).
  ReplayRule(Below below, std::int64_t committed, std::int64_t rebuild_until,
             std::vector<std::int64_t> emitted, bool ordered_output = false, bool refresh = false);

  [[nodiscard]] Action action(std::int64_t offset) const noexcept;
  /// First offset from which every record is processed normally.
  [[nodiscard]] std::int64_t end() const noexcept { return rebuild_until_; }
  /// How many offsets of E the rule holds (for logs).
  [[nodiscard]] std::size_t delivered() const noexcept { return emitted_.size(); }

 private:
  Below below_ = Below::kSnapshot;
  bool ordered_output_ = false;
  bool refresh_ = false;
  std::int64_t committed_ = 0;
  std::int64_t rebuild_until_ = 0;
  std::vector<std::int64_t> emitted_;  // sorted, unique, below rebuild_until_
};

/// When the owning worker last captured a snapshot of the Slice.
struct CaptureSchedule {
  std::int64_t last_offset = -1;  ///< next offset of the last capture (or of the start)
  std::uint64_t records_since = 0;
  std::chrono::steady_clock::time_point last_time = std::chrono::steady_clock::now();
  /// When the filter's statistics were last copied into the counters.
  std::chrono::steady_clock::time_point last_stats{};
};

class Slice {
 public:
  /// A new slice from `start` (default: empty filter, clock at 0). A
  /// restored filter is used as is (callers wrap it first if they want).
  [[nodiscard]] static Result<std::unique_ptr<Slice>> create(PartitionId id,
                                                             const SliceOptions& options,
                                                             SliceStart start = {});

  /// A slice continuing from saved state (a snapshot): `filter` may be null
  /// only when the filter is disabled. The filter is attached to
  /// options.memory here, and to options.confirm (restored from the snapshot
  /// at `next_offset` when it is >= 0, else starting the partition empty);
  /// a failed attach is failure().
  Slice(PartitionId id, const SliceOptions& options, std::unique_ptr<filter::SlidingFilter> filter,
        std::int64_t clock_ms, std::int64_t next_offset);
  ~Slice();

  Slice(const Slice&) = delete;
  Slice& operator=(const Slice&) = delete;

  [[nodiscard]] const PartitionId& id() const noexcept { return id_; }

  /// Reads one record's timestamp into the clock (counting capped and missing
  /// timestamps) and returns the tick it is judged at: scale().tick(clock).
  filter::Tick observe(std::int64_t timestamp_ms, std::int64_t wall_ms) noexcept;

  /// First-test-then-set decisions for a batch (seed 000 §4); with
  /// SliceOptions::refresh a duplicate also renews its identity. With the
  /// filter disabled every record is distinct. Where `learn[i]` is set
  /// (recovery: a record a previous owner delivered, ReplayRule::kLearn) the
  /// fingerprint is inserted without a test and out[i] is kDistinct; `learn`
  /// empty = none. The filter sees every element in order either way.
  /// Confirmed mode: the duplicates are confirmed in the store and every
  /// delivery (learned ones too) recorded there, under the records' input
  /// `offsets` (empty: -1, deliveries learned from the output); a store
  /// error sets failure() and the batch must not go out.
  void decide(std::span<const filter::Fingerprint> fps, std::span<const filter::Tick> ticks,
              std::span<filter::Decision> out, std::span<const std::uint8_t> learn = {},
              std::span<const std::int64_t> offsets = {});

  /// Why this Slice cannot go on (confirmed mode: the store could not be
  /// attached, read or written), or none.
  [[nodiscard]] const std::optional<std::string>& failure() const noexcept { return failure_; }
  /// Confirmed mode's part of the Slice; null without a confirm store.
  [[nodiscard]] const Confirmer* confirmer() const noexcept { return confirmer_.get(); }

  /// The input offset after the last processed record; -1 before the first.
  [[nodiscard]] std::int64_t next_offset() const noexcept { return next_offset_; }
  void set_processed(std::int64_t offset) noexcept;

  [[nodiscard]] const PartitionClock& clock() const noexcept { return clock_; }
  /// The time -> tick mapping (window, ticks_per_window of the filter).
  [[nodiscard]] const filter::TickScale& scale() const noexcept { return scale_; }
  /// Null in passthrough mode and while parked.
  [[nodiscard]] const filter::SlidingFilter* filter() const noexcept {
    return parked_ ? nullptr : filter_.get();
  }

  /// Parking (`state.park_after`, DESIGN.md "Memory follows load"): the
  /// owning worker parks a quiet partition once the snapshot store holds
  /// its filter exactly as it stands (captured at next_offset(), written),
  /// or, pristine(), with no snapshot at all. park() frees the filter (its
  /// memory budget demand leaves with it); before the next record is
  /// decided, unpark() takes the filter restored from that snapshot, or
  /// unpark_new() makes a pristine one anew. Until then decide() refuses
  /// (failure()). In confirmed mode the Confirmer stays attached: the
  /// confirm store is bound to that snapshot (or to the partition's empty
  /// start) and stages nothing while no record comes. A Slice without a
  /// filter does not park (returns false).
  bool park();
  void unpark(std::unique_ptr<filter::SlidingFilter> restored);
  [[nodiscard]] Status unpark_new();
  [[nodiscard]] bool parked() const noexcept { return parked_; }
  /// The filter is the empty one made for a new Slice (not restored), and
  /// no record was decided or learned since: a filter made anew from the
  /// same config is the same filter, so parking it needs no snapshot.
  [[nodiscard]] bool pristine() const noexcept { return pristine_; }

  /// The replay rule of a recovering partition (set before the Slice is
  /// handed to its worker).
  void set_replay(ReplayRule rule) { replay_ = std::move(rule); }
  [[nodiscard]] const ReplayRule& replay() const noexcept { return replay_; }

  /// Quiet spells, judged by the wall clock (the partition clock is event
  /// time and stands still without records): the owning worker calls
  /// active() with the wall clock of every batch and check_quiet() now and
  /// then. Once no batch came for quiet_after_ms() of wall time, the filter
  /// is told once (SlidingFilter::quiet(): it lowers its memory demand to
  /// what it holds); a batch ends the spell. Each check_quiet() also calls
  /// the filter's flush() (its statistics after the last batch).
  void active(std::int64_t wall_ms) noexcept {
    last_active_ms_ = wall_ms;
    quiet_ = false;
  }
  void check_quiet(std::int64_t wall_ms);
  /// Wall-clock milliseconds since the last batch (since the first
  /// check_quiet() when none came yet).
  [[nodiscard]] std::int64_t quiet_for(std::int64_t wall_ms) const noexcept {
    return last_active_ms_ < 0 ? 0 : wall_ms - last_active_ms_;
  }
  /// A window, at most kQuietAfterMs.
  [[nodiscard]] std::int64_t quiet_after_ms() const noexcept {
    return std::min(scale_.window_ms(), kQuietAfterMs);
  }
  static constexpr std::int64_t kQuietAfterMs = 60'000;

  /// Snapshot bookkeeping; only the owning worker touches it.
  [[nodiscard]] CaptureSchedule& captures() noexcept { return captures_; }
  [[nodiscard]] const CaptureSchedule& captures() const noexcept { return captures_; }

  [[nodiscard]] const std::shared_ptr<OffsetTracker>& tracker() const noexcept { return tracker_; }
  [[nodiscard]] const std::shared_ptr<PartitionCounters>& counters() const noexcept {
    return counters_;
  }

 private:
  /// decide() without confirmation: the filter alone.
  void decide_with_filter(std::span<const filter::Fingerprint> fps,
                          std::span<const filter::Tick> ticks, std::span<filter::Decision> out,
                          std::span<const std::uint8_t> learn);

  PartitionId id_;
  std::unique_ptr<filter::SlidingFilter> filter_;
  std::shared_ptr<filter::MemoryBudget> memory_;  // SliceOptions::memory, for unpark()
  filter::FilterConfig filter_config_;            // SliceOptions::filter, for unpark_new()
  bool parked_ = false;
  bool pristine_;
  PartitionClock clock_;
  filter::TickScale scale_;
  bool refresh_ = false;
  std::int64_t next_offset_;
  ReplayRule replay_;
  CaptureSchedule captures_;
  std::shared_ptr<OffsetTracker> tracker_ = std::make_shared<OffsetTracker>();
  std::shared_ptr<PartitionCounters> counters_ = std::make_shared<PartitionCounters>();
  std::unique_ptr<Confirmer> confirmer_;
  std::optional<std::string> failure_;
  std::int64_t last_active_ms_ = -1;  // wall clock of the last batch; -1: none yet
  bool quiet_ = false;                // the filter was told, no batch since
};

/// Picks the worker for a newly assigned partition: the one owning the
/// fewest slices (ties go to the lowest index), so partitions spread evenly
/// over the threads as they come and go. `slices_per_worker` must not be
/// empty.
[[nodiscard]] std::uint32_t choose_worker(std::span<const std::uint32_t> slices_per_worker);

}  // namespace kdedup::pipeline
