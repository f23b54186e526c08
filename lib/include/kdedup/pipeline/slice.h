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

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kdedup/common/result.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/pipeline/offset_tracker.h"
#include "kdedup/pipeline/stats.h"

namespace kdedup::pipeline {

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
  filter::FilterConfig filter;
};

class Slice {
 public:
  /// A fresh slice: empty filter, clock at 0.
  [[nodiscard]] static Result<std::unique_ptr<Slice>> create(PartitionId id,
                                                             const SliceOptions& options);

  /// A slice continuing from saved state (a snapshot): `filter` may be null
  /// only when the filter is disabled.
  Slice(PartitionId id, const SliceOptions& options, std::unique_ptr<filter::SlidingFilter> filter,
        std::int64_t clock_ms, std::int64_t next_offset);

  Slice(const Slice&) = delete;
  Slice& operator=(const Slice&) = delete;

  [[nodiscard]] const PartitionId& id() const noexcept { return id_; }

  /// Reads one record's timestamp into the clock (counting capped and missing
  /// timestamps) and returns the tick it is judged at:
  /// floor(clock_ms / tick_ms), tick_ms = window / ticks_per_window.
  filter::Tick observe(std::int64_t timestamp_ms, std::int64_t wall_ms) noexcept;

  /// First-test-then-set decisions for a batch (seed 000 §4). With the
  /// filter disabled every record is distinct.
  void decide(std::span<const filter::Fingerprint> fps, std::span<const filter::Tick> ticks,
              std::span<filter::Decision> out);

  /// The input offset after the last processed record; -1 before the first.
  [[nodiscard]] std::int64_t next_offset() const noexcept { return next_offset_; }
  void set_processed(std::int64_t offset) noexcept;

  [[nodiscard]] const PartitionClock& clock() const noexcept { return clock_; }
  [[nodiscard]] std::int64_t tick_ms() const noexcept { return tick_ms_; }
  /// Null in passthrough mode.
  [[nodiscard]] const filter::SlidingFilter* filter() const noexcept { return filter_.get(); }

  [[nodiscard]] const std::shared_ptr<OffsetTracker>& tracker() const noexcept { return tracker_; }
  [[nodiscard]] const std::shared_ptr<PartitionCounters>& counters() const noexcept {
    return counters_;
  }

 private:
  PartitionId id_;
  std::unique_ptr<filter::SlidingFilter> filter_;
  PartitionClock clock_;
  std::int64_t tick_ms_;
  std::int64_t next_offset_;
  std::shared_ptr<OffsetTracker> tracker_ = std::make_shared<OffsetTracker>();
  std::shared_ptr<PartitionCounters> counters_ = std::make_shared<PartitionCounters>();
};

/// Picks the worker for a newly assigned partition: the one owning the
/// fewest slices (ties go to the lowest index), so partitions spread evenly
/// over the threads as they come and go. `slices_per_worker` must not be
/// empty.
[[nodiscard]] std::uint32_t choose_worker(std::span<const std::uint32_t> slices_per_worker);

}  // namespace kdedup::pipeline
