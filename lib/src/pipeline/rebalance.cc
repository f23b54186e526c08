// The rebalance callback: assign, revoke, lost (rebalance.h).

#include "rebalance.h"

#include <spdlog/spdlog.h>

#include <map>
#include <memory>

#include "assigned_partitions.h"
#include "commit_protocol.h"
#include "fatal_error.h"
#include "kafka_errors.h"
#include "memory_floors.h"
#include "partition_log.h"
#include "partition_recovery.h"
#include "worker.h"

namespace kdedup::pipeline {

void forward_partition(RdKafka::KafkaConsumer& consumer, const PartitionId& id,
                       rd_kafka_queue_t* to) {
  rd_kafka_queue_t* q =
      rd_kafka_queue_get_partition(consumer.c_ptr(), id.topic.c_str(), id.partition);
  if (q == nullptr) return;
  rd_kafka_queue_forward(q, to);
  rd_kafka_queue_destroy(q);
}

void stop_forwarding(RdKafka::KafkaConsumer& consumer, const WorkerPool& workers,
                     const std::vector<PartitionId>& ids) {
  if (!workers.has_inboxes()) return;
  for (const auto& id : ids) forward_partition(consumer, id, nullptr);
}

void Rebalance::rebalance_cb(RdKafka::KafkaConsumer* consumer, RdKafka::ErrorCode err,
                             std::vector<RdKafka::TopicPartition*>& partitions) {
  count_.fetch_add(1, std::memory_order_relaxed);
  if (err == RdKafka::ERR__ASSIGN_PARTITIONS) {
    joined_once_ = true;  // a SyncGroup succeeded (even with 0 partitions)
    assign(*consumer, partitions);
    return;
  }
  if (err == RdKafka::ERR__REVOKE_PARTITIONS) {
    revoke(*consumer, partitions);
    return;
  }
  fatal_.set("consumer group rebalance failed: " + describe_kafka_error(err));
  if (consumer->rebalance_protocol() == "COOPERATIVE") {
    std::unique_ptr<RdKafka::Error> e(consumer->incremental_unassign(partitions));
  } else {
    consumer->unassign();
  }
}

void Rebalance::assign(RdKafka::KafkaConsumer& consumer,
                       std::vector<RdKafka::TopicPartition*>& partitions) {
  std::vector<PartitionId> ids;
  std::vector<RdKafka::TopicPartition*> added;  // cooperative: only what is new to us
  for (auto* tp : partitions) {
    PartitionId id{tp->topic(), tp->partition()};
    if (partitions_.contains(id)) continue;  // already ours (eager protocol re-assign)
    added.push_back(tp);
    ids.push_back(id);
  }
  // Recovery decides where each new partition starts. On failure the
  // partitions are still taken (librdkafka's assignment must match the
  // group's) but get no Slice: their records are skipped, never committed,
  // and the fatal error stops the service.
  if (!ids.empty() && !fatal_.raised()) {
    auto fetch = Recovery(recovery_, ids).run();
    if (!fetch) {
      fatal_.set("recovery of the assigned partitions failed: " + fetch.error().message);
    } else {
      for (auto* tp : added) {
        auto it = fetch->find(PartitionId{tp->topic(), tp->partition()});
        if (it != fetch->end()) tp->set_offset(it->second);
      }
    }
  }
  if (!ids.empty() && workers_.has_inboxes()) {
    // Each worker reads its partitions' records from its inbox: the slices
    // are adopted first, then the partitions' queues forward there.
    workers_.flush();
    workers_.barrier_all();
    for (const auto& id : ids) {
      if (const Assigned* a = partitions_.find(id); a != nullptr) {
        forward_partition(consumer, id, workers_.inbox(a->worker));
      }
    }
  }
  if (consumer.rebalance_protocol() == "COOPERATIVE") {
    // Handing librdkafka a partition it already has would be an error
    // (_CONFLICT); the eager assign() below replaces the whole set instead.
    std::unique_ptr<RdKafka::Error> e(consumer.incremental_assign(added));
    if (e) fatal_.set("cannot take the assigned partitions: " + e->str());
  } else {
    consumer.assign(partitions);
  }
  spdlog::info("assigned {} partition(s): {} (now {} in total)", ids.size(), join_partitions(ids),
               partitions_.size());
  if (!ids.empty()) warn_if_floors_exceed_budget(recovery_.config, partitions_.size());
  ready_.store(true, std::memory_order_relaxed);
}

void Rebalance::revoke(RdKafka::KafkaConsumer& consumer,
                       std::vector<RdKafka::TopicPartition*>& partitions) {
  const bool lost = consumer.assignment_lost();
  workers_.flush();
  std::vector<PartitionId> ids;
  for (auto* tp : partitions) {
    PartitionId id{tp->topic(), tp->partition()};
    if (partitions_.contains(id)) ids.push_back(std::move(id));
  }
  // No more records of these partitions reach the workers' inboxes; those
  // already there are not processed (kClose below): not committed, the
  // next owner reads them.
  stop_forwarding(consumer, workers_, ids);
  const auto by_worker = partitions_.by_worker(ids);
  // 1. The workers finish the records they were handed and take no more
  //    of these partitions.
  workers_.close(by_worker);
  // 2. The protocol commits what they delivered (not when lost: another
  //    member owns them and a commit would be refused).
  const Handover handover = protocol_.hand_over(ids, lost);
  // 3. Release the slices (final captures first), then hand the partitions
  //    back; the commit result releases the captures to the store.
  workers_.release(by_worker, handover.keep_state ? Work::Kind::kRelease : Work::Kind::kDrop,
                   handover.capture);
  partitions_.erase(ids);
  if (consumer.rebalance_protocol() == "COOPERATIVE") {
    std::unique_ptr<RdKafka::Error> e(consumer.incremental_unassign(partitions));
    if (e) spdlog::warn("releasing partitions failed: {}", e->str());
  } else {
    consumer.unassign();
  }
  spdlog::info("{} {} partition(s): {} (now {} in total){}", lost ? "lost" : "revoked", ids.size(),
               join_partitions(ids), partitions_.size(),
               handover.final_positions.empty()
                   ? ""
                   : "; committing " + describe_positions(handover.final_positions));
}

}  // namespace kdedup::pipeline
