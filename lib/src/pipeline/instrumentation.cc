#include "kdedup/pipeline/instrumentation.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "kdedup/metrics/stats_json.h"

namespace kdedup::pipeline {

namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

std::int64_t system_wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Counter delta that survives a counter starting over (a new Slice after a
/// revoke and re-assign between two readings): then the new value is the
/// whole delta.
std::uint64_t delta(std::uint64_t now, std::uint64_t before) {
  return now >= before ? now - before : now;
}

}  // namespace

// ---------------------------------------------------------------------------

void FilterProbe::publish(const filter::FilterStats& s) noexcept {
  bytes.store(s.bytes, kRelaxed);
  cells.store(s.cells, kRelaxed);
  live_cells.store(s.live_cells, kRelaxed);
  subfilters.store(s.subfilters, kRelaxed);
  insertions.store(s.insertions, kRelaxed);
  fpp_estimate.store(s.fpp_estimate, kRelaxed);
  published.store(true, std::memory_order_release);
}

filter::FilterStats FilterProbe::read() const noexcept {
  filter::FilterStats s;
  s.bytes = bytes.load(kRelaxed);
  s.cells = cells.load(kRelaxed);
  s.live_cells = live_cells.load(kRelaxed);
  s.subfilters = subfilters.load(kRelaxed);
  s.insertions = insertions.load(kRelaxed);
  s.fpp_estimate = fpp_estimate.load(kRelaxed);
  return s;
}

// ---------------------------------------------------------------------------

AuditedFilter::AuditedFilter(std::unique_ptr<filter::SlidingFilter> inner,
                             std::optional<metrics::AuditSampler> sampler,
                             std::shared_ptr<metrics::PartitionMetrics> metrics,
                             std::shared_ptr<FilterProbe> probe, std::uint32_t stats_every)
    : inner_(std::move(inner)),
      sampler_(std::move(sampler)),
      metrics_(std::move(metrics)),
      probe_(std::move(probe)),
      stats_every_(std::max<std::uint32_t>(1, stats_every)) {
  // The gauges exist from assignment on, before the first record.
  publish_stats();
}

filter::Decision AuditedFilter::test_and_insert(const filter::Fingerprint& fp, filter::Tick now) {
  const filter::Decision d = inner_->test_and_insert(fp, now);
  if (sampler_ && sampler_->selects(fp)) sampler_->observe(fp, d, now);
  after_batch();
  return d;
}

void AuditedFilter::test_and_insert_batch(std::span<const filter::Fingerprint> fps,
                                          std::span<const filter::Tick> ticks,
                                          std::span<filter::Decision> out) {
  inner_->test_and_insert_batch(fps, ticks, out);
  if (sampler_) {
    // selects() is a few multiplies; only the audited 1/N reach the shadow
    // set, in order, so its ticks stay non-decreasing like the filter's.
    for (std::size_t i = 0; i < fps.size(); ++i) {
      if (sampler_->selects(fps[i])) sampler_->observe(fps[i], out[i], ticks[i]);
    }
  }
  after_batch();
}

void AuditedFilter::insert(const filter::Fingerprint& fp, filter::Tick now) {
  inner_->insert(fp, now);
  if (sampler_) sampler_->record_delivery(fp, now);
}

void AuditedFilter::after_batch() {
  if (sampler_) {
    const metrics::AuditCounts c = sampler_->drain();
    if (c.sampled != 0) metrics_->add_audit(c);
  }
  // stats() walks sub-filter headers (cheap, but not free): refresh the
  // gauges every few batches or once a second, whichever comes first.
  if (++batches_since_stats_ < stats_every_) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_stats_ < std::chrono::seconds(1)) return;
  }
  publish_stats();
}

void AuditedFilter::flush() {
  if (batches_since_stats_ != 0 && inner_) publish_stats();
}

std::unique_ptr<filter::SlidingFilter> AuditedFilter::exchange_wrapped(
    std::unique_ptr<filter::SlidingFilter> inner) {
  std::unique_ptr<filter::SlidingFilter> held = std::move(inner_);
  inner_ = std::move(inner);
  if (inner_) {
    publish_stats();
  } else if (held) {
    filter::FilterStats s;
    s.fpp_estimate = held->stats().fpp_estimate;
    batches_since_stats_ = 0;
    probe_->publish(s);
  }
  return held;
}

void AuditedFilter::publish_stats() {
  batches_since_stats_ = 0;
  last_stats_ = std::chrono::steady_clock::now();
  probe_->publish(inner_->stats());
}

// ---------------------------------------------------------------------------

Instrumentation::Instrumentation(metrics::Metrics& metrics, const config::Config& config)
    : metrics_(metrics), audit_one_in_(config.metrics.audit_sample) {}

