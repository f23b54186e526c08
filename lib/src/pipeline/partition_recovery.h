#pragma once
// The recovery of newly assigned partitions (DESIGN.md "Recovery protocol",
// recovery.h): everything is read for all of them together (one committed
// offsets request, the snapshots, one window-start search, one read of the
// output), then each partition is planned (plan_recovery), gets its Slice
// (restored or empty, with its ReplayRule) on the least loaded worker and a
// fetch position. The partition stays "restoring" (not ready) until its
// replay reached the plan's end (check_restored).
//
// Consumer thread only: the rebalance callback runs it on assignment, and
// delivery: transactional on rollback. It blocks that callback while it
// reads (bounded by the readers' timeouts), which librdkafka tolerates up
// to max.poll.interval.ms.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include <librdkafka/rdkafkacpp.h>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/identity/extractor.h"
#include "kdedup/pipeline/reconcile.h"
#include "kdedup/pipeline/recovery.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/pipeline/slice_hooks.h"

namespace kdedup::state {
class SnapshotStore;
}

namespace kdedup::pipeline {

class AssignedPartitions;
class Snapshotter;
class WorkerPool;
struct Assigned;

/// What every recovery uses: set up with the Pipeline, outlives it all.
struct RecoverySetup {
  const config::Config& config;
  const SliceOptions& options;
  const SliceHooks& hooks;
  AssignedPartitions& partitions;
  WorkerPool& workers;
  state::SnapshotStore* store = nullptr;  ///< null: no snapshots
  Snapshotter* snapshotter = nullptr;     ///< set when `store` is
  RdKafka::KafkaConsumer* consumer = nullptr;
  const filter::Fingerprinter* fingerprinter = nullptr;
  std::uint64_t salt_check = 0;  ///< filter::salt_check(), with snapshots
  /// Learns identities from output records whose input was deleted by
  /// retention (none: the extractor could not be built; reported elsewhere).
  std::optional<identity::IdentityExtractor> extractor;
  std::int32_t output_partitions = -1;  ///< from check_topics(); -1 = ask on first use
  /// CommitProtocol::output_ahead_of_commits(): reconcile with the output.
  bool reconcile = true;

  /// Options of the short-lived readers of the output and the input.
  [[nodiscard]] ReconcileOptions reader_options() const;
};

/// Fetch position per partition (RdKafka::Topic::OFFSET_INVALID = the
/// consumer's reset policy).
using FetchPositions = std::map<PartitionId, std::int64_t>;

/// A partition's recovery plan as its log line says it, and the line's
/// level (a warning when a snapshot was refused).
struct PlanLine {
  std::string text;
  bool warn = false;
};

/// One recovery of a set of partitions; run() once.
class Recovery {
 public:
  /// `known_committed`: offsets this member committed itself (delivery:
  /// transactional rollback; a broker that does not store transactional
  /// offsets, like the test broker, would not return them).
  Recovery(RecoverySetup& setup, std::vector<PartitionId> ids,
           std::map<PartitionId, std::int64_t> known_committed = {});

  /// Reads, plans and starts every partition; returns where each fetches.
  [[nodiscard]] Result<FetchPositions> run();

 private:
  using Clock = std::chrono::steady_clock;
  struct Loaded {
    SnapshotOffer offer;
    std::unique_ptr<filter::SlidingFilter> filter;
    std::uint64_t bytes = 0;
  };
  using Learned = std::vector<std::pair<filter::Tick, filter::Fingerprint>>;

  // The steps, in order.
  [[nodiscard]] Status read_committed_offsets();
  [[nodiscard]] Status read_watermarks();
  void load_snapshots();
  [[nodiscard]] Status find_window_starts();
  [[nodiscard]] Status read_delivered();
  [[nodiscard]] Result<std::int64_t> start_partition(const PartitionId& id);
  void log_summary() const;

  // Parts of the steps.
  struct OutputReads;
  [[nodiscard]] OutputReads output_reads() const;
  [[nodiscard]] RecoveryInputs inputs_for(const PartitionId& id);
  [[nodiscard]] Result<std::unique_ptr<Slice>> build_slice(const PartitionId& id,
                                                           const RecoveryPlan& plan,
                                                           PlanLine& line);
  [[nodiscard]] std::size_t learn_from_output(const PartitionId& id, Slice& slice);
  [[nodiscard]] Assigned make_assigned(const PartitionId& id, Slice& slice,
                                       const RecoveryPlan& plan);

  RecoverySetup& setup_;
  const std::vector<PartitionId> ids_;
  const std::map<PartitionId, std::int64_t> known_committed_;

  // What the steps found.
  std::map<PartitionId, std::optional<std::int64_t>> committed_;
  std::map<PartitionId, std::pair<std::int64_t, std::int64_t>> marks_;  // low, high
  std::map<PartitionId, Loaded> loaded_;
  std::set<PartitionId> rebuild_;  // no usable snapshot: rebuilt from the window before C
  std::map<PartitionId, CommitPoint> points_;
  ReconcileReport tail_;
  std::map<PartitionId, Learned> learned_;
  FetchPositions fetch_;

  // When each step ended, for the summary.
  Clock::time_point t0_, t_offsets_, t_snapshots_, t_windows_, t_tail_;
};

/// A restoring partition's replay reached its end: it is ready. Logs the
/// outcome and calls SliceHooks::on_recovered. `plan`: a partition with
/// nothing to replay is ready at once, and its plan and outcome share one
/// line (one line per partition, not two, at a thousand partitions).
void finish_recovery(const PartitionId& id, Assigned& a, const SliceHooks& hooks,
                     const PlanLine* plan = nullptr);

/// Finishes the recovery of every restoring partition whose worker
/// processed up to the end of its replay, or whose consumer position
/// passed it with nothing queued (the last offsets before the end can be
/// gaps: compaction, transaction markers). Consumer thread, every ~50 ms.
void check_restored(AssignedPartitions& partitions, RdKafka::KafkaConsumer& consumer,
                    const SliceHooks& hooks);

}  // namespace kdedup::pipeline
