#pragma once
// Instrumentation: connects a running Pipeline to the metrics module without
// touching the pipeline's hot path.
//
//   metrics = Metrics::create(...)                        // app
//   Instrumentation inst(*metrics, config)                // app, before Pipeline::create
//   pipeline = Pipeline::create(config, inst.hooks())     // slices get an AuditedFilter
//   StatsBridge bridge(*metrics, inst, [&] { return pipeline->stats(); })
//   bridge.start(); pipeline->run(stop); bridge.stop();
//
// Three pieces:
// - AuditedFilter: a SlidingFilter decorator built by the make_slice hook.
//   It forwards every call to the real filter and, on the owning worker
//   thread, feeds each decision on an audited fingerprint to the partition's
//   AuditSampler (observed false-positive rate) and publishes the filter's
//   statistics into a FilterProbe every few batches.
// - Instrumentation: the per-partition registry (PartitionMetrics handle,
//   FilterProbe, generation) shared by the hook and the bridge.
// - StatsBridge: a thread that once a period reads Pipeline::stats(), turns
//   counter deltas into PartitionMetrics / Metrics updates, drops the handles
//   of revoked partitions and drives /healthz and /readyz.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kdedup/config/config.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/metrics/audit_sampler.h"
#include "kdedup/metrics/metrics.h"
#include "kdedup/pipeline/pipeline.h"
#include "kdedup/pipeline/repartition.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/pipeline/stats.h"

namespace kdedup::pipeline {

/// Filter statistics published by the worker that owns the filter and read
/// by the StatsBridge thread (relaxed atomics: each field individually up to
/// date, which is all a gauge needs).
struct FilterProbe {
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<std::uint64_t> cells{0};
  std::atomic<std::uint64_t> live_cells{0};
  std::atomic<std::uint32_t> subfilters{0};
  std::atomic<std::uint64_t> insertions{0};
  std::atomic<double> fpp_estimate{0.0};
  std::atomic<bool> published{false};  ///< false until the first publish()

  void publish(const filter::FilterStats& s) noexcept;
  [[nodiscard]] filter::FilterStats read() const noexcept;
};

/// A SlidingFilter that audits and measures another one.
///
/// Decisions are exactly the inner filter's. After each call the decisions
/// on fingerprints the sampler selects (1/N of the identity space) go to the
/// AuditSampler, whose counts are pushed to the partition's metrics once per
/// batch; every `stats_every` batches, or at least a second apart, the inner
/// filter's stats() is copied into the FilterProbe, and by flush() when a
/// batch since the last copy was not.
///
/// serialize() returns the *inner* filter's state: snapshots store the real
/// filter, never this wrapper, so restore_filter() of the blob gives back
/// the inner filter type (wrap it again when building the restored Slice).
///
/// Owned by the Slice; every method runs on the worker that owns the Slice.
class AuditedFilter final : public filter::SlidingFilter {
 public:
  /// `sampler` empty = no audit (metrics.audit_sample: 0). `metrics` and
  /// `probe` must not be null.
  AuditedFilter(std::unique_ptr<filter::SlidingFilter> inner,
                std::optional<metrics::AuditSampler> sampler,
                std::shared_ptr<metrics::PartitionMetrics> metrics,
                std::shared_ptr<FilterProbe> probe, std::uint32_t stats_every = 64);

  [[nodiscard]] filter::FilterType type() const noexcept override { return inner_->type(); }
  [[nodiscard]] const filter::FilterConfig& config() const noexcept override {
    return inner_->config();
  }
  filter::Decision test_and_insert(const filter::Fingerprint& fp, filter::Tick now) override;
  void test_and_insert_batch(std::span<const filter::Fingerprint> fps,
                             std::span<const filter::Tick> ticks,
                             std::span<filter::Decision> out) override;
  /// The inner filter's insert; the audit's shadow set learns the delivery.
  void insert(const filter::Fingerprint& fp, filter::Tick now) override;
  void advance(filter::Tick now) override { inner_->advance(now); }
  [[nodiscard]] filter::FilterStats stats() const override { return inner_->stats(); }
  [[nodiscard]] std::string serialize() const override { return inner_->serialize(); }
  void set_memory_budget(std::shared_ptr<filter::MemoryBudget> budget) override {
    inner_->set_memory_budget(std::move(budget));
  }
  void quiet() override { inner_->quiet(); }
  void flush() override;
  /// Parking: the gauges read no bytes while nothing is wrapped (the last
  /// fpp estimate stays: the parked state answers with it once restored).
  std::unique_ptr<filter::SlidingFilter> exchange_wrapped(
      std::unique_ptr<filter::SlidingFilter> inner) override;