SliceHooks Instrumentation::hooks() {
  SliceHooks h;
  h.make_slice = [this](const PartitionId& id, const SliceOptions& options, SliceStart start) {
    return make_slice(id, options, std::move(start));
  };
  h.on_statistics = [this](std::string_view json) { offer_statistics(json); };
  h.on_recovered = [this](const PartitionId& id, const RecoveryOutcome& outcome) {
    recovered(id, outcome);
  };
  h.on_snapshot = [this](const PartitionId& id, const Result<state::WriteReport>& result) {
    snapshot_written(id, result);
  };
  return h;
}

void Instrumentation::recovered(const PartitionId& id, const RecoveryOutcome& outcome) {
  auto entry = find(id);
  if (!entry) return;
  // A stored snapshot that was not used is counted whatever happened next
  // (rebuilt, or started fresh because nothing was committed); no snapshot
  // at all is not a refusal.
  if (outcome.snapshot_refusal && *outcome.snapshot_refusal != SnapshotRefusal::kMissing) {
    entry->metrics->snapshot_refused(to_string(*outcome.snapshot_refusal));
  }
  switch (outcome.reason) {
    case RecoveryReason::kRestored:
      entry->metrics->restored(outcome.seconds, outcome.restored_bytes);
      break;
    case RecoveryReason::kRebuildFromWindow:
    case RecoveryReason::kNoHistory:
      entry->metrics->rebuilt(0);  // replayed records are counted as they go
      break;
    case RecoveryReason::kFreshPartition:
      break;  // nothing was lost: a partition this group never committed
  }
}

void Instrumentation::snapshot_written(const PartitionId& id,
                                       const Result<state::WriteReport>& result) {
  std::shared_ptr<metrics::PartitionMetrics> handle;
  if (auto entry = find(id)) handle = entry->metrics;
  if (!handle) handle = metrics_.partition(id.topic, id.partition);
  if (result) {
    handle->snapshot_written(std::chrono::duration<double>(result->write_time).count(),
                             result->bytes_written);
  } else {
    handle->snapshot_failed();
  }
}

Result<std::unique_ptr<Slice>> Instrumentation::make_slice(const PartitionId& id,
                                                           const SliceOptions& options,
                                                           SliceStart start) {
  Entry entry;
  entry.metrics = metrics_.partition(id.topic, id.partition);
  if (options.filter_enabled) entry.probe = std::make_shared<FilterProbe>();
  {
    std::lock_guard lock(mu_);
    entry.generation = next_generation_++;
    entries_[id] = entry;
  }
  if (!options.filter_enabled) {
    return std::make_unique<Slice>(id, options, nullptr, start.clock_ms, start.next_offset);
  }
  Result<std::unique_ptr<filter::SlidingFilter>> inner =
      start.filter ? Result<std::unique_ptr<filter::SlidingFilter>>(std::move(start.filter))
                   : filter::make_filter(options.filter);
  if (!inner) return fail(id.str() + ": cannot create the filter: " + inner.error().message);
  std::optional<metrics::AuditSampler> sampler;
  if (audit_one_in_ != 0) {
    auto s = metrics::AuditSampler::create((*inner)->config().ticks_per_window, audit_one_in_);
    if (!s) return fail(id.str() + ": metrics.audit_sample: " + s.error().message);
    sampler.emplace(std::move(*s));
  }
  auto audited = std::make_unique<AuditedFilter>(std::move(*inner), std::move(sampler),
                                                 entry.metrics, entry.probe);
  auto slice =
      std::make_unique<Slice>(id, options, std::move(audited), start.clock_ms, start.next_offset);
  if (slice->failure()) return fail(*slice->failure());
  return slice;
}

