#pragma once
// Metrics: every Prometheus metric kdedup exports (docs/metrics.md lists
// them all), and the cheap handles the pipeline updates them through.
//
// Ownership and threads:
//   - The app creates one Metrics and keeps it alive longer than every
//     PartitionMetrics handle and the MetricsServer that scrapes it.
//   - Metrics' own methods are thread-safe.
//   - The pipeline asks for one PartitionMetrics per assigned partition on
//     assignment and destroys it on revocation (its gauges disappear, its
//     counters stay, as Prometheus expects). Every method is safe from any
//     thread (prometheus-cpp's counters are atomic, its histograms lock);
//     the section comments say who calls them.
//
// Hot path: all label lookups happen when the handle is created, and the
// workers never call these methods per record. The pipeline's workers count
// into relaxed atomics of their own (pipeline/stats.h, duration_histogram.h)
// and the pipeline's StatsBridge thread passes the deltas here once a second:
// add_batch() for the counters, add_batch_times() / add_emit_ages() for the
// two latency histograms (one ObserveMultiple() merge each).
//
// Gauges that describe a partition (filter fill, estimated fpp, queue
// depth, ...) live in atomics on the handle and are read at scrape time, so
// with per-partition series switched off they aggregate per topic correctly
// (sums for sizes, max for probabilities and lags, min for snapshot times).

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/metrics/audit_sampler.h"
#include "kdedup/metrics/duration_histogram.h"
#include "kdedup/metrics/health.h"
#include "kdedup/metrics/stats_json.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
struct MetricFamily;
}  // namespace prometheus

namespace kdedup::metrics {

/// Most invalid-record reasons a Metrics instance can count separately.
inline constexpr std::size_t kMaxInvalidReasons = 16;

/// The identity module's reason names (identity::kAllReasons, to_string()),
/// in that order; Metrics appends "other" for anything else.
[[nodiscard]] std::vector<std::string> default_invalid_reasons();

/// The `reason` label values of kdedup_snapshot_refusals_total: every way a
/// stored snapshot can be refused, in the words of pipeline::to_string(
/// SnapshotRefusal) (this module cannot see that enum; the pipeline's unit
/// test checks the two agree). "missing" is not here: no snapshot is not a
/// refusal. The series exist at zero from assignment so alerts see them.
inline constexpr std::array<std::string_view, 7> kSnapshotRefusalReasons{
    "corrupt",         "config_changed",   "format_unknown", "read_error",
    "ahead_of_commit", "behind_retention", "confirm_store"};

struct MetricsOptions {
  /// false: one series per topic instead of per (topic, partition).
  bool per_partition = true;
  /// The configured false-positive target (kdedup_filter_fpp_target).
  double fpp_target = 0.01;
  /// Names for the `reason` label of kdedup_records_invalid_total; at most
  /// kMaxInvalidReasons, each [a-z0-9_]+.
  std::vector<std::string> invalid_reasons = default_invalid_reasons();
  /// The interval the load fairness figures are computed over. Zero means
  /// "since the previous scrape" (used by tests).
  std::chrono::milliseconds load_interval{std::chrono::seconds(60)};
  /// /healthz answers 503 when the main loop has not beaten for this long.
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(30)};
};

/// Outcome counts of one processed batch of one partition.
struct BatchCounts {
  std::uint64_t in = 0;         ///< records read
  std::uint64_t distinct = 0;   ///< records emitted
  std::uint64_t duplicate = 0;  ///< records dropped (or sent to the duplicates topic)
  std::uint64_t dlq = 0;        ///< records routed to the dead-letter topic
  /// Records whose timestamp was beyond wall clock + max_future_skew: the
  /// partition clock read them as wall clock + skew.
  std::uint64_t clock_capped = 0;
  /// Records without a usable timestamp (none, zero or negative): judged at
  /// the partition clock.
  std::uint64_t no_timestamp = 0;
  /// Invalid records by reason index (Metrics::reason_index()).
  std::array<std::uint64_t, kMaxInvalidReasons> invalid{};
};

class Metrics;

/// Counts of the repartition stage (pipeline/repartition.h) since the last
/// call to Metrics::add_repartition.
struct RepartitionCounts {
  std::uint64_t in = 0;             ///< records read from the input topics
  std::uint64_t repartitioned = 0;  ///< acknowledged by the internal topic
  std::uint64_t dead_lettered = 0;  ///< without identity, on_invalid: dlq
  std::uint64_t dropped = 0;        ///< without identity, on_invalid: drop
  std::uint64_t passed = 0;         ///< without identity, on_invalid: pass (forwarded)
};

