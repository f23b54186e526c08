#pragma once
// Pipeline counters and the read-only snapshot other modules (metrics, logs,
// tests) read them through.
//
// Every counter is a relaxed atomic written by the one thread that owns the
// event (the worker that owns the partition's Slice, or the delivery thread
// for delivery reports) and read by anyone. Readers see each counter
// individually up to date, not a consistent cut across counters; that is what
// Prometheus scrapes expect. The per-record path only does relaxed
// fetch_add on counters of its own partition: no locks. The two latency
// histograms are bucket counters of the same kind (metrics/duration_histogram.h),
// added to once per batch.

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kdedup/metrics/duration_histogram.h"

namespace kdedup::pipeline {

/// Confirmed mode figures of one partition (pipeline/confirm.h); all zero
/// without a confirm store.
struct ConfirmCounts {
  std::uint64_t lookups = 0;      ///< filter duplicates confirmed against the store
  std::uint64_t prevented = 0;    ///< of them absent or expired there: emitted instead
  std::uint64_t store_bytes = 0;  ///< approximate bytes of the partition's entries on disk
  std::uint64_t staged = 0;       ///< deliveries in memory waiting for the next snapshot
  metrics::ConfirmLookupCounts lookup_times;  ///< count() = batches that looked up
};

/// The same, live: written by the worker that owns the partition.
struct ConfirmCounters {
  std::atomic<std::uint64_t> lookups{0};
  std::atomic<std::uint64_t> prevented{0};
  std::atomic<std::uint64_t> store_bytes{0};
  std::atomic<std::uint64_t> staged{0};
  metrics::ConfirmLookupHistogram lookup_times;

  [[nodiscard]] ConfirmCounts read() const noexcept {
    return {lookups.load(std::memory_order_relaxed), prevented.load(std::memory_order_relaxed),
            store_bytes.load(std::memory_order_relaxed), staged.load(std::memory_order_relaxed),
            lookup_times.read()};
  }
};

/// Live counters of one assigned partition. Shared (std::shared_ptr) by its
/// Slice, the delivery reports in flight and the Pipeline's registry.
struct PartitionCounters {
  std::atomic<std::uint64_t> records_in{0};
  std::atomic<std::uint64_t> distinct{0};         ///< judged distinct (or passed through)
  std::atomic<std::uint64_t> duplicates{0};       ///< judged duplicate (dropped or routed)
  std::atomic<std::uint64_t> invalid{0};          ///< identity could not be extracted
  std::atomic<std::uint64_t> dead_lettered{0};    ///< invalid records sent to the DLQ
  std::atomic<std::uint64_t> invalid_dropped{0};  ///< invalid records dropped (on_invalid: drop)
  std::atomic<std::uint64_t> invalid_passed{0};   ///< invalid records emitted (on_invalid: pass)
  std::atomic<std::uint64_t> produced{0};         ///< outputs acknowledged by the broker
  std::atomic<std::uint64_t> delivery_errors{0};  ///< outputs the broker refused for good
  std::atomic<std::uint64_t> clock_capped{0};  ///< timestamps beyond wall clock + max_future_skew
  std::atomic<std::uint64_t> no_timestamp{0};  ///< timestamps missing, zero or negative
  std::atomic<std::int64_t> clock_ms{0};       ///< partition clock (event time)
  std::atomic<std::int64_t> next_offset{-1};   ///< one past the last processed offset
  /// Processing time of each batch (extract, fingerprint, decide, hand to
  /// the producer): one observation per batch, by the owning worker.
  metrics::BatchTimeHistogram batch_times;
  /// Age at emit (produce time minus record timestamp) of each record handed
  /// to the producer for the output topic; records without a timestamp are
  /// not observed. Gathered per batch by the worker, added once per batch.
  metrics::EmitAgeHistogram emit_ages;
  /// Records handed to the partition's worker and not processed yet: the
  /// consumer thread adds one per record it dispatches, the worker subtracts
  /// a whole run of the partition's records at once.
  std::atomic<std::int64_t> queued{0};
  /// Records replayed in rebuild mode (filter updated, nothing produced):
  /// not part of records_in / distinct / duplicates.
  std::atomic<std::uint64_t> replayed{0};
  /// True from assignment until the recovery replay reached its end (set by
  /// the consumer thread); /readyz is not ready while any partition is.
  std::atomic<bool> restoring{false};
  // Filter statistics, refreshed by the owning worker after each batch.
  std::atomic<std::uint64_t> filter_bytes{0};
  std::atomic<std::uint32_t> filter_subfilters{0};
  std::atomic<double> filter_fpp_estimate{0.0};
  /// Parking (Slice::park()): the filter is in the snapshot store only;
  /// how many times a parked filter was restored for new records.
  std::atomic<bool> parked{false};
  std::atomic<std::uint64_t> unparks{0};
  /// The stored snapshot covers every record the partition processed (or
  /// it processed none): a restart replays nothing of it. Refreshed by the
  /// owning worker once a second.
  std::atomic<bool> snapshot_current{false};
  ConfirmCounters confirm;

