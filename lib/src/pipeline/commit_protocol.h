#pragma once
// CommitProtocol: how `delivery:` commits input positions together with
// their outputs; the consumer loop, the rebalance handler, the workers and
// the delivery reports talk to it and never ask which mode runs. Two
// implementations (make_commit_protocol picks one from the config):
//
// - idempotent (idempotent_commits.cc, at-least-once + reconciliation): an
//   idempotent producer; the consumer thread stores the positions whose
//   outputs were all delivered and librdkafka's committer commits them. A
//   failed output stops the service (never skipped, never committed past).
// - transactional (transactional_commits.cc, exactly-once): a transactional
//   producer; every commit_interval a TxnLoop settles the workers and
//   commits outputs and positions in one transaction. A failed output dooms
//   the open transaction, which is aborted and its partitions rolled back.
//
// Both signal a commit through CommitContext::on_committed: the snapshots
// follow it, so none is ever ahead of the committed offset.
//
// Owned by the Pipeline. Threads: see the sections below.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <librdkafka/rdkafkacpp.h>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/pipeline/transaction.h"

namespace kdedup::pipeline {

class AssignedPartitions;
class FatalError;
class Snapshotter;
class WorkerPool;
struct RecoverySetup;

/// What a protocol uses of the rest of the pipeline. Every reference
/// outlives the protocol.
struct CommitContext {
  const config::Config& config;
  FatalError& fatal;
  AssignedPartitions& partitions;      ///< consumer thread only
  WorkerPool& workers;                 ///< consumer thread only
  RecoverySetup& recovery;             ///< rolls partitions back (transactional)
  Snapshotter* snapshotter = nullptr;  ///< null: no snapshots

  /// The one place that learns "offset X of partition P is committed": the
  /// committed and confirmed positions move, and the Snapshotter may write
  /// captures up to X. Consumer thread.
  void on_committed(const PartitionId& id, std::int64_t offset) const;
};

/// What becomes of partitions a rebalance takes away.
struct Handover {
  std::map<PartitionId, std::int64_t> final_positions;  ///< committed on unassign (logged)
  std::vector<PartitionId> capture;                     ///< final snapshot at the final position
  bool keep_state = true;  ///< false: dropped without release hook or capture
};

class CommitProtocol {
 public:
  virtual ~CommitProtocol() = default;

  // -- Setup, on the thread that creates the Pipeline, in this order.
  /// Builds the producer the workers produce with; its delivery reports and
  /// fatal events come back to this protocol.
  [[nodiscard]] virtual Status build_producer(
      const config::KafkaProperties& properties,
      const std::function<void(std::string_view)>& on_statistics) = 0;
  /// Adds what this mode needs to the consumer's properties; returns the
  /// consumer's commit callback (null: nothing is committed through it).
  [[nodiscard]] virtual RdKafka::OffsetCommitCb* configure_consumer(
      config::KafkaProperties& properties) = 0;
  /// The consumer exists (its group metadata travels with a transaction).
  virtual void attach(RdKafka::KafkaConsumer& consumer) = 0;
  [[nodiscard]] virtual RdKafka::Producer& producer() = 0;

  // -- Produce path: worker threads, the delivery thread, librdkafka's threads.
  /// Stamp of an output produced now (the open transaction; 0 = none).
  [[nodiscard]] virtual std::uint64_t epoch() const noexcept = 0;
  /// An output-topic record was handed to the producer.
  virtual void produced_output() noexcept = 0;
  /// A delivery error that is no failure in this mode (records purged by
  /// the protocol's own abort).
  [[nodiscard]] virtual bool expected(RdKafka::ErrorCode err) const noexcept = 0;
  /// An output stamped `epoch` was refused or not delivered, or the
  /// producer failed (`reason` says which). True when that stops the
  /// service: the worker processes nothing more.
  virtual bool output_failed(std::uint64_t epoch, std::string reason) = 0;

  // -- Consumer thread.
  /// Before the consumer subscribes (fences a previous incarnation).
  [[nodiscard]] virtual Status start() = 0;
  /// Each turn of the consumer loop: commits (or hands to the committer)
  /// what is due.
  virtual void on_loop_turn(std::chrono::steady_clock::time_point now) = 0;
  /// Whether the output can hold records past the committed offset that a
  /// recovering partition must not emit again (output reconciliation).
  [[nodiscard]] virtual bool output_ahead_of_commits() const noexcept = 0;
  /// Revocation (or `lost`): commits what the partitions delivered (or
  /// gives it up) before they go.
  [[nodiscard]] virtual Handover hand_over(const std::vector<PartitionId>& ids, bool lost) = 0;
  /// Graceful or fatal shutdown, after the workers finished: the final commit.
  virtual void finish() = 0;
  /// The mode's totals in the log, once at the end.
  virtual void log_totals() const = 0;

  // -- Any thread.
  [[nodiscard]] virtual TxnTotals totals() const = 0;
};

/// The protocol of `config.delivery`.
[[nodiscard]] std::unique_ptr<CommitProtocol> make_commit_protocol(const CommitContext& context);

/// The two implementations (commit_protocol.cc chooses).
[[nodiscard]] std::unique_ptr<CommitProtocol> make_idempotent_commits(const CommitContext& context);
[[nodiscard]] std::unique_ptr<CommitProtocol> make_transactional_commits(
    const CommitContext& context);

}  // namespace kdedup::pipeline
