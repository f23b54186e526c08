#pragma once
// Rebalance: the consumer group's rebalance callback (cooperative-sticky).
//   Assign: recover the partitions that are new to this member (Recovery)
//     and take them at their plans' fetch positions.
//   Revoke: the workers finish the partitions' queued records, the
//     CommitProtocol commits what they delivered (hand_over), the slices
//     are released (final captures first) and the partitions handed back;
//     librdkafka commits the stored positions before it rejoins, so the
//     next owner starts exactly where this one stopped.
//   Lost (session timed out, fenced): the same without committing; another
//     member already owns them and reads the uncommitted records again.
//
// Owned by the Pipeline; librdkafka calls it on the consumer thread, from
// inside consume() and close(). count() and ready() may be read from any
// thread.

#include <atomic>
#include <cstdint>
#include <vector>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafkacpp.h>

#include "kdedup/pipeline/slice.h"

namespace kdedup::pipeline {

class AssignedPartitions;
class CommitProtocol;
class FatalError;
class WorkerPool;
struct RecoverySetup;

/// Forwards partition `id`'s librdkafka queue to `to` (null: stops
/// forwarding; its records stay in the partition's queue).
void forward_partition(RdKafka::KafkaConsumer& consumer, const PartitionId& id,
                       rd_kafka_queue_t* to);

/// Stops forwarding each of `ids` to its worker's inbox when the workers
/// read their partitions' queues directly (WorkerPool::has_inboxes()): from
/// then on no more of their records reach a worker.
void stop_forwarding(RdKafka::KafkaConsumer& consumer, const WorkerPool& workers,
                     const std::vector<PartitionId>& ids);

class Rebalance final : public RdKafka::RebalanceCb {
 public:
  Rebalance(RecoverySetup& recovery, CommitProtocol& protocol, FatalError& fatal,
            AssignedPartitions& partitions, WorkerPool& workers)
      : recovery_(recovery),
        protocol_(protocol),
        fatal_(fatal),
        partitions_(partitions),
        workers_(workers) {}

  void rebalance_cb(RdKafka::KafkaConsumer* consumer, RdKafka::ErrorCode err,
                    std::vector<RdKafka::TopicPartition*>& partitions) override;

  /// Rebalance callbacks served so far.
  [[nodiscard]] std::uint64_t count() const noexcept {
    return count_.load(std::memory_order_relaxed);
  }
  /// An assignment was taken once (the member can process).
  [[nodiscard]] bool ready() const noexcept { return ready_.load(std::memory_order_relaxed); }
  /// A SyncGroup succeeded once (even with 0 partitions). Consumer thread.
  [[nodiscard]] bool joined_once() const noexcept { return joined_once_; }

 private:
  void assign(RdKafka::KafkaConsumer& consumer, std::vector<RdKafka::TopicPartition*>& partitions);
  void revoke(RdKafka::KafkaConsumer& consumer, std::vector<RdKafka::TopicPartition*>& partitions);

  RecoverySetup& recovery_;
  CommitProtocol& protocol_;
  FatalError& fatal_;
  AssignedPartitions& partitions_;
  WorkerPool& workers_;
  std::atomic<std::uint64_t> count_{0};
  std::atomic<bool> ready_{false};
  bool joined_once_ = false;
};

}  // namespace kdedup::pipeline