/// The per-partition handle. See the file comment for its threading rules.
class PartitionMetrics {
 public:
  ~PartitionMetrics();
  PartitionMetrics(const PartitionMetrics&) = delete;
  PartitionMetrics& operator=(const PartitionMetrics&) = delete;

  // --- the StatsBridge thread, once a period (audits: the owning worker) --
  /// Adds outcome counts (of one batch, or of all batches since the last call).
  void add_batch(const BatchCounts& counts);
  /// Adds batch processing times to kdedup_batch_processing_seconds: every
  /// batch counted in `times` is one observation, in its own bucket.
  void add_batch_times(const BatchTimeCounts& times);
  /// Adds ages at emit (produce time minus record timestamp) of records
  /// emitted to the output topic to kdedup_record_age_at_emit_seconds.
  void add_emit_ages(const EmitAgeCounts& ages);
  /// Filter statistics and wall clock minus the partition clock: positive
  /// when the clock trails wall clock (kdedup_filter_clock_lag_seconds),
  /// negative when it is ahead (kdedup_filter_clock_ahead_seconds).
  void set_filter(const filter::FilterStats& stats, double clock_lag_seconds) noexcept;
  void set_queue_depth(std::uint64_t records) noexcept;
  /// Parking: whether the filter is parked now (kdedup_filter_parked) and
  /// how many parked filters were read back since the last call
  /// (kdedup_filter_unparks_total).
  void set_parked(bool parked, std::uint64_t unparks);
  void add_audit(const AuditCounts& counts);
  /// Confirmed mode: filter duplicates looked up in the confirm store, those
  /// it did not confirm (prevented false positives), and the batches' lookup
  /// times (kdedup_confirm_lookup_seconds).
  void add_confirm(std::uint64_t lookups, std::uint64_t prevented,
                   const ConfirmLookupCounts& times);
  /// Confirmed mode: the partition's entries on disk (kdedup_confirm_store_bytes).
  void set_confirm_store_bytes(std::uint64_t bytes) noexcept;

  // --- any thread (state integration) -------------------------------------
  void snapshot_written(double seconds, std::uint64_t bytes);
  void snapshot_failed();
  /// The partition's stored snapshot covers every record it processed:
  /// nothing to replay, so kdedup_snapshot_last_success_timestamp_seconds
  /// reads now (a quiet partition is not stale).
  void snapshot_current() noexcept;
  /// A partition restored from a snapshot.
  void restored(double seconds, std::uint64_t bytes);
  /// A partition that had to be rebuilt by replay (no usable snapshot), and
  /// how many records the replay fed through the filter.
  void rebuilt(std::uint64_t replayed_records);
  /// Records replayed in rebuild mode for any reason (including output
  /// reconciliation after a restore).
  void add_replayed(std::uint64_t records);
  /// A stored snapshot that was not used, by reason (one of
  /// kSnapshotRefusalReasons; another name gets a series of its own rather
  /// than being lost).
  void snapshot_refused(std::string_view reason);

  const std::string& topic() const noexcept { return topic_; }
  std::int32_t partition() const noexcept { return partition_; }

 private:
  friend class Metrics;
  PartitionMetrics(Metrics& owner, std::string topic, std::int32_t partition);

  struct Gauges;  // atomics read at scrape time

  Metrics& owner_;
  std::string topic_;
  std::int32_t partition_;
  std::shared_ptr<Gauges> gauges_;
  prometheus::Counter* in_;
  prometheus::Counter* distinct_;
  prometheus::Counter* duplicate_;
  prometheus::Counter* dlq_;
  prometheus::Counter* clock_capped_;
  prometheus::Counter* no_timestamp_;
  std::array<prometheus::Counter*, kMaxInvalidReasons> invalid_{};
  prometheus::Counter* audit_sampled_;
  prometheus::Counter* audit_truly_new_;
  prometheus::Counter* audit_fp_;
  prometheus::Counter* audit_fp_records_;
  prometheus::Counter* audit_fn_;
  prometheus::Histogram* batch_seconds_;
  prometheus::Histogram* emit_age_;
  prometheus::Counter* confirm_lookups_;
  prometheus::Counter* confirm_prevented_;
  prometheus::Histogram* confirm_seconds_;
  prometheus::Counter* snapshots_;
  prometheus::Counter* snapshot_failures_;
  prometheus::Counter* snapshot_bytes_;
  prometheus::Histogram* snapshot_seconds_;
  prometheus::Counter* restores_;
  prometheus::Counter* unparks_;
  prometheus::Counter* restore_bytes_;
  prometheus::Histogram* restore_seconds_;
  prometheus::Counter* rebuilds_;
  prometheus::Counter* replayed_;
  std::array<prometheus::Counter*, kSnapshotRefusalReasons.size()> refusals_{};
};