  [[nodiscard]] const filter::SlidingFilter& inner() const noexcept { return *inner_; }
  /// Audit totals since creation (tests, logs); null without a sampler.
  [[nodiscard]] const metrics::AuditCounts* audit_totals() const noexcept {
    return sampler_ ? &sampler_->totals() : nullptr;
  }

 private:
  void after_batch();
  /// Copies the inner filter's stats() into the probe now.
  void publish_stats();

  std::unique_ptr<filter::SlidingFilter> inner_;
  std::optional<metrics::AuditSampler> sampler_;
  std::shared_ptr<metrics::PartitionMetrics> metrics_;
  std::shared_ptr<FilterProbe> probe_;
  std::uint32_t stats_every_;
  std::uint32_t batches_since_stats_ = 0;  ///< batches since the last copy
  std::chrono::steady_clock::time_point last_stats_{};
};

/// The per-partition instruments of one process: which PartitionMetrics
/// handle and FilterProbe belong to each assigned partition. Built by the
/// app, outlives the Pipeline and the StatsBridge. Thread-safe (a mutex;
/// touched on assignment and once per bridge period, never per record).
class Instrumentation {
 public:
  /// What the bridge needs to know about one partition's instruments.
  struct Entry {
    std::shared_ptr<metrics::PartitionMetrics> metrics;
    std::shared_ptr<FilterProbe> probe;  ///< null in passthrough mode
    std::uint64_t generation = 0;        ///< bumped on every (re)assignment
  };

  /// `config` gives the slice options and metrics.audit_sample.
  Instrumentation(metrics::Metrics& metrics, const config::Config& config);

  /// Hooks for Pipeline::create: make_slice builds the Slice (from a
  /// restored filter or a new one) with its filter wrapped in an
  /// AuditedFilter; on_statistics hands librdkafka's statistics documents to
  /// offer_statistics(); on_recovered and on_snapshot feed the restore,
  /// rebuild and snapshot metrics.
  [[nodiscard]] SliceHooks hooks();

  /// Builds the Slice for `id` (what hooks().make_slice calls): `start`'s
  /// restored filter, or a new empty one, wrapped in an AuditedFilter.
  [[nodiscard]] Result<std::unique_ptr<Slice>> make_slice(const PartitionId& id,
                                                          const SliceOptions& options,
                                                          SliceStart start = {});

  /// A partition finished recovering: counts a restore (duration, bytes) or
  /// a rebuild (kdedup_restores_total / kdedup_rebuilds_total). Replayed
  /// records are counted by the StatsBridge as they happen.
  void recovered(const PartitionId& id, const RecoveryOutcome& outcome);
  /// A snapshot write finished (any thread; the partition may already be
  /// revoked, then a short-lived handle counts it).
  void snapshot_written(const PartitionId& id, const Result<state::WriteReport>& result);

  /// The entry for `id`, if one was made.
  [[nodiscard]] std::optional<Entry> find(const PartitionId& id) const;
  /// Forgets `id` (the bridge calls it once the partition is no longer
  /// assigned); the AuditedFilter may still hold the handle until its Slice
  /// is destroyed.
  void forget(const PartitionId& id);
  /// Creates the entry for `id` without a Slice (passthrough partitions seen
  /// only through stats, and tests); returns the existing one if present.
  Entry ensure(const PartitionId& id);

  /// Keeps one librdkafka statistics document for the bridge to parse (the
  /// caller is librdkafka's poll thread, i.e. the consumer or delivery
  /// thread, so nothing is parsed here). At most kMaxPendingStatistics wait;
  /// beyond that the oldest is dropped (a newer one supersedes it).
  void offer_statistics(std::string_view json);
  /// The documents offered since the last call, oldest first (bridge thread).
  [[nodiscard]] std::vector<std::string> take_statistics();
  static constexpr std::size_t kMaxPendingStatistics = 8;

  [[nodiscard]] metrics::Metrics& metrics() noexcept { return metrics_; }

