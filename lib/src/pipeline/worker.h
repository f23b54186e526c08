#pragma once
// The worker threads of `kdedup run`. A Worker owns the Slices of its
// partitions exclusively (no locks on the hot path) and processes its work
// queue strictly in order: batches of records (identity -> fingerprint ->
// filter -> produce, through the PartitionProcessor), slices adopted on
// assignment, closed and released on revocation, barriers, snapshot
// captures. Between two work items it takes what its inbox holds: the
// librdkafka queue its partitions' queues forward to (`delivery:
// idempotent`), read directly, without a hand-over through the consumer
// thread. The WorkerPool is the consumer thread's side: it batches the
// records it fetched itself per worker and pushes the work.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <librdkafka/rdkafkacpp.h>

#include "kdedup/config/config.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/filter/memory_budget.h"
#include "kdedup/identity/extractor.h"
#include "kdedup/metrics/metrics.h"
#include "kdedup/pipeline/partition_processor.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/pipeline/slice_hooks.h"
#include "kdedup/state/snapshot.h"
#include "message_view.h"
#include "output_producer.h"

namespace kdedup::state {
class SnapshotStore;
}

namespace kdedup::pipeline {

class CommitProtocol;
class FatalError;
class Snapshotter;

/// A unit of work for a worker, processed strictly in queue order.
struct Work {
  // kDrop: like kRelease but without on_release or capture: the slice holds
  // state that was never committed (delivery: transactional rollback).
  // kClose: the partitions' records are not processed from then on (their
  // slices wait for kRelease / kDrop).
  enum class Kind : std::uint8_t {
    kRecords,
    kAdopt,
    kBarrier,
    kClose,
    kRelease,
    kDrop,
    kCapture,
    kStop
  };
  Kind kind = Kind::kRecords;
  std::vector<MessagePtr> records;
  // kRecords: taken from the worker's inbox, not counted in the partitions'
  // queue depth.
  bool from_inbox = false;
  std::unique_ptr<Slice> slice;              // kAdopt
  std::vector<PartitionId> partitions;       // kClose, kRelease, kDrop
  std::vector<PartitionId> capture;          // kRelease: snapshot these first
  std::shared_ptr<std::promise<void>> done;  // kBarrier, kClose, kRelease, kDrop, kCapture
};

/// What the workers share: read-only after the Pipeline was created, or
/// thread-safe.
struct WorkerContext {
  const config::Config& config;
  RdKafka::Producer& producer;
  CommitProtocol& protocol;
  FatalError& fatal;
  filter::Fingerprinter fingerprinter;
  SliceHooks& hooks;
  Snapshotter* snapshotter = nullptr;  // null: no snapshots
  std::uint64_t salt_check = 0;        // filter::salt_check(), only with snapshots
  /// The process's memory budget (SliceOptions::memory); null: none.
  std::shared_ptr<filter::MemoryBudget> memory;
  /// Where a parked filter is read back from (with `snapshotter`); null:
  /// no parking. `fingerprint`: the snapshots' expected config and salt.
  const state::SnapshotStore* store = nullptr;
  state::StateFingerprint fingerprint;
};

/// One worker thread and its queue. The queue is the only thing shared with
/// the consumer thread (push, barrier, queued_records); the slices, the
/// processor and the topic handles are the worker's alone.
class Worker {
 public:
  Worker(std::uint32_t index, const WorkerContext& context, identity::IdentityExtractor extractor);

  void start();
  void join();

  /// Consumer thread: enqueue work.
  void push(Work work);

  /// Consumer thread: returns once everything queued before has been
  /// processed (and, for kRelease / kDrop / kCapture, done).
  void barrier(Work::Kind kind = Work::Kind::kBarrier, std::vector<PartitionId> partitions = {},
               std::vector<PartitionId> capture = {});

