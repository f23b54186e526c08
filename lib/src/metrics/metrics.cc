#include "kdedup/metrics/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "kdedup/identity/extractor.h"
#include "kdedup/metrics/fairness.h"

namespace kdedup::metrics {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

namespace {

// Bucket bounds, in seconds. The two latency histograms take theirs from
// duration_histogram.h, where the pipeline's lock-free counters use them too.
const std::vector<double> kBatchBounds(kBatchProcessingBounds.begin(),
                                       kBatchProcessingBounds.end());
const std::vector<double> kAgeBounds(kEmitAgeBounds.begin(), kEmitAgeBounds.end());
const std::vector<double> kConfirmBounds(kConfirmLookupBounds.begin(), kConfirmLookupBounds.end());
// Snapshots and restores: a small partition in a millisecond, a GiB-sized
// filter in minutes.
const std::vector<double> kStateBounds{0.001, 0.005, 0.01, 0.05, 0.1,  0.5,
                                       1.0,   5.0,   10.0, 30.0, 60.0, 300.0};

bool valid_reason(std::string_view r) {
  if (r.empty()) return false;
  return std::all_of(r.begin(), r.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

template <class T>
void add_nonzero(T* metric, std::uint64_t n) {
  if (n != 0) metric->Increment(static_cast<double>(n));
}

}  // namespace

std::vector<std::string> default_invalid_reasons() {
  std::vector<std::string> out;
  for (identity::Reason r : identity::kAllReasons) out.emplace_back(identity::to_string(r));
  return out;
}

// ---------------------------------------------------------------------------
// Families registered in the prometheus-cpp registry (counters, histograms,
// instance gauges). Partition gauges are produced by collect_gauges().

struct Metrics::Families {
  explicit Families(prometheus::Registry& r) : registry(r) {}

  Family<Counter>& counter(const char* name, const char* help) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
  }
  Family<Gauge>& gauge(const char* name, const char* help) {
    return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
  }
  Family<Histogram>& histogram(const char* name, const char* help) {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
  }

  // Each family is registered where it is declared, in this order (the
  // order of the exposition).
  prometheus::Registry& registry;
  Family<Counter>& records_in =
      counter("kdedup_records_in_total", "Records read from input partitions.");
  Family<Counter>& records_distinct = counter(
      "kdedup_records_distinct_total", "Records judged distinct and emitted to the output topic.");
  Family<Counter>& records_duplicate =
      counter("kdedup_records_duplicate_total", "Records judged duplicates within the window.");
  Family<Counter>& records_invalid = counter(
      "kdedup_records_invalid_total", "Records whose identity could not be extracted, by reason.");
  Family<Counter>& records_dlq =
      counter("kdedup_records_dlq_total", "Records routed to the dead-letter topic.");
  Family<Counter>& clock_capped =
      counter("kdedup_clock_capped_records_total",
              "Records whose timestamp was beyond wall clock + max_future_skew, "
              "read by the partition clock as wall clock + max_future_skew.");
  Family<Counter>& missing_timestamp =
      counter("kdedup_clock_missing_timestamp_records_total",
              "Records without a usable timestamp (none, zero or negative), "
              "judged at the partition clock.");
  Family<Counter>& audit_sampled =
      counter("kdedup_audit_sampled_total",
              "Decisions on records in the audited 1/N of the identity space.");
  Family<Counter>& audit_truly_new =
      counter("kdedup_audit_truly_new_total",
              "Audited identities not delivered within the window, once per "
              "identity (its first such record): the trials of the observed "
              "false-positive rate.");
  Family<Counter>& audit_false_positives =
      counter("kdedup_audit_false_positives_total",
              "Audited identities whose first record not delivered within "
              "the window the filter dropped as a duplicate.");
  Family<Counter>& audit_false_positive_records =
      counter("kdedup_audit_false_positive_records_total",
              "Audited records dropped as duplicates although never delivered within the "
              "window, later copies of a wrongly dropped identity included.");
  Family<Counter>& audit_false_negatives =
      counter("kdedup_audit_false_negatives_total",
              "Audited records the filter emitted although already "
              "delivered within the window.");
  Family<Histogram>& batch_seconds =
      histogram("kdedup_batch_processing_seconds", "Time to process one batch of one partition.");
  Family<Histogram>& emit_age =
      histogram("kdedup_record_age_at_emit_seconds",
                "Age of emitted records (emit time minus record timestamp).");
  Family<Counter>& confirm_lookups =
      counter("kdedup_confirm_lookups_total",
              "Confirmed mode: duplicates the filter found, looked up in the "
              "exact confirm store.");
  Family<Counter>& confirm_prevented =
      counter("kdedup_confirm_prevented_false_positives_total",
              "Confirmed mode: filter duplicates the confirm store did not "
              "hold within the window, emitted as distinct (false "
              "positives prevented).");
  Family<Histogram>& confirm_lookup_seconds =
      histogram("kdedup_confirm_lookup_seconds",
                "Confirmed mode: time of one batch's confirm store "
                "lookups (staged deliveries, then one RocksDB "
                "MultiGet).");
  Family<Counter>& snapshots = counter("kdedup_snapshots_total", "Snapshots written.");
  Family<Counter>& snapshot_failures =
      counter("kdedup_snapshot_failures_total", "Snapshots that failed.");
  Family<Counter>& snapshot_bytes =
      counter("kdedup_snapshot_written_bytes_total", "Bytes of filter state written by snapshots.");
  Family<Histogram>& snapshot_seconds =
      histogram("kdedup_snapshot_duration_seconds", "Time to write one partition snapshot.");
  Family<Counter>& restores =
      counter("kdedup_restores_total", "Partitions restored from a snapshot.");
  Family<Counter>& restore_bytes =
      counter("kdedup_restore_read_bytes_total", "Bytes of filter state read by restores.");
  Family<Histogram>& restore_seconds = histogram(
      "kdedup_restore_duration_seconds", "Time to restore one partition from its snapshot.");
  Family<Counter>& unparks =
      counter("kdedup_filter_unparks_total",
              "Parked filters (state.park_after) brought back for new records: read back from "
              "their snapshot, or made for a partition's first record (parked from its "
              "assignment on).");
  Family<Counter>& rebuilds = counter(
      "kdedup_rebuilds_total", "Partitions rebuilt by replaying input (no usable snapshot).");
  Family<Counter>& replayed =
      counter("kdedup_rebuild_replayed_records_total",
              "Records replayed in rebuild mode (filter updated, nothing emitted).");
  Family<Counter>& snapshot_refusals =
      counter("kdedup_snapshot_refusals_total",
              "Stored snapshots not used on assignment (partition rebuilt "
              "from Kafka instead), by reason; a missing snapshot is not "
              "counted.");
  Family<Counter>& delivery_errors =
      counter("kdedup_producer_delivery_errors_total",
              "Records the producer failed to deliver, by destination topic.");
  Counter& rebalances = counter("kdedup_consumer_rebalances_total",
                                "Consumer group rebalances seen by this instance.")
                            .Add({});
  Counter& busy_seconds = counter("kdedup_worker_busy_seconds_total",
                                  "Time workers spent processing records, summed over workers.")
                              .Add({});
  Family<Counter>& transactions =
      counter("kdedup_transactions_total",
              "Transactions ended (delivery: transactional), by outcome: "
              "committed or aborted.");
  Counter& transactions_committed = transactions.Add({{"outcome", "committed"}});
  Counter& transactions_aborted = transactions.Add({{"outcome", "aborted"}});
  Family<Counter>& transaction_records =
      counter("kdedup_transaction_records_total",
              "Output-topic records in ended transactions, by outcome: "
              "committed, or discarded by an abort.");
  Counter& transaction_records_committed = transaction_records.Add({{"outcome", "committed"}});
  Counter& transaction_records_discarded = transaction_records.Add({{"outcome", "discarded"}});
  Counter& repartition_in = counter("kdedup_repartition_records_in_total",
                                    "Records the repartition stage read from the input topics.")
                                .Add({});
  Counter& repartition_out = counter("kdedup_repartition_records_total",
                                     "Records the repartition stage re-produced to the internal "
                                     "topic, acknowledged.")
                                 .Add({});
  Family<Counter>& repartition_invalid =
      counter("kdedup_repartition_invalid_total",
              "Records without identity at the repartition stage, by the "
              "on_invalid action taken: dlq, drop or pass.");
  Counter& repartition_dlq = repartition_invalid.Add({{"action", "dlq"}});
  Counter& repartition_dropped = repartition_invalid.Add({{"action", "drop"}});
  Counter& repartition_passed = repartition_invalid.Add({{"action", "pass"}});
  Gauge& repartition_lag = gauge("kdedup_repartition_consumer_lag",
                                 "Records of the input topics not yet repartitioned by this "
                                 "instance's partitions (high watermark minus position).")
                               .Add({});
  Gauge& repartition_assigned = gauge("kdedup_repartition_assigned_partitions",
                                      "Input partitions currently assigned to this instance's "
                                      "repartition stage.")
                                    .Add({});
  Gauge& assigned = gauge("kdedup_consumer_assigned_partitions",
                          "Input partitions currently assigned to this instance.")
                        .Add({});
  Gauge& workers = gauge("kdedup_workers", "Worker threads.").Add({});
  Gauge& producer_queue_messages = gauge("kdedup_producer_queue_messages",
                                         "Messages waiting in the producer queue (librdkafka "
                                         "msg_cnt).")
                                       .Add({});
  Gauge& producer_queue_bytes = gauge("kdedup_producer_queue_bytes",
                                      "Bytes waiting in the producer queue (librdkafka msg_size).")
                                    .Add({});
  Gauge& fpp_target =
      gauge("kdedup_filter_fpp_target", "Configured target false-positive probability.").Add({});
  Gauge& fpp_effective_target = gauge("kdedup_filter_fpp_effective_target",
                                      "The false-positive target the filters size for now: "
                                      "filter.fpp, raised evenly while the partitions' filters "
                                      "need more than memory.max_bytes.")
                                    .Add({});
  Gauge& memory_budget = gauge("kdedup_memory_budget_bytes",
                               "memory.max_bytes: filter state all partitions may hold together; "
                               "0 = no budget.")
                             .Add({});
  Gauge& memory_used = gauge("kdedup_memory_used_bytes",
                             "Filter state reserved by all partitions of this instance (counted "
                             "against memory.max_bytes).")
                           .Add({});
  Family<Gauge>& build_info =
      gauge("kdedup_build_info", "Build version and source revision; always 1.");
};

// Partition gauges: written by the owning worker, read at scrape time.
struct PartitionMetrics::Gauges {
  std::string topic;
  std::int32_t partition = 0;
  std::atomic<double> fpp{0.0};
  std::atomic<double> clock_lag{0.0};      // >= 0
  std::atomic<double> clock_ahead{0.0};    // >= 0
  std::atomic<double> last_snapshot{0.0};  // unix seconds; assignment time until the first
  std::atomic<std::uint64_t> cells{0};
  std::atomic<std::uint64_t> live_cells{0};
  std::atomic<std::uint64_t> subfilters{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<std::uint64_t> queue_depth{0};
  std::atomic<std::uint64_t> parked{0};  // 1 while the filter is parked
  std::atomic<std::uint64_t> confirm_bytes{0};
  std::atomic<std::uint64_t> records_in{0};
  std::uint64_t window_start_records = 0;  // guarded by Metrics::mu_
};

// ---------------------------------------------------------------------------

namespace {

/// Merges integer bucket counts into a Prometheus histogram in one locked
/// call (nothing when there are no observations).
template <const auto& Bounds>
void observe_multiple(Histogram& h, const DurationCounts<Bounds>& c) {
  if (c.count() == 0) return;
  std::vector<double> increments(c.buckets.begin(), c.buckets.end());
  h.ObserveMultiple(increments, c.sum_seconds());
}

}  // namespace

PartitionMetrics::PartitionMetrics(Metrics& owner, std::string topic, std::int32_t partition)
    : owner_(owner),
      topic_(std::move(topic)),
      partition_(partition),
      gauges_(std::make_shared<Gauges>()) {
  gauges_->topic = topic_;
  gauges_->partition = partition_;
  gauges_->last_snapshot.store(wall_seconds());
  Metrics::Families& f = *owner.families_;
  Labels labels{{"topic", topic_}};
  if (owner.options_.per_partition) labels.emplace("partition", std::to_string(partition_));
  const Labels topic_labels{{"topic", topic_}};
  in_ = &f.records_in.Add(labels);
  distinct_ = &f.records_distinct.Add(labels);
  duplicate_ = &f.records_duplicate.Add(labels);
  dlq_ = &f.records_dlq.Add(labels);
  clock_capped_ = &f.clock_capped.Add(labels);
  no_timestamp_ = &f.missing_timestamp.Add(labels);
  for (std::size_t i = 0; i < owner.reasons_.size(); ++i) {
    Labels with_reason = labels;
    with_reason.emplace("reason", owner.reasons_[i]);
    invalid_[i] = &f.records_invalid.Add(with_reason);
  }
  audit_sampled_ = &f.audit_sampled.Add(labels);
  audit_truly_new_ = &f.audit_truly_new.Add(labels);
  audit_fp_ = &f.audit_false_positives.Add(labels);
  audit_fp_records_ = &f.audit_false_positive_records.Add(labels);
  audit_fn_ = &f.audit_false_negatives.Add(labels);
  batch_seconds_ = &f.batch_seconds.Add(topic_labels, kBatchBounds);
  emit_age_ = &f.emit_age.Add(topic_labels, kAgeBounds);
  confirm_lookups_ = &f.confirm_lookups.Add(labels);
  confirm_prevented_ = &f.confirm_prevented.Add(labels);
  confirm_seconds_ = &f.confirm_lookup_seconds.Add(topic_labels, kConfirmBounds);
  snapshots_ = &f.snapshots.Add(labels);
  snapshot_failures_ = &f.snapshot_failures.Add(labels);
  snapshot_bytes_ = &f.snapshot_bytes.Add(labels);
  snapshot_seconds_ = &f.snapshot_seconds.Add(topic_labels, kStateBounds);
  restores_ = &f.restores.Add(labels);
  unparks_ = &f.unparks.Add(labels);
  restore_bytes_ = &f.restore_bytes.Add(labels);
  restore_seconds_ = &f.restore_seconds.Add(topic_labels, kStateBounds);
  rebuilds_ = &f.rebuilds.Add(labels);
  replayed_ = &f.replayed.Add(labels);
  for (std::size_t i = 0; i < kSnapshotRefusalReasons.size(); ++i) {
    Labels with_reason = labels;
    with_reason.emplace("reason", std::string(kSnapshotRefusalReasons[i]));
    refusals_[i] = &f.snapshot_refusals.Add(with_reason);
  }
}

PartitionMetrics::~PartitionMetrics() { owner_.drop_gauges(gauges_.get()); }

void PartitionMetrics::add_batch(const BatchCounts& c) {
  add_nonzero(in_, c.in);
  add_nonzero(distinct_, c.distinct);
  add_nonzero(duplicate_, c.duplicate);
  add_nonzero(dlq_, c.dlq);
  add_nonzero(clock_capped_, c.clock_capped);
  add_nonzero(no_timestamp_, c.no_timestamp);
  for (std::size_t i = 0; i < owner_.reasons_.size(); ++i) add_nonzero(invalid_[i], c.invalid[i]);
  gauges_->records_in.fetch_add(c.in, std::memory_order_relaxed);
}

void PartitionMetrics::add_batch_times(const BatchTimeCounts& times) {
  observe_multiple(*batch_seconds_, times);
}

void PartitionMetrics::add_emit_ages(const EmitAgeCounts& ages) {
  observe_multiple(*emit_age_, ages);
}

void PartitionMetrics::set_filter(const filter::FilterStats& s, double clock_lag_seconds) noexcept {
  constexpr auto r = std::memory_order_relaxed;
  gauges_->fpp.store(s.fpp_estimate, r);
  gauges_->cells.store(s.cells, r);
  gauges_->live_cells.store(s.live_cells, r);
  gauges_->subfilters.store(s.subfilters, r);
  gauges_->bytes.store(s.bytes, r);
  gauges_->clock_lag.store(std::max(0.0, clock_lag_seconds), r);
  gauges_->clock_ahead.store(std::max(0.0, -clock_lag_seconds), r);
}

void PartitionMetrics::add_confirm(std::uint64_t lookups, std::uint64_t prevented,
                                   const ConfirmLookupCounts& times) {
  add_nonzero(confirm_lookups_, lookups);
  add_nonzero(confirm_prevented_, prevented);
  observe_multiple(*confirm_seconds_, times);
}

void PartitionMetrics::set_confirm_store_bytes(std::uint64_t bytes) noexcept {
  gauges_->confirm_bytes.store(bytes, std::memory_order_relaxed);
}

void PartitionMetrics::set_queue_depth(std::uint64_t records) noexcept {
  gauges_->queue_depth.store(records, std::memory_order_relaxed);
}

void PartitionMetrics::set_parked(bool parked, std::uint64_t unparks) {
  gauges_->parked.store(parked ? 1 : 0, std::memory_order_relaxed);
  add_nonzero(unparks_, unparks);
}

void PartitionMetrics::add_audit(const AuditCounts& c) {
  add_nonzero(audit_sampled_, c.sampled);
  add_nonzero(audit_truly_new_, c.truly_new);
  add_nonzero(audit_fp_, c.false_positives);
  add_nonzero(audit_fp_records_, c.false_positive_records);
  add_nonzero(audit_fn_, c.false_negatives);
}

void PartitionMetrics::snapshot_written(double seconds, std::uint64_t bytes) {
  snapshots_->Increment();
  add_nonzero(snapshot_bytes_, bytes);
  snapshot_seconds_->Observe(seconds);
  gauges_->last_snapshot.store(wall_seconds(), std::memory_order_relaxed);
}

void PartitionMetrics::snapshot_failed() { snapshot_failures_->Increment(); }

void PartitionMetrics::snapshot_current() noexcept {
  gauges_->last_snapshot.store(wall_seconds(), std::memory_order_relaxed);
}

void PartitionMetrics::restored(double seconds, std::uint64_t bytes) {
  restores_->Increment();
  add_nonzero(restore_bytes_, bytes);
  restore_seconds_->Observe(seconds);
}

void PartitionMetrics::rebuilt(std::uint64_t replayed_records) {
  rebuilds_->Increment();
  add_nonzero(replayed_, replayed_records);
}

void PartitionMetrics::add_replayed(std::uint64_t records) { add_nonzero(replayed_, records); }

void PartitionMetrics::snapshot_refused(std::string_view reason) {
  for (std::size_t i = 0; i < kSnapshotRefusalReasons.size(); ++i) {
    if (kSnapshotRefusalReasons[i] == reason) {
      refusals_[i]->Increment();
      return;
    }
  }
  // A reason this build does not list: still counted, under its own name.
  Labels labels{{"topic", topic_}, {"reason", std::string(reason)}};
  if (owner_.options_.per_partition) labels.emplace("partition", std::to_string(partition_));
  owner_.families_->snapshot_refusals.Add(labels).Increment();
}

// ---------------------------------------------------------------------------

Result<std::unique_ptr<Metrics>> Metrics::create(MetricsOptions options) {
  if (!(options.fpp_target > 0.0 && options.fpp_target < 1.0)) {
    return fail("metrics: fpp target must be in (0, 1), got " + std::to_string(options.fpp_target));
  }
  std::vector<std::string> reasons;
  for (const std::string& r : options.invalid_reasons) {
    if (!valid_reason(r)) {
      return fail("metrics: invalid-record reason '" + r + "' must match [a-z0-9_]+");
    }
    if (std::find(reasons.begin(), reasons.end(), r) != reasons.end()) {
      return fail("metrics: invalid-record reason '" + r + "' is listed twice");
    }
    reasons.push_back(r);
  }
  if (std::find(reasons.begin(), reasons.end(), "other") == reasons.end()) {
    reasons.push_back("other");
  }
  if (reasons.size() > kMaxInvalidReasons) {
    return fail("metrics: at most " + std::to_string(kMaxInvalidReasons - 1) +
                " invalid-record reasons can be counted separately, got " +
                std::to_string(options.invalid_reasons.size()));
  }
  return std::unique_ptr<Metrics>(new Metrics(std::move(options), std::move(reasons)));
}

Metrics::Metrics(MetricsOptions options, std::vector<std::string> reasons)
    : options_(std::move(options)),
      reasons_(std::move(reasons)),
      registry_(std::make_shared<prometheus::Registry>()),
      families_(std::make_unique<Families>(*registry_)),
      health_(options_.heartbeat_timeout),
      load_window_start_(std::chrono::steady_clock::now()) {
  families_->fpp_target.Set(options_.fpp_target);
  families_->fpp_effective_target.Set(options_.fpp_target);
  families_->build_info.Add({{"version", version()}, {"revision", revision()}}).Set(1.0);
}

Metrics::~Metrics() = default;

std::unique_ptr<PartitionMetrics> Metrics::partition(std::string_view topic,
                                                     std::int32_t partition) {
  std::unique_ptr<PartitionMetrics> handle(
      new PartitionMetrics(*this, std::string(topic), partition));
  std::lock_guard lock(mu_);
  gauges_.push_back(handle->gauges_);
  return handle;
}

void Metrics::drop_gauges(const PartitionMetrics::Gauges* g) {
  std::lock_guard lock(mu_);
  std::erase_if(gauges_, [g](const auto& p) { return p.get() == g; });
}

std::size_t Metrics::reason_index(std::string_view reason) const noexcept {
  std::size_t other = 0;
  for (std::size_t i = 0; i < reasons_.size(); ++i) {
    if (reasons_[i] == reason) return i;
    if (reasons_[i] == "other") other = i;
  }
  return other;
}

void Metrics::apply_statistics(const ClientStatistics& stats) {
  if (stats.type == "producer") {
    families_->producer_queue_messages.Set(static_cast<double>(stats.msg_cnt));
    families_->producer_queue_bytes.Set(static_cast<double>(stats.msg_size));
  } else if (stats.type == "consumer") {
    std::lock_guard lock(mu_);
    lags_ = stats.lags;
  }
}

void Metrics::add_delivery_errors(std::string_view topic, std::uint64_t n) {
  families_->delivery_errors.Add({{"topic", std::string(topic)}}).Increment(static_cast<double>(n));
}

void Metrics::add_rebalance() { families_->rebalances.Increment(); }

void Metrics::add_transactions(std::uint64_t committed, std::uint64_t aborted,
                               std::uint64_t records_committed, std::uint64_t records_discarded) {
  add_nonzero(&families_->transactions_committed, committed);
  add_nonzero(&families_->transactions_aborted, aborted);
  add_nonzero(&families_->transaction_records_committed, records_committed);
  add_nonzero(&families_->transaction_records_discarded, records_discarded);
}

void Metrics::add_repartition(const RepartitionCounts& counts) {
  add_nonzero(&families_->repartition_in, counts.in);
  add_nonzero(&families_->repartition_out, counts.repartitioned);
  add_nonzero(&families_->repartition_dlq, counts.dead_lettered);
  add_nonzero(&families_->repartition_dropped, counts.dropped);
  add_nonzero(&families_->repartition_passed, counts.passed);
}

void Metrics::set_repartition(std::int64_t lag_records, std::int64_t assigned_partitions) {
  families_->repartition_lag.Set(static_cast<double>(lag_records));
  families_->repartition_assigned.Set(static_cast<double>(assigned_partitions));
}

void Metrics::set_assigned_partitions(std::int64_t n) {
  families_->assigned.Set(static_cast<double>(n));
}

void Metrics::set_workers(std::int64_t n) { families_->workers.Set(static_cast<double>(n)); }

void Metrics::set_memory(std::uint64_t budget_bytes, std::uint64_t used_bytes,
                         double effective_fpp) {
  families_->memory_budget.Set(static_cast<double>(budget_bytes));
  families_->memory_used.Set(static_cast<double>(used_bytes));
  if (effective_fpp > 0.0) families_->fpp_effective_target.Set(effective_fpp);
}

void Metrics::add_busy_seconds(double seconds) {
  if (seconds > 0.0) families_->busy_seconds.Increment(seconds);
}

// ---------------------------------------------------------------------------
// Scrape-time gauges.

namespace {

prometheus::ClientMetric gauge_sample(
    const std::vector<std::pair<std::string, std::string>>& labels, double value) {
  prometheus::ClientMetric m;
  for (const auto& [name, v] : labels) m.label.push_back({name, v});
  m.gauge.value = value;
  return m;
}

prometheus::MetricFamily gauge_family(std::string name, std::string help) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = prometheus::MetricType::Gauge;
  return f;
}

// One series' worth of partition gauges, aggregated over the partitions that
// map to it (one partition per series unless per_partition is off).
struct GaugeAggregate {
  double fpp = 0.0;
  std::uint64_t cells = 0;
  std::uint64_t live_cells = 0;
  std::uint64_t subfilters = 0;
  std::uint64_t bytes = 0;
  double clock_lag = 0.0;
  double clock_ahead = 0.0;
  std::uint64_t queue_depth = 0;
  std::uint64_t parked = 0;
  std::uint64_t confirm_bytes = 0;
  double last_snapshot = std::numeric_limits<double>::infinity();
};

using SeriesKey = std::pair<std::string, std::int32_t>;

// The consumer's statistics into the series: its lags, and the records it
// fetched that no worker took yet (each worker reads its own queue) into
// the queue depth of the partitions this member holds.
void add_statistics(const std::vector<PartitionLag>& lags, bool per_partition,
                    std::map<SeriesKey, GaugeAggregate>& series,
                    std::map<SeriesKey, std::int64_t>& lag_series) {
  for (const PartitionLag& l : lags) {
    const SeriesKey key{l.topic, per_partition ? l.partition : -1};
    if (l.consumer_lag >= 0) lag_series[key] += l.consumer_lag;
    if (auto it = series.find(key); it != series.end()) {
      it->second.queue_depth += static_cast<std::uint64_t>(l.unread);
    }
  }
}

}  // namespace

void Metrics::refresh_load_shares() {
  // Load fairness over this instance's slices (seed 000 §7): the records
  // each slice received during the last completed interval. Until the
  // first interval completes, the loads since start are shown.
  constexpr auto r = std::memory_order_relaxed;
  const auto now = std::chrono::steady_clock::now();
  std::vector<double> loads;
  for (const auto& g : gauges_) {
    loads.push_back(static_cast<double>(g->records_in.load(r) - g->window_start_records));
  }
  const bool interval_over = now - load_window_start_ >= options_.load_interval;
  if (interval_over || !load_window_done_) {
    fairness_ = jain_fairness(loads);
    max_share_ = max_share(loads);
  }
  if (interval_over) {
    for (const auto& g : gauges_) g->window_start_records = g->records_in.load(r);
    load_window_start_ = now;
    load_window_done_ = true;
  }
}

std::vector<prometheus::MetricFamily> Metrics::collect_gauges() {
  using LabelList = std::vector<std::pair<std::string, std::string>>;
  const bool per_partition = options_.per_partition;
  auto labels_for = [per_partition](const std::string& topic, std::int32_t partition) {
    LabelList l{{"topic", topic}};
    if (per_partition) l.emplace_back("partition", std::to_string(partition));
    return l;
  };

  std::map<SeriesKey, GaugeAggregate> series;
  std::map<SeriesKey, std::int64_t> lag_series;
  {
    std::lock_guard lock(mu_);
    constexpr auto r = std::memory_order_relaxed;
    for (const auto& g : gauges_) {
      GaugeAggregate& a = series[{g->topic, per_partition ? g->partition : -1}];
      a.fpp = std::max(a.fpp, g->fpp.load(r));
      a.cells += g->cells.load(r);
      a.live_cells += g->live_cells.load(r);
      a.subfilters += g->subfilters.load(r);
      a.bytes += g->bytes.load(r);
      a.clock_lag = std::max(a.clock_lag, g->clock_lag.load(r));
      a.clock_ahead = std::max(a.clock_ahead, g->clock_ahead.load(r));
      a.queue_depth += g->queue_depth.load(r);
      a.parked += g->parked.load(r);
      a.confirm_bytes += g->confirm_bytes.load(r);
      a.last_snapshot = std::min(a.last_snapshot, g->last_snapshot.load(r));
    }
    add_statistics(lags_, per_partition, series, lag_series);

    refresh_load_shares();
  }

  auto fpp = gauge_family("kdedup_filter_fpp_estimate",
                          "Estimated false-positive probability of the partition's filter now "
                          "(max over partitions when aggregated).");
  auto fill =
      gauge_family("kdedup_filter_fill_ratio", "Live cells / cells of the partition's filter.");
  auto subfilters = gauge_family(
      "kdedup_filter_subfilters",
      "Sub-filters (timer filter), slices (aging filter) or tables (compact filter) alive.");
  auto bytes = gauge_family("kdedup_filter_bytes", "Memory held by filter state.");
  auto clock_lag = gauge_family("kdedup_filter_clock_lag_seconds",
                                "Wall clock minus the partition's window clock; 0 when the "
                                "clock is ahead (max over partitions when aggregated).");
  auto clock_ahead = gauge_family("kdedup_filter_clock_ahead_seconds",
                                  "The partition's window clock minus wall clock; 0 when the "
                                  "clock trails (max over partitions when aggregated).");
  auto queue = gauge_family("kdedup_queue_depth",
                            "Records fetched for the partition that its worker has not processed.");
  auto parked = gauge_family("kdedup_filter_parked",
                             "1 while the partition's filter is parked (state.park_after): "
                             "in the snapshot store only, or none yet for a partition that "
                             "has had no record since it was assigned; no memory held (sum "
                             "when aggregated).");
  auto confirm_bytes = gauge_family("kdedup_confirm_store_bytes",
                                    "Confirmed mode: approximate bytes of the partition's "
                                    "entries in the confirm store on disk (sum when "
                                    "aggregated); 0 without confirmed mode.");
  auto snapshot = gauge_family("kdedup_snapshot_last_success_timestamp_seconds",
                               "Unix time of the last successful snapshot (assignment time "
                               "until the first; min over partitions when aggregated).");
  for (const auto& [key, a] : series) {
    const LabelList l = labels_for(key.first, key.second);
    fpp.metric.push_back(gauge_sample(l, a.fpp));
    const double ratio =
        a.cells == 0 ? 0.0 : static_cast<double>(a.live_cells) / static_cast<double>(a.cells);
    fill.metric.push_back(gauge_sample(l, ratio));
    subfilters.metric.push_back(gauge_sample(l, static_cast<double>(a.subfilters)));
    bytes.metric.push_back(gauge_sample(l, static_cast<double>(a.bytes)));
    clock_lag.metric.push_back(gauge_sample(l, a.clock_lag));
    clock_ahead.metric.push_back(gauge_sample(l, a.clock_ahead));
    queue.metric.push_back(gauge_sample(l, static_cast<double>(a.queue_depth)));
    parked.metric.push_back(gauge_sample(l, static_cast<double>(a.parked)));
    confirm_bytes.metric.push_back(gauge_sample(l, static_cast<double>(a.confirm_bytes)));
    snapshot.metric.push_back(gauge_sample(l, a.last_snapshot));
  }
  auto lag = gauge_family("kdedup_consumer_lag",
                          "Records between the partition's end and the committed offset.");
  for (const auto& [key, value] : lag_series) {
    lag.metric.push_back(
        gauge_sample(labels_for(key.first, key.second), static_cast<double>(value)));
  }
  auto fairness = gauge_family("kdedup_load_fairness_index",
                               "Jain's fairness index of records per slice over the last "
                               "interval: 1 = even, 1/S = one slice takes all.");
  fairness.metric.push_back(gauge_sample({}, fairness_));
  auto share = gauge_family("kdedup_load_max_share",
                            "Share of the records taken by the busiest slice over the last "
                            "interval (optimum 1/S).");
  share.metric.push_back(gauge_sample({}, max_share_));
  auto ready = gauge_family("kdedup_ready", "1 when /readyz answers 200, else 0.");
  ready.metric.push_back(gauge_sample({}, health_.ready() ? 1.0 : 0.0));
  auto heartbeat = gauge_family("kdedup_heartbeat_age_seconds",
                                "Time since the main loop last beat (/healthz fails past the "
                                "timeout).");
  heartbeat.metric.push_back(gauge_sample({}, health_.heartbeat_age_seconds()));

  std::vector<prometheus::MetricFamily> out;
  for (auto* f : {&fpp, &fill, &subfilters, &bytes, &clock_lag, &clock_ahead, &queue, &parked,
                  &confirm_bytes, &snapshot, &lag, &fairness, &share, &ready, &heartbeat}) {
    out.push_back(std::move(*f));
  }
  return out;
}

std::vector<prometheus::MetricFamily> Metrics::collect() {
  std::vector<prometheus::MetricFamily> out = registry_->Collect();
  std::vector<prometheus::MetricFamily> gauges = collect_gauges();
  std::move(gauges.begin(), gauges.end(), std::back_inserter(out));
  return out;
}

std::string Metrics::scrape() {
  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, collect());
  return text.str();
}

}  // namespace kdedup::metrics