std::optional<Instrumentation::Entry> Instrumentation::find(const PartitionId& id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void Instrumentation::forget(const PartitionId& id) {
  std::shared_ptr<metrics::PartitionMetrics> last;  // released outside the lock
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  last = std::move(it->second.metrics);
  entries_.erase(it);
}

Instrumentation::Entry Instrumentation::ensure(const PartitionId& id) {
  {
    std::lock_guard lock(mu_);
    if (auto it = entries_.find(id); it != entries_.end()) return it->second;
  }
  Entry entry;
  entry.metrics = metrics_.partition(id.topic, id.partition);
  std::lock_guard lock(mu_);
  auto [it, inserted] = entries_.emplace(id, entry);
  if (inserted) it->second.generation = next_generation_++;
  return it->second;
}

void Instrumentation::offer_statistics(std::string_view json) {
  std::string copy(json);  // allocated outside the lock
  std::lock_guard lock(statistics_mu_);
  if (statistics_.size() >= kMaxPendingStatistics) statistics_.pop_front();
  statistics_.push_back(std::move(copy));
}

std::vector<std::string> Instrumentation::take_statistics() {
  std::lock_guard lock(statistics_mu_);
  std::vector<std::string> out(std::make_move_iterator(statistics_.begin()),
                               std::make_move_iterator(statistics_.end()));
  statistics_.clear();
  return out;
}

// ---------------------------------------------------------------------------

StatsBridge::StatsBridge(Instrumentation& instruments, Source source, std::string delivery_topic,
                         std::chrono::milliseconds period, WallClockMs wall_ms,
                         std::chrono::milliseconds loop_stale_after)
    : instruments_(instruments),
      source_(std::move(source)),
      delivery_topic_(std::move(delivery_topic)),
      period_(period),
      wall_ms_(wall_ms ? std::move(wall_ms) : WallClockMs(system_wall_ms)),
      loop_stale_after_(loop_stale_after) {
  // A labelled counter exists only once touched; start it at zero so
  // rate() and alerts see the series before the first failure.
  instruments_.metrics().add_delivery_errors(delivery_topic_, 0);
}

StatsBridge::~StatsBridge() { stop(); }

void StatsBridge::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void StatsBridge::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
    publish();  // the last counts before the process exits
  }
}

void StatsBridge::run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    publish();
    lock.lock();
    cv_.wait_for(lock, period_, [this] { return stopping_; });
  }
}

void StatsBridge::watch_repartition(std::function<RepartitionStats()> source,
                                    std::string internal_topic) {
  repartition_ = std::move(source);
  internal_topic_ = std::move(internal_topic);
  instruments_.metrics().add_delivery_errors(internal_topic_, 0);
}

void StatsBridge::publish_repartition() {
  if (!repartition_) return;
  const RepartitionStats now = repartition_();
  RepartitionStats& was = repartition_seen_;
  metrics::Metrics& m = instruments_.metrics();
  m.add_repartition({.in = now.in - was.in,
                     .repartitioned = now.repartitioned - was.repartitioned,
                     .dead_lettered = now.dead_lettered - was.dead_lettered,
                     .dropped = now.dropped - was.dropped,
                     .passed = now.passed - was.passed});
  if (now.delivery_errors != was.delivery_errors) {
    m.add_delivery_errors(internal_topic_, now.delivery_errors - was.delivery_errors);
  }
  m.set_repartition(now.lag, now.assigned);
  was = now;
}

void StatsBridge::publish() {
  publish_repartition();
  const PipelineStats s = source_();
  const std::int64_t wall = wall_ms_();
  publish_instance(s);

  std::set<PartitionId> present;
  std::uint64_t delivery_errors = 0;
  std::size_t not_restored = 0;
  for (const PartitionStats& p : s.partitions) {
    present.insert(PartitionId{p.topic, p.partition});
    if (p.restoring) ++not_restored;
    delivery_errors += publish_partition(p, wall);
  }
  metrics::Metrics& m = instruments_.metrics();
  if (delivery_errors != 0) m.add_delivery_errors(delivery_topic_, delivery_errors);

  // Revoked partitions: their gauges disappear, their counters stay.
  for (auto it = seen_.begin(); it != seen_.end();) {
    if (present.count(it->first)) {
      ++it;
      continue;
    }
    instruments_.forget(it->first);
    it = seen_.erase(it);
  }

  // Liveness: stats() answered (the pipeline's registry is not wedged) and
  // the consumer loop turned recently (-1: run() has not started it yet, so
  // startup is bounded by the app, not by this check).
  if (s.consumer_loop_age_ms < 0 ||
      std::chrono::milliseconds(s.consumer_loop_age_ms) <= loop_stale_after_) {
    m.health().beat();
  }
  if (!s.ready) {
    m.health().set_not_ready("joining the consumer group");
  } else if (not_restored != 0) {
    m.health().set_not_ready("restoring " + std::to_string(not_restored) + " of " +
                             std::to_string(s.partitions.size()) + " partitions");
  } else {
    m.health().set_ready();
  }
}

