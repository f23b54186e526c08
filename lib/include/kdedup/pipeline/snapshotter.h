#pragma once
// Snapshotter: holds the snapshot captures of `kdedup run` until a commit
// covers them, then hands them to the SnapshotStore's writer thread
// (DESIGN.md "Recovery protocol": a snapshot is never ahead of the committed
// offset; state/snapshot_store.h rules 3 and 4).
//
//   worker:         capture (a copy of the state at next offset N) -> offer()
//   commit result:  committed(partition, C)  (the one "offset C is committed"
//                   signal: the commit callback in idempotent mode, the
//                   transaction commit in transactional mode)
//   -> once C >= N and no write of that partition is in flight: submit()
//   store thread:   write done -> written callback (metrics, fatal on error)
//
// At most one capture per partition waits (a newer one replaces it: it
// covers more) and at most one per partition is being written, so a slow
// disk never queues more than two copies of a partition's state.
//
// Thread-safe: workers (busy, offer), the consumer thread (committed,
// reset, drop, wait_idle) and the store's writer thread (its callback) share
// one short lock; the submit function is never called under it.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "kdedup/common/result.h"
#include "kdedup/pipeline/recovery.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/state/snapshot.h"

namespace kdedup::pipeline {

class Snapshotter {
 public:
  using Done = std::function<void(Result<state::WriteReport>)>;
  /// Queues a capture for writing; `done` runs once it was written or failed
  /// (SnapshotStore::submit). May call `done` before returning.
  using Submit = std::function<void(state::SnapshotCapture, Done)>;
  /// Told about every finished write, on the thread that ran `done`.
  using Written = std::function<void(const PartitionId&, const Result<state::WriteReport>&)>;

  Snapshotter(Submit submit, Written written);
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;

  /// A capture of `partition` waits or is being written: a worker skips
  /// taking a new one (its copy would only wait too).
  [[nodiscard]] bool busy(const PartitionId& partition) const;

  /// Keeps `capture` (replacing an older waiting one of its partition) and
  /// submits it as soon as a commit of an offset >= capture.next_offset is
  /// known and the partition has no write in flight.
  void offer(state::SnapshotCapture capture);

  /// A commit of `offset` for `partition` succeeded.
  void committed(const PartitionId& partition, std::int64_t offset);

  /// A partition was (re)assigned with committed offset `committed` (none =
  /// never committed): forgets what was known of it (an older waiting
  /// capture is dropped; the committed position is the group's).
  void reset(const PartitionId& partition, std::optional<std::int64_t> committed);

  /// Drops a waiting capture (its partition was lost or its final commit
  /// failed): it must never be written.
  void drop(const PartitionId& partition);

  /// Waits until no write is in flight (or the timeout); true if idle.
  /// Captures still waiting for a commit stay unwritten.
  [[nodiscard]] bool wait_idle(std::chrono::milliseconds timeout);

  struct Counts {
    std::uint64_t submitted = 0;
    std::uint64_t written = 0;
    std::uint64_t failed = 0;
    std::uint64_t replaced = 0;  ///< waiting captures superseded by a newer one
    std::uint64_t dropped = 0;
    std::uint64_t waiting = 0;  ///< captures waiting for a commit now
  };
  [[nodiscard]] Counts counts() const;

 private:
  /// Moves the waiting capture of `partition` out for submission if it may
  /// go now (requires mu_).
  std::optional<state::SnapshotCapture> take_ready(const PartitionId& partition);
  void submit(state::SnapshotCapture capture);
  void finished(const PartitionId& partition, const Result<state::WriteReport>& result);

  Submit submit_;
  Written written_;
  SnapshotGate gate_;
  mutable std::mutex mu_;
  std::condition_variable idle_;
  std::map<PartitionId, state::SnapshotCapture> waiting_;
  std::set<PartitionId> in_flight_;
  Counts counts_;
};

}  // namespace kdedup::pipeline