class Metrics {
 public:
  /// Validates the options (fpp in (0,1), reason names) and registers every
  /// metric family.
  [[nodiscard]] static Result<std::unique_ptr<Metrics>> create(MetricsOptions options);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  /// The handle for one assigned partition (see PartitionMetrics). Two live
  /// handles for the same partition share its counters and their gauges are
  /// combined as in per-topic aggregation; the pipeline keeps one per
  /// assignment.
  [[nodiscard]] std::unique_ptr<PartitionMetrics> partition(std::string_view topic,
                                                            std::int32_t partition);

  /// Index of an invalid-record reason for BatchCounts::invalid; unknown
  /// names map to "other" (always present, last).
  [[nodiscard]] std::size_t reason_index(std::string_view reason) const noexcept;
  [[nodiscard]] const std::vector<std::string>& invalid_reasons() const noexcept {
    return reasons_;
  }

  // --- instance-wide, any thread -------------------------------------------
  /// Applies one parsed librdkafka statistics document: consumer lag from a
  /// consumer's, producer queue figures from a producer's. The last
  /// consumer document replaces the whole lag table (revoked partitions
  /// disappear).
  void apply_statistics(const ClientStatistics& stats);
  /// Failed delivery reports for records produced to `topic` (not a hot
  /// path: takes a lock and looks the topic up).
  void add_delivery_errors(std::string_view topic, std::uint64_t n);
  void add_rebalance();
  void set_assigned_partitions(std::int64_t n);
  /// The repartition stage's counts since the last call, and its consumer
  /// lag (records, summed over its assigned partitions) and assignment.
  void add_repartition(const RepartitionCounts& counts);
  void set_repartition(std::int64_t lag_records, std::int64_t assigned_partitions);
  void set_workers(std::int64_t n);
  /// The memory budget (0 = none), the filter state reserved against it and
  /// the fpp the filters size for now (filter/memory_budget.h); 0 keeps
  /// the configured target.
  void set_memory(std::uint64_t budget_bytes, std::uint64_t used_bytes, double effective_fpp);
  /// Time a worker spent processing (not waiting); busy ratio =
  /// rate(kdedup_worker_busy_seconds_total) / kdedup_workers.
  void add_busy_seconds(double seconds);
  /// delivery: transactional outcomes since the last call: transactions
  /// committed and aborted, output-topic records they committed and the ones
  /// aborts discarded. The four series exist (at zero) in every mode.
  void add_transactions(std::uint64_t committed, std::uint64_t aborted,
                        std::uint64_t records_committed, std::uint64_t records_discarded);

  [[nodiscard]] Health& health() noexcept { return health_; }
  [[nodiscard]] const MetricsOptions& options() const noexcept { return options_; }

  /// Every metric family with its current values, for a scrape.
  [[nodiscard]] std::vector<prometheus::MetricFamily> collect();
  /// The Prometheus text exposition format of collect().
  [[nodiscard]] std::string scrape();

  /// "0.1.0" and the `git describe` of the build ("unknown" outside git).
  [[nodiscard]] static const char* version() noexcept;
  [[nodiscard]] static const char* revision() noexcept;

 private:
  friend class PartitionMetrics;
  struct Families;
  Metrics(MetricsOptions options, std::vector<std::string> reasons);
  void drop_gauges(const PartitionMetrics::Gauges* gauges);
  std::vector<prometheus::MetricFamily> collect_gauges();
  /// Load fairness and the busiest slice's share over the last interval
  /// (under mu_).
  void refresh_load_shares();

  MetricsOptions options_;
  std::vector<std::string> reasons_;  // options' reasons + "other"
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> families_;
  Health health_;

  std::mutex mu_;  // guards everything below
  std::vector<std::shared_ptr<PartitionMetrics::Gauges>> gauges_;
  std::vector<PartitionLag> lags_;
  std::chrono::steady_clock::time_point load_window_start_;
  bool load_window_done_ = false;
  double fairness_ = 1.0;
  double max_share_ = 0.0;
};

}  // namespace kdedup::metrics