  /// Invalid records by failure reason (stable short names from the identity
  /// module). Invalid records are the cold path, so a mutex is fine here.
  void count_invalid_reason(const std::string& reason);
  [[nodiscard]] std::map<std::string, std::uint64_t> invalid_reasons() const;

 private:
  mutable std::mutex reasons_mu_;
  std::map<std::string, std::uint64_t> reasons_;
};

/// A copy of one partition's counters at the time of the call.
struct PartitionStats {
  std::string topic;
  std::int32_t partition = 0;
  std::uint32_t worker = 0;
  std::uint64_t records_in = 0, distinct = 0, duplicates = 0, invalid = 0;
  std::uint64_t dead_lettered = 0, invalid_dropped = 0, invalid_passed = 0;
  std::uint64_t produced = 0, delivery_errors = 0;
  std::uint64_t clock_capped = 0, no_timestamp = 0;
  std::int64_t clock_ms = 0;
  std::int64_t next_offset = -1;
  std::int64_t committed_offset = -1;    ///< last offset committed by this process; -1 = none yet
  std::uint64_t in_flight = 0;           ///< outputs awaiting delivery reports
  metrics::BatchTimeCounts batch_times;  ///< count() = batches processed
  metrics::EmitAgeCounts emit_ages;      ///< count() = output records with a timestamp
  std::uint64_t queued = 0;              ///< records dispatched to its worker, not processed yet
  std::uint64_t replayed = 0;            ///< records replayed in rebuild mode (not in records_in)
  bool restoring = false;                ///< recovery replay not finished yet
  std::map<std::string, std::uint64_t> invalid_reasons;
  // Filter statistics, refreshed by the owning worker after each batch.
  std::uint64_t filter_bytes = 0;
  std::uint32_t filter_subfilters = 0;
  double filter_fpp_estimate = 0.0;
  bool parked = false;
  std::uint64_t unparks = 0;
  bool snapshot_current = false;
  ConfirmCounts confirm;
};

/// delivery: transactional: how the transactions ended (all 0 otherwise).
struct TransactionStats {
  std::uint64_t committed = 0;          ///< transactions committed
  std::uint64_t aborted = 0;            ///< transactions aborted, each followed by a rollback
  std::uint64_t records_committed = 0;  ///< output-topic records in committed transactions
  std::uint64_t records_aborted = 0;    ///< output-topic records in aborted transactions
  std::uint64_t partitions_rolled_back = 0;
};

/// The process's memory budget (filter/memory_budget.h).
struct MemoryStats {
  std::uint64_t max_bytes = 0;   ///< memory.max_bytes; 0 = no budget
  std::uint64_t used_bytes = 0;  ///< filter state reserved by every partition
  double effective_fpp = 0.0;    ///< the target the filters size for now
};

/// A copy of the whole pipeline's counters.
struct PipelineStats {
  std::vector<PartitionStats> partitions;  ///< currently assigned partitions
  std::uint64_t rebalances = 0;            ///< assignment changes seen by this member
  std::uint64_t assigned_partitions = 0;
  std::vector<std::uint64_t> worker_busy_nanos;  ///< per worker thread
  bool ready = false;                            ///< joined the group and processing
  /// Milliseconds since the consumer loop last turned (polled the consumer
  /// or waited for room in the worker queues); -1 before run() started it.
  /// A loop stuck anywhere (a callback, a blocked worker barrier) grows it.
  std::int64_t consumer_loop_age_ms = -1;
  TransactionStats transactions;
  MemoryStats memory;
};

}  // namespace kdedup::pipeline
