#pragma once
// Pipeline: the `kdedup run` service. One consumer-group member that reads
// the input topics, deduplicates each assigned partition in its own Slice and
// produces distinct records (and duplicates / dead letters when configured)
// with an idempotent producer, committing an input offset only after every
// output for it and before it was delivered (at-least-once).
//
// Threads (DESIGN.md "Architecture"):
// - the consumer thread: the one that calls run(). It polls the consumer
//   (with `delivery: transactional` it hands every record to the workers in
//   batches; with `delivery: idempotent` each partition's queue forwards to
//   its worker's inbox once the worker holds its Slice), serves rebalance
//   callbacks (cooperative: close the partitions, store their final
//   positions, release; librdkafka commits them before it rejoins) and hands
//   committable positions to librdkafka's committer, which commits every
//   commit_interval while the group is stable;
// - `threads` worker threads, each the only owner of its partitions' Slices:
//   identity -> fingerprint -> filter decision -> produce; they also capture
//   snapshots of their slices (a copy of the filter state);
// - one delivery thread serving producer delivery reports into the
//   partitions' OffsetTrackers;
// - with a SnapshotStore, the store's writer thread writes the captures
//   once a commit covers them (Snapshotter).
//
// Recovery (DESIGN.md "Recovery protocol"): on assignment the consumer
// thread reads the committed offsets, the output tail (reconciliation), the
// snapshots and, for partitions without a usable one, the offset one window
// before the committed one; plans each partition (plan_recovery), builds its
// Slice (restored or empty) and starts fetching at the plan's position. The
// records before the plan's end are replayed (ReplayRule): the filter learns
// them, nothing is produced, and the partition is "restoring" (not ready)
// until the replay reached its end. Snapshots: every
// state.snapshot_interval / snapshot_records per partition, on revocation
// and on graceful shutdown, never ahead of the committed offset.
//
// Lifecycle: create() builds the clients (no network yet); check_topics()
// verifies topics and partition counts against the config; run() joins the
// group and processes until `stop` becomes true (graceful: finish in-flight,
// flush, commit, leave) or a fatal error happens (returned, with only
// delivered records committed). A Pipeline runs once.

#include <atomic>
#include <cstdint>
#include <memory>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/pipeline/slice_hooks.h"
#include "kdedup/pipeline/stats.h"

namespace kdedup::state {
class SnapshotStore;
}

namespace kdedup::pipeline {

class Pipeline {
 public:
  /// Builds consumer and producer from `config` (librdkafka properties are
  /// checked here: an unknown or invalid property is an error naming it).
  /// `store` (may be null: no snapshots, every assignment rebuilds from
  /// Kafka) must outlive the Pipeline; the Pipeline loads and writes the
  /// snapshots of its partitions there and drains it before run() returns.
  [[nodiscard]] static Result<std::unique_ptr<Pipeline>> create(
      const config::Config& config, SliceHooks hooks = {}, state::SnapshotStore* store = nullptr);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// Fetches metadata and checks that every input topic, the output topic and
  /// the DLQ / duplicates topics exist, and that with `output.partitioning:
  /// input` the output topic has at least as many partitions as each input
  /// topic. Errors name the topic and say what to change.
  [[nodiscard]] Status check_topics();

  /// Runs the service until `stop` is true (then shuts down gracefully and
  /// returns success) or a fatal error (returned). Call once, from the thread
  /// that owns the Pipeline. A graceful stop waits, within shutdown_timeout,
  /// until every final position was committed (a rebalance in progress is
  /// waited out, not committed into) and, if the member never completed a
  /// group join, for that first join (librdkafka 2.0.2 aborts otherwise).
  [[nodiscard]] Status run(const std::atomic<bool>& stop);

  /// A copy of the counters; any thread, any time.
  [[nodiscard]] PipelineStats stats() const;

  struct Impl;

 private:
  explicit Pipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Turns a config into the options every Slice is built with (one memory
/// budget for all of them: make_memory_budget()).
[[nodiscard]] SliceOptions slice_options(const config::Config& config);

/// The memory budget of one process (config.memory.max_bytes, 0 = count
/// only), which logs each change of its pressure level: a warning when the
/// effective fpp is raised, info when it falls back.
[[nodiscard]] std::shared_ptr<filter::MemoryBudget> make_memory_budget(
    const config::Config& config);

}  // namespace kdedup::pipeline