/// The librdkafka statistics documents and the instance-wide figures.
void StatsBridge::publish_instance(const PipelineStats& s) {
  metrics::Metrics& m = instruments_.metrics();
  // librdkafka statistics: parsed here, off the clients' poll threads.
  for (const std::string& json : instruments_.take_statistics()) {
    auto parsed = metrics::parse_statistics(json);
    if (!parsed) {
      ++statistics_rejected_;
      spdlog::debug("ignoring a librdkafka statistics document: {}", parsed.error().message);
      continue;
    }
    m.apply_statistics(*parsed);
  }

  for (std::uint64_t i = delta(s.rebalances, rebalances_); i > 0; --i) m.add_rebalance();
  rebalances_ = s.rebalances;
  // Transaction totals only grow for the pipeline's lifetime (all zero
  // unless delivery: transactional).
  const TransactionStats& t = s.transactions;
  m.add_transactions(delta(t.committed, transactions_.committed),
                     delta(t.aborted, transactions_.aborted),
                     delta(t.records_committed, transactions_.records_committed),
                     delta(t.records_aborted, transactions_.records_aborted));
  transactions_ = t;
  m.set_assigned_partitions(static_cast<std::int64_t>(s.assigned_partitions));
  m.set_memory(s.memory.max_bytes, s.memory.used_bytes, s.memory.effective_fpp);
  m.set_workers(static_cast<std::int64_t>(s.worker_busy_nanos.size()));
  busy_nanos_.resize(s.worker_busy_nanos.size(), 0);
  std::uint64_t busy = 0;
  for (std::size_t w = 0; w < s.worker_busy_nanos.size(); ++w) {
    busy += delta(s.worker_busy_nanos[w], busy_nanos_[w]);
    busy_nanos_[w] = s.worker_busy_nanos[w];
  }
  m.add_busy_seconds(static_cast<double>(busy) / 1e9);
}

/// One assigned partition's deltas since the last reading and its gauges;
/// returns its new delivery errors (labelled by the output topic, summed by
/// the caller).
std::uint64_t StatsBridge::publish_partition(const PartitionStats& p, std::int64_t wall) {
  metrics::Metrics& m = instruments_.metrics();
  PartitionId id{p.topic, p.partition};
  const Instrumentation::Entry entry = instruments_.ensure(id);
  Seen& seen = seen_[id];
  if (seen.generation != entry.generation) {
    // A new assignment: the pipeline's counters start over with its Slice.
    seen.generation = entry.generation;
    seen.last = PartitionStats{};
  }
  const PartitionStats& before = seen.last;

  metrics::BatchCounts c;
  c.in = delta(p.records_in, before.records_in);
  c.distinct = delta(p.distinct, before.distinct);
  c.duplicate = delta(p.duplicates, before.duplicates);
  c.dlq = delta(p.dead_lettered, before.dead_lettered);
  c.clock_capped = delta(p.clock_capped, before.clock_capped);
  c.no_timestamp = delta(p.no_timestamp, before.no_timestamp);
  for (const auto& [reason, n] : p.invalid_reasons) {
    auto it = before.invalid_reasons.find(reason);
    c.invalid[m.reason_index(reason)] +=
        delta(n, it == before.invalid_reasons.end() ? 0 : it->second);
  }
  entry.metrics->add_batch(c);
  // The latency histograms: the workers count into the same buckets as the
  // Prometheus histograms, so the delta since the last reading is exactly
  // the observations made in between, each in its own bucket.
  entry.metrics->add_batch_times(p.batch_times.since(before.batch_times));
  entry.metrics->add_emit_ages(p.emit_ages.since(before.emit_ages));
  const std::uint64_t delivery_errors = delta(p.delivery_errors, before.delivery_errors);
  entry.metrics->add_replayed(delta(p.replayed, before.replayed));
  entry.metrics->add_confirm(delta(p.confirm.lookups, before.confirm.lookups),
                             delta(p.confirm.prevented, before.confirm.prevented),
                             p.confirm.lookup_times.since(before.confirm.lookup_times));
  entry.metrics->set_confirm_store_bytes(p.confirm.store_bytes);

  // Clock lag is wall clock minus the partition clock, negative when the
  // clock is ahead (records stamped up to max_future_skew in the future);
  // before the first record there is no clock, so 0 rather than ~56 years.
  const double lag = p.clock_ms > 0 ? static_cast<double>(wall - p.clock_ms) / 1e3 : 0.0;
  if (entry.probe && entry.probe->published.load(std::memory_order_acquire)) {
    entry.metrics->set_filter(entry.probe->read(), lag);
  } else {
    filter::FilterStats fs;  // passthrough: no filter state
    fs.bytes = p.filter_bytes;
    fs.subfilters = p.filter_subfilters;
    fs.fpp_estimate = p.filter_fpp_estimate;
    entry.metrics->set_filter(fs, lag);
  }
  entry.metrics->set_queue_depth(p.queued);
  entry.metrics->set_parked(p.parked, delta(p.unparks, before.unparks));
  if (p.snapshot_current) entry.metrics->snapshot_current();
  seen.last = p;
  return delivery_errors;
}

}  // namespace kdedup::pipeline