  [[nodiscard]] std::size_t queued_records() const noexcept {
    return queued_records_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t busy_nanos() const noexcept {
    return busy_nanos_.load(std::memory_order_relaxed);
  }

  /// Setup, before start(): the librdkafka queue this worker reads its
  /// partitions' records from (their queues forward to it).
  void open_inbox(RdKafka::KafkaConsumer& consumer);
  [[nodiscard]] rd_kafka_queue_t* inbox() const noexcept { return inbox_; }
  /// After join(): releases the inbox.
  void close_inbox() noexcept;

 private:
  class ProducerSinks;

  static void on_inbox_event(rd_kafka_t* rk, void* opaque);
  [[nodiscard]] bool take_inbox(Work& work);
  void close(const Work& work);

  void loop();
  [[nodiscard]] bool next(Work& work);
  /// Once a second: quiet spells, due snapshots, parking, the budget vote.
  void check_slices();
  [[nodiscard]] bool snapshot_covers(const Slice& slice) const;
  /// True when `slice` (`covered` by its snapshot, or pristine) was parked now.
  bool maybe_park(Slice& slice, std::int64_t wall_ms, bool covered);
  [[nodiscard]] bool unpark(Slice& slice);
  void settle_budget(std::int64_t wall_ms);
  void release(Work& work);
  void process(std::vector<MessagePtr>& records, bool from_inbox);
  void process_partition(Slice& slice, std::span<MessagePtr> records);
  void maybe_capture(Slice& slice, std::size_t records);
  void capture(Slice& slice);
  void publish_filter_stats(Slice& slice);
  void observe_emit_age(const rd_kafka_message_t& m) noexcept;

  std::uint32_t index_;
  const WorkerContext& context_;
  const bool reads_headers_;  // the identity spec has a header part (before processor_)
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> queue_;
  bool inbox_ready_ = false;                    // under mu_: the inbox may hold records
  rd_kafka_queue_t* inbox_ = nullptr;           // null: records come through queue_ only
  RdKafka::KafkaConsumer* consumer_ = nullptr;  // the inbox's (its errors)
  std::vector<rd_kafka_message_t*> inbox_batch_;
  std::atomic<std::size_t> queued_records_{0};
  std::atomic<std::uint64_t> busy_nanos_{0};

  // Worker-thread state, only touched by loop().
  bool failed_ = false;  // stop processing after a fatal record-level error
  std::map<PartitionId, std::unique_ptr<Slice>> slices_;
  std::map<PartitionId, std::unique_ptr<Slice>> closed_;  // kClose: until released
  PartitionProcessor processor_;
  BatchView batch_view_;
  OutputProducer output_;             // topic handles released at kStop
  metrics::EmitAgeCounts emit_ages_;  // this batch's output records
  std::int64_t batch_wall_ns_ = 0;    // the wall clock when this batch began
  // The last check_slices() pass.
  std::chrono::steady_clock::time_point quiet_checked_{};
  // The worker's own vote on the memory budget's level, by the wall clock
  // in milliseconds (check_slices()).
  filter::BudgetLevel budget_level_;
};

/// The workers, seen from the consumer thread: fetched records are batched
/// per worker (config.batch_size, or max_linger) before they are pushed, and
/// each new Slice goes to the worker with the fewest. Consumer thread only,
/// except busy_nanos() (any thread).
class WorkerPool {
 public:
  using Clock = std::chrono::steady_clock;

  /// Setup: builds `threads` workers (at least one), each with its own
  /// identity extractor. Not started.
  [[nodiscard]] Status build(const WorkerContext& context, std::uint32_t threads,
                             const std::string& extractor);
  void start();
  /// Pushes kStop to every worker and joins them (idempotent).
  void stop();

  [[nodiscard]] std::size_t size() const noexcept { return workers_.size(); }
  [[nodiscard]] std::size_t queued_records() const;
  [[nodiscard]] std::vector<std::uint64_t> busy_nanos() const;
  /// Gives each worker an inbox on `consumer` (before start()).
  void open_inboxes(RdKafka::KafkaConsumer& consumer);
  /// Worker `worker`'s inbox (null when none).
  [[nodiscard]] rd_kafka_queue_t* inbox(std::uint32_t worker) const {
    return workers_[worker]->inbox();
  }
  /// The workers read their partitions' records from inboxes.
  [[nodiscard]] bool has_inboxes() const { return !workers_.empty() && inbox(0) != nullptr; }

  /// Hands a fetched record to worker `worker`'s next batch (`now`: the
  /// consumer loop's clock).
  void dispatch(MessagePtr message, std::uint32_t worker, Clock::time_point now) {
    auto& batch = pending_[worker];
    if (batch.empty() && pending_records_ == 0) first_pending_ = now;
    batch.push_back(std::move(message));
    ++pending_records_;
    if (batch.size() >= batch_size_) push_batch(worker);
  }
  /// Pushes every batch that waits.
  void flush();
  /// flush() when the oldest waiting record waited `max_linger` by `now`.
  void flush_lingering(Clock::time_point now, std::chrono::milliseconds max_linger) {
    if (pending_records_ != 0 && now - first_pending_ >= max_linger) flush();
  }

  /// Waits until every worker processed what it was handed (`kind`:
  /// kBarrier, or kCapture to take a snapshot capture of every slice too).
  void barrier_all(Work::Kind kind = Work::Kind::kBarrier);
  /// Waits until worker `worker` processed what it was handed.
  void barrier(std::uint32_t worker) { workers_[worker]->barrier(); }
  /// Waits until the workers of `by_worker` processed what they were
  /// handed and stopped processing those partitions' records.
  void close(const std::map<std::uint32_t, std::vector<PartitionId>>& by_worker);

  /// Hands `slice` to the worker with the fewest slices; returns it.
  std::uint32_t adopt(std::unique_ptr<Slice> slice);
  /// Destroys the slices of `by_worker` on their workers once their queued
  /// records were processed: kRelease (snapshot `capture` first, then the
  /// on_release hook) or kDrop (neither).
  void release(const std::map<std::uint32_t, std::vector<PartitionId>>& by_worker, Work::Kind kind,
               const std::vector<PartitionId>& capture = {});

 private:
  void push_batch(std::uint32_t worker);

  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::uint32_t> slices_per_worker_;
  std::vector<std::vector<MessagePtr>> pending_;  // per worker, not yet pushed
  std::size_t pending_records_ = 0;
  std::size_t batch_size_ = 1;
  Clock::time_point first_pending_{};
  bool stopped_ = false;
};

}  // namespace kdedup::pipeline
