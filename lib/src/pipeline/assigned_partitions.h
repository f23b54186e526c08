#pragma once
// AssignedPartitions: the consumer thread's view of the partitions this
// member owns (worker, OffsetTracker, counters, commit and recovery state)
// and of every position the group coordinator confirmed. The consumer
// thread reads and writes it; stats() reads entries under lock(), so the
// consumer thread changes the map and `committed` only under that lock.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kdedup/pipeline/offset_tracker.h"
#include "kdedup/pipeline/recovery.h"
#include "kdedup/pipeline/slice.h"

namespace kdedup::pipeline {

/// One assigned partition.
struct Assigned {
  std::uint32_t worker = 0;
  std::shared_ptr<OffsetTracker> tracker;
  std::shared_ptr<PartitionCounters> counters;
  std::int64_t committed = -1;  // last offset the group coordinator confirmed
  // Last position handed to the client's committer; starts at the committed
  // offset, so replayed records (below it) are never stored again.
  std::int64_t stored = -1;
  // Recovery: restoring until the partition's position reaches restore_end
  // (the plan's rebuild_until, capped at the high watermark seen then).
  bool restoring = false;
  std::int64_t restore_end = 0;
  std::chrono::steady_clock::time_point assigned_at{};
  RecoveryOutcome outcome;
  // delivery: transactional: first offset handed to the worker since the
  // partition was assigned or rolled back (-1 = none yet): where a rollback
  // returns to when the partition has no committed offset at all.
  std::int64_t start_offset = -1;
};

class AssignedPartitions {
 public:
  using Map = std::map<PartitionId, Assigned>;

  [[nodiscard]] Assigned* find(const PartitionId& id) {
    auto it = map_.find(id);
    return it == map_.end() ? nullptr : &it->second;
  }
  [[nodiscard]] Assigned& at(const PartitionId& id) { return map_.at(id); }
  [[nodiscard]] bool contains(const PartitionId& id) const { return map_.count(id) > 0; }
  [[nodiscard]] std::size_t size() const noexcept { return map_.size(); }
  [[nodiscard]] std::vector<PartitionId> ids() const;
  [[nodiscard]] Map& all() noexcept { return map_; }
  [[nodiscard]] const Map& all() const noexcept { return map_; }

  /// Adds (or replaces) a partition; returns its entry.
  Assigned& insert(const PartitionId& id, Assigned a);
  /// Forgets partitions (released or rolled back).
  void erase(const std::vector<PartitionId>& ids);
  /// `ids` grouped by the worker that owns them (the partitions not
  /// assigned are left out).
  [[nodiscard]] std::map<std::uint32_t, std::vector<PartitionId>> by_worker(
      const std::vector<PartitionId>& ids) const;

  /// The coordinator confirmed `offset` for `id` (a commit result or a
  /// committed offset read at assignment).
  void confirm(const PartitionId& id, std::int64_t offset);
  /// Whether every position handed to the committer was confirmed.
  [[nodiscard]] bool all_stored_confirmed() const;

  /// Outputs of `ids` not yet acknowledged.
  [[nodiscard]] std::uint64_t in_flight(const std::vector<PartitionId>& ids) const;
  /// Waits until every output of `ids` was acknowledged or `deadline`
  /// passed (warns then: those offsets stay uncommitted).
  void wait_delivered(const std::vector<PartitionId>& ids,
                      std::chrono::steady_clock::time_point deadline) const;

  /// For readers on other threads (stats()).
  [[nodiscard]] std::unique_lock<std::mutex> lock() const { return std::unique_lock(mu_); }

 private:
  mutable std::mutex mu_;
  Map map_;
  std::map<PartitionId, std::int64_t> confirmed_;  // every coordinator-confirmed commit
};

}  // namespace kdedup::pipeline