 private:
  metrics::Metrics& metrics_;
  std::uint32_t audit_one_in_;
  mutable std::mutex mu_;
  std::map<PartitionId, Entry> entries_;
  std::uint64_t next_generation_ = 1;
  std::mutex statistics_mu_;
  std::deque<std::string> statistics_;
};

/// Feeds Pipeline::stats() into Metrics once a period on its own thread.
///
/// Each round also parses the librdkafka statistics documents waiting in
/// Instrumentation (consumer lag, producer queue); a document that does not
/// parse is logged at debug and counted (statistics_rejected()).
///
/// Per partition it publishes the deltas of the pipeline's counters since
/// its previous reading (records in / distinct / duplicate / invalid by
/// reason / DLQ, delivery errors), the new observations of the two latency
/// histograms (every batch's processing time and every output record's age
/// at emit, bucketed by the workers: one ObserveMultiple() each), the filter
/// statistics from the FilterProbe, the clock lag (wall clock minus the
/// partition clock) and the queue depth (records dispatched to the
/// partition's worker and not processed yet); instance-wide the rebalances, assigned partitions,
/// workers and worker busy time. A partition absent from stats() is
/// forgotten: its handle is dropped so its gauges disappear.
///
/// Health: the bridge beats /healthz after a stats() reading that answered
/// and whose consumer loop turned within `loop_stale_after` (or has not
/// started yet): a consumer loop stuck in a callback, a worker barrier or
/// the client stops the beats, and /healthz fails once Health's own
/// stale_after passed too. It sets /readyz from PipelineStats::ready (the first
/// assignment callback ran, even with zero partitions) and
/// PartitionStats::restoring of every assigned partition ("restoring N of M
/// partitions" while any replays), and adds each partition's replayed
/// records to kdedup_rebuild_replayed_records_total.
///
/// Owned by the app; start() once, stop() (or the destructor) joins the
/// thread. publish() may be called directly instead of start() (tests).
class StatsBridge {
 public:
  using Source = std::function<PipelineStats()>;
  using WallClockMs = std::function<std::int64_t()>;

  /// `delivery_topic` labels delivery errors (the pipeline counts them per
  /// input partition, not per destination). `wall_ms` defaults to the system
  /// clock.
  StatsBridge(Instrumentation& instruments, Source source, std::string delivery_topic,
              std::chrono::milliseconds period = std::chrono::seconds(1), WallClockMs wall_ms = {},
              std::chrono::milliseconds loop_stale_after = std::chrono::seconds(10));
  ~StatsBridge();
  StatsBridge(const StatsBridge&) = delete;
  StatsBridge& operator=(const StatsBridge&) = delete;

  void start();
  /// Publishes a last round and joins the thread. Idempotent.
  void stop();
  /// One round: read stats, publish deltas, update health. Not concurrent
  /// with itself (the bridge thread, or the caller when not started).
  void publish();

  /// Also publishes the repartition stage's counters, lag and assignment
  /// (kdedup_repartition_*) each round; `internal_topic` labels its delivery
  /// errors. Call before start().
  void watch_repartition(std::function<RepartitionStats()> source, std::string internal_topic);

  /// Statistics documents that did not parse since start (tests, logs).
  [[nodiscard]] std::uint64_t statistics_rejected() const noexcept { return statistics_rejected_; }

 private:
  struct Seen {
    std::uint64_t generation = 0;
    PartitionStats last;  // the previous reading (counters only)
  };

  void run();
  void publish_repartition();
  void publish_instance(const PipelineStats& s);
  [[nodiscard]] std::uint64_t publish_partition(const PartitionStats& p, std::int64_t wall);

  std::function<RepartitionStats()> repartition_;
  std::string internal_topic_;
  RepartitionStats repartition_seen_;

  Instrumentation& instruments_;
  Source source_;
  std::string delivery_topic_;
  std::chrono::milliseconds period_;
  WallClockMs wall_ms_;
  std::chrono::milliseconds loop_stale_after_;
  std::uint64_t statistics_rejected_ = 0;

  std::map<PartitionId, Seen> seen_;
  std::uint64_t rebalances_ = 0;
  TransactionStats transactions_;  // the last reading, for the deltas
  std::vector<std::uint64_t> busy_nanos_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kdedup::pipeline
