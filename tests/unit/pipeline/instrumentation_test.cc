// AuditedFilter (same decisions as the filter it wraps, confirmed false
// positives counted, snapshots of the real filter) and StatsBridge (counter
// deltas, revocation, re-assignment, health) against a fake stats source.

#include "kdedup/pipeline/instrumentation.h"

#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <algorithm>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace kdedup::pipeline {
namespace {

using LabelMap = std::map<std::string, std::string>;
using filter::Decision;
using filter::Fingerprint;
using filter::Tick;

const prometheus::ClientMetric* find_sample(const std::vector<prometheus::MetricFamily>& families,
                                            const std::string& name, const LabelMap& labels) {
  for (const auto& f : families) {
    if (f.name != name) continue;
    for (const auto& m : f.metric) {
      LabelMap got;
      for (const auto& l : m.label) got[l.name] = l.value;
      if (got == labels) return &m;
    }
  }
  return nullptr;
}

double value(metrics::Metrics& m, const std::string& name, const LabelMap& labels = {}) {
  const auto fs = m.collect();
  const auto* s = find_sample(fs, name, labels);
  if (s == nullptr) return -1.0;
  // Counters, gauges and histograms keep their figure in different fields.
  if (s->counter.value != 0.0) return s->counter.value;
  if (s->gauge.value != 0.0) return s->gauge.value;
  return static_cast<double>(s->histogram.sample_count);
}

std::unique_ptr<metrics::Metrics> make_metrics() {
  auto m = metrics::Metrics::create({});
  EXPECT_TRUE(m) << m.error().message;
  return std::move(*m);
}

std::unique_ptr<filter::SlidingFilter> make(filter::FilterConfig c) {
  auto f = filter::make_filter(c);
  EXPECT_TRUE(f) << f.error().message;
  return std::move(*f);
}

/// A stream over `ids` distinct identities (so about half repeat), ticks
/// advancing slowly.
std::vector<Fingerprint> stream(std::size_t n, std::uint64_t ids, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Fingerprint> out;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t id = rng() % ids;
    out.push_back({id * 0x9E3779B97F4A7C15ULL + 1, (id + 7) * 0xC2B2AE3D27D4EB4FULL});
  }
  return out;
}

struct Audited {
  std::unique_ptr<metrics::Metrics> metrics = make_metrics();
  std::shared_ptr<FilterProbe> probe = std::make_shared<FilterProbe>();
  std::unique_ptr<AuditedFilter> filter;

  Audited(const filter::FilterConfig& c, std::uint32_t one_in) {
    auto sampler = metrics::AuditSampler::create(make(c)->config().ticks_per_window, one_in);
    EXPECT_TRUE(sampler) << sampler.error().message;
    filter = std::make_unique<AuditedFilter>(make(c), std::move(*sampler),
                                             std::shared_ptr(metrics->partition("in", 0)), probe,
                                             /*stats_every=*/4);
  }
};

TEST(AuditedFilter, DecidesExactlyLikeTheFilterItWraps) {
  filter::FilterConfig c;  // timer filter
  c.capacity = 2'000;
  Audited audited(c, 1);
  auto plain = make(c);
  const auto fps = stream(20'000, 3'000, 1);
  std::vector<Tick> ticks(fps.size());
  for (std::size_t i = 0; i < fps.size(); ++i) ticks[i] = i / 500;

  std::size_t duplicates = 0;
  for (std::size_t at = 0; at < fps.size(); at += 256) {
    const std::size_t n = std::min<std::size_t>(256, fps.size() - at);
    std::vector<Decision> a(n), b(n);
    const std::span<const Fingerprint> f(fps.data() + at, n);
    const std::span<const Tick> t(ticks.data() + at, n);
    if ((at / 256) % 2 == 0) {
      audited.filter->test_and_insert_batch(f, t, a);
      plain->test_and_insert_batch(f, t, b);
    } else {  // the single-record path too
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = audited.filter->test_and_insert(f[i], t[i]);
        b[i] = plain->test_and_insert(f[i], t[i]);
      }
    }
    ASSERT_EQ(a, b) << "batch at " << at;
    for (auto d : a) duplicates += d == Decision::kDuplicate;
  }
  EXPECT_GT(duplicates, 5'000u);
  EXPECT_EQ(audited.filter->stats().insertions, plain->stats().insertions);
  EXPECT_EQ(audited.filter->type(), plain->type());
  // Every decision was audited (N = 1) and pushed to the partition's series.
  EXPECT_EQ(audited.filter->audit_totals()->sampled, fps.size());
  EXPECT_EQ(
      value(*audited.metrics, "kdedup_audit_sampled_total", {{"topic", "in"}, {"partition", "0"}}),
      static_cast<double>(fps.size()));
  EXPECT_EQ(audited.probe->read().insertions, plain->stats().insertions);
}

TEST(AuditedFilter, FlushReportsWhatTheLastBatchLeftUnreported) {
  // Statistics are copied every 4 batches or a second apart, after a batch:
  // a partition's last batch before it goes quiet would stay unreported
  // (kdedup_filter_bytes showed the size before a growth for as long as no
  // record came). The owner's flush(), once a second, copies them.
  filter::FilterConfig c;  // timer filter
  c.capacity = 2'000;
  Audited audited(c, 1);
  const auto fps = stream(256, 1'000'000, 2);
  const std::vector<Tick> ticks(fps.size(), 0);
  std::vector<Decision> out(fps.size());
  audited.filter->test_and_insert_batch(fps, ticks, out);
  const std::uint64_t inserted = audited.filter->stats().insertions;
  ASSERT_GT(inserted, 0U);
  EXPECT_EQ(audited.probe->read().insertions, 0U);  // as published at construction
  audited.filter->flush();
  EXPECT_EQ(audited.probe->read().insertions, inserted);
  EXPECT_EQ(audited.probe->read().bytes, audited.filter->stats().bytes);
}

TEST(AuditedFilter, CountsConfirmedFalsePositivesOfATinyFilter) {
  filter::FilterConfig c;
  c.type = filter::FilterType::kAging;
  c.capacity = 16;  // far too small for what follows: it saturates
  c.fpp = 0.1;
  Audited audited(c, 1);
  // Only distinct identities: every "duplicate" is a false positive.
  std::vector<Fingerprint> fps;
  for (std::uint64_t i = 0; i < 4'000; ++i) {
    fps.push_back({i * 0x9E3779B97F4A7C15ULL + 3, i * 0xD6E8FEB86659FD93ULL + 5});
  }
  std::vector<Tick> ticks(fps.size(), 1);
  std::vector<Decision> out(fps.size());
  audited.filter->test_and_insert_batch(fps, ticks, out);
  const auto fp =
      static_cast<std::uint64_t>(std::count(out.begin(), out.end(), Decision::kDuplicate));
  ASSERT_GT(fp, 100u) << "the filter was meant to saturate";
  const auto& totals = *audited.filter->audit_totals();
  EXPECT_EQ(totals.false_positives, fp);
  EXPECT_EQ(totals.truly_new, fps.size());
  EXPECT_EQ(totals.false_negatives, 0u);
  const LabelMap l{{"topic", "in"}, {"partition", "0"}};
  EXPECT_EQ(value(*audited.metrics, "kdedup_audit_false_positives_total", l),
            static_cast<double>(fp));
  EXPECT_EQ(value(*audited.metrics, "kdedup_audit_truly_new_total", l),
            static_cast<double>(fps.size()));
}

TEST(AuditedFilter, SerializesTheInnerFilter) {
  filter::FilterConfig c;
  c.type = filter::FilterType::kExact;
  Audited audited(c, 1);
  auto plain = make(c);
  const auto fps = stream(1'000, 400, 2);
  for (std::size_t i = 0; i < fps.size(); ++i) {
    (void)audited.filter->test_and_insert(fps[i], i / 100);
    (void)plain->test_and_insert(fps[i], i / 100);
  }
  const std::string blob = audited.filter->serialize();
  EXPECT_EQ(blob, plain->serialize());
  auto restored = filter::restore_filter(blob);
  ASSERT_TRUE(restored) << restored.error().message;
  EXPECT_EQ((*restored)->type(), filter::FilterType::kExact);
  EXPECT_EQ(dynamic_cast<AuditedFilter*>(restored->get()), nullptr);
  EXPECT_EQ((*restored)->stats().insertions, plain->stats().insertions);
}

/// An Instrumentation auditing one record in 8, and the options of the
/// Slices it makes: a 60 s window.
class Instrumented : public ::testing::Test {
 protected:
  Instrumented() {
    o.window_ms = 60'000;
    o.filter.type = filter::FilterType::kExact;
  }
  std::unique_ptr<metrics::Metrics> m = make_metrics();
  config::Config cfg = [] {
    config::Config c;
    c.metrics.audit_sample = 8;
    return c;
  }();
  Instrumentation inst{*m, cfg};
  SliceOptions o;
};

TEST_F(Instrumented, MakeSliceWrapsTheFilterOnlyWhenThereIsOne) {
  auto slice = inst.hooks().make_slice(PartitionId{"in", 2}, o, SliceStart{});
  ASSERT_TRUE(slice) << slice.error().message;
  EXPECT_NE(dynamic_cast<const AuditedFilter*>((*slice)->filter()), nullptr);
  EXPECT_EQ((*slice)->filter()->type(), filter::FilterType::kExact);
  // The Slice derives its tick from the (forwarded) config.
  EXPECT_EQ((*slice)->scale(),
            filter::TickScale(60'000, (*slice)->filter()->config().ticks_per_window));
  const auto first = inst.find(PartitionId{"in", 2});
  ASSERT_TRUE(first);
  EXPECT_NE(first->probe, nullptr);

  // The budget reaches the wrapped filter.
  o.memory = std::make_shared<filter::MemoryBudget>();
  auto budgeted = inst.make_slice(PartitionId{"in", 3}, o);
  ASSERT_TRUE(budgeted);
  EXPECT_GT(o.memory->used(), 0U);
  budgeted->reset();
  EXPECT_EQ(o.memory->used(), 0U);

  o.filter_enabled = false;
  auto passthrough = inst.make_slice(PartitionId{"in", 2}, o);
  ASSERT_TRUE(passthrough);
  EXPECT_EQ((*passthrough)->filter(), nullptr);
  const auto second = inst.find(PartitionId{"in", 2});
  ASSERT_TRUE(second);
  EXPECT_GT(second->generation, first->generation);
  EXPECT_EQ(second->probe, nullptr);
}

TEST_F(Instrumented, AParkedSliceKeepsItsWrapperAndPublishesNoBytes) {
  o.filter.type = filter::FilterType::kTimer;
  o.filter = *filter::normalize(o.filter);
  o.memory = std::make_shared<filter::MemoryBudget>();
  auto slice = inst.make_slice(PartitionId{"in", 4}, o);
  ASSERT_TRUE(slice) << slice.error().message;
  Slice& s = **slice;
  const auto fps = stream(1'000, 1'000'000, 3);
  std::vector<Tick> ticks(fps.size(), 5);
  std::vector<Decision> out(fps.size());
  s.decide(fps, ticks, out);
  const std::string saved = s.filter()->serialize();
  const auto probe = inst.find(PartitionId{"in", 4})->probe;
  s.check_quiet(0);  // flush(): the batch's statistics
  const auto busy = probe->read();
  ASSERT_GT(busy.bytes, 0U);
  ASSERT_GT(busy.fpp_estimate, 0.0);

  ASSERT_TRUE(s.park());
  EXPECT_EQ(o.memory->used(), 0U);
  EXPECT_EQ(probe->read().bytes, 0U);
  EXPECT_EQ(probe->read().subfilters, 0U);
  EXPECT_EQ(probe->read().fpp_estimate, busy.fpp_estimate) << "the parked state's answers";
  s.check_quiet(1'000'000);  // no flush, no quiet() on the empty wrapper

  auto restored = filter::restore_filter(saved);
  ASSERT_TRUE(restored);
  s.unpark(std::move(*restored));
  EXPECT_NE(dynamic_cast<const AuditedFilter*>(s.filter()), nullptr) << "still audited";
  EXPECT_EQ(probe->read().bytes, busy.bytes);
  EXPECT_GT(o.memory->used(), 0U);
  std::vector<Decision> again(fps.size());
  s.decide(fps, ticks, again);
  EXPECT_EQ(std::count(again.begin(), again.end(), Decision::kDuplicate),
            static_cast<std::ptrdiff_t>(fps.size()));
}

class BridgeTest : public ::testing::Test {
 protected:
  std::unique_ptr<metrics::Metrics> m = make_metrics();
  config::Config cfg;
  Instrumentation inst{*m, cfg};
  PipelineStats now;
  std::int64_t wall_ms = 1'700'000'010'000;
  StatsBridge bridge{inst, [this] { return now; }, "out", std::chrono::milliseconds(10),
                     [this] { return wall_ms; }};
  const LabelMap p0{{"topic", "in"}, {"partition", "0"}};

  PartitionStats& partition(std::int32_t p) {
    for (auto& s : now.partitions) {
      if (s.partition == p) return s;
    }
    PartitionStats s;
    s.topic = "in";
    s.partition = p;
    now.partitions.push_back(s);
    return now.partitions.back();
  }
};

TEST_F(BridgeTest, PublishesCounterDeltasOnce) {
  now.ready = true;
  now.rebalances = 1;
  now.assigned_partitions = 1;
  now.worker_busy_nanos = {500'000'000, 250'000'000};
  auto& p = partition(0);
  p.records_in = 10;
  p.distinct = 6;
  p.duplicates = 2;
  p.invalid = 2;
  p.dead_lettered = 2;
  p.invalid_reasons = {{"missing_key", 2}};
  for (int b = 0; b < 4; ++b) p.batch_times.observe(1'000'000);
  p.clock_ms = 1'700'000'000'000;
  bridge.publish();
  bridge.publish();  // nothing new: nothing added twice

  EXPECT_EQ(value(*m, "kdedup_records_in_total", p0), 10);
  EXPECT_EQ(value(*m, "kdedup_records_distinct_total", p0), 6);
  EXPECT_EQ(value(*m, "kdedup_records_duplicate_total", p0), 2);
  EXPECT_EQ(value(*m, "kdedup_records_dlq_total", p0), 2);
  EXPECT_EQ(value(*m, "kdedup_records_invalid_total",
                  {{"topic", "in"}, {"partition", "0"}, {"reason", "missing_key"}}),
            2);
  EXPECT_EQ(value(*m, "kdedup_batch_processing_seconds", {{"topic", "in"}}), 4);
  EXPECT_EQ(value(*m, "kdedup_consumer_rebalances_total"), 1);
  EXPECT_EQ(value(*m, "kdedup_consumer_assigned_partitions"), 1);
  EXPECT_EQ(value(*m, "kdedup_workers"), 2);
  EXPECT_DOUBLE_EQ(value(*m, "kdedup_worker_busy_seconds_total"), 0.75);
  EXPECT_DOUBLE_EQ(value(*m, "kdedup_filter_clock_lag_seconds", p0), 10.0);
  EXPECT_EQ(m->health().readiness().status, 200);
  EXPECT_EQ(m->health().liveness().status, 200);

  p.records_in = 15;
  p.distinct = 9;
  p.duplicates = 4;
  p.invalid_reasons = {{"missing_key", 2}, {"not_json", 1}};
  p.delivery_errors = 3;
  p.batch_times.observe(1'000'000);
  now.rebalances = 3;
  now.worker_busy_nanos = {600'000'000, 250'000'000};
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_records_in_total", p0), 15);
  EXPECT_EQ(value(*m, "kdedup_records_distinct_total", p0), 9);
  EXPECT_EQ(value(*m, "kdedup_records_duplicate_total", p0), 4);
  EXPECT_EQ(value(*m, "kdedup_records_invalid_total",
                  {{"topic", "in"}, {"partition", "0"}, {"reason", "not_json"}}),
            1);
  EXPECT_EQ(value(*m, "kdedup_producer_delivery_errors_total", {{"topic", "out"}}), 3);
  EXPECT_EQ(value(*m, "kdedup_batch_processing_seconds", {{"topic", "in"}}), 5);
  EXPECT_EQ(value(*m, "kdedup_consumer_rebalances_total"), 3);
  EXPECT_NEAR(value(*m, "kdedup_worker_busy_seconds_total"), 0.85, 1e-9);
}

// README: records capped at wall clock + max_future_skew "are counted", and
// a clock ahead of the wall clock shows as such, not as a lag of 0.
TEST_F(BridgeTest, ClockCappedAndUntimestampedRecordsAndAClockAheadAreExported) {
  now.ready = true;
  auto& p = partition(0);
  p.records_in = 10;
  p.clock_capped = 3;
  p.no_timestamp = 2;
  p.clock_ms = wall_ms + 45'000;  // records stamped in the future, capped at +skew
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_clock_capped_records_total", p0), 3);
  EXPECT_EQ(value(*m, "kdedup_clock_missing_timestamp_records_total", p0), 2);
  EXPECT_DOUBLE_EQ(value(*m, "kdedup_filter_clock_ahead_seconds", p0), 45.0);
  EXPECT_DOUBLE_EQ(value(*m, "kdedup_filter_clock_lag_seconds", p0), 0.0);

  p.clock_capped = 4;
  wall_ms += 60'000;  // the wall clock overtakes the partition clock
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_clock_capped_records_total", p0), 4);
  EXPECT_EQ(value(*m, "kdedup_clock_missing_timestamp_records_total", p0), 2);
  EXPECT_DOUBLE_EQ(value(*m, "kdedup_filter_clock_ahead_seconds", p0), 0.0);
  EXPECT_DOUBLE_EQ(value(*m, "kdedup_filter_clock_lag_seconds", p0), 15.0);
}

TEST_F(BridgeTest, RevokedPartitionsLoseTheirGaugesAndReassignedOnesStartOver) {
  now.ready = true;
  partition(0).records_in = 100;
  partition(1).records_in = 7;
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_filter_clock_lag_seconds", p0), 0.0);  // present; no clock yet

  // Partition 0 revoked: its gauges go, its counter stays.
  now.partitions.erase(now.partitions.begin());
  bridge.publish();
  EXPECT_EQ(find_sample(m->collect(), "kdedup_filter_bytes", p0), nullptr);
  EXPECT_EQ(value(*m, "kdedup_records_in_total", p0), 100);
  EXPECT_FALSE(inst.find(PartitionId{"in", 0}));

  // Re-assigned with fresh pipeline counters (a new Slice): they count from
  // zero again and the exported counter keeps growing.
  SliceOptions o;
  o.filter.type = filter::FilterType::kExact;
  ASSERT_TRUE(inst.make_slice(PartitionId{"in", 0}, o));
  partition(0).records_in = 30;
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_records_in_total", p0), 130);
  EXPECT_NE(find_sample(m->collect(), "kdedup_filter_bytes", p0), nullptr);
}

// Histogram samples of one topic's latency histograms, by name.
const prometheus::ClientMetric& histogram(metrics::Metrics& m, const std::string& name,
                                          std::vector<prometheus::MetricFamily>& keep) {
  keep = m.collect();
  const auto* s = find_sample(keep, name, {{"topic", "in"}});
  static const prometheus::ClientMetric none;
  EXPECT_NE(s, nullptr) << name;
  return s ? *s : none;
}

// What the exported histogram holds, as bucket counts (not cumulative) and
// the sum in seconds, to compare with what the worker counted.
template <const auto& Bounds>
std::vector<std::uint64_t> exported_buckets(const prometheus::ClientMetric& h) {
  std::vector<std::uint64_t> out;
  std::uint64_t below = 0;
  for (const auto& b : h.histogram.bucket) {
    out.push_back(b.cumulative_count - below);
    below = b.cumulative_count;
  }
  EXPECT_EQ(out.size(), Bounds.size() + 1);
  return out;
}

template <const auto& Bounds>
std::vector<std::uint64_t> as_vector(const metrics::DurationCounts<Bounds>& c) {
  return {c.buckets.begin(), c.buckets.end()};
}

TEST_F(BridgeTest, LatencyHistogramsGetEveryObservationOnceInItsBucket) {
  now.ready = true;
  // The worker's own counters (the real atomic histograms), read into stats
  // the way Pipeline::stats() does.
  auto counters = std::make_unique<PartitionCounters>();
  metrics::BatchTimeCounts batches_in;  // everything the worker observed
  metrics::EmitAgeCounts ages_in;
  auto work = [&](std::uint64_t batches, std::uint64_t seed) {
    for (std::uint64_t b = 0; b < batches; ++b) {
      // Batch times from 20 us to ~3 s, ages from 1 ms to ~2 h, with
      // exact bucket bounds among them.
      const std::uint64_t t = (seed * 7919 + b * 104'729) % 3'000'000'000 + 20'000;
      counters->batch_times.observe(t);
      batches_in.observe(t);
      metrics::EmitAgeCounts batch_ages;
      for (std::uint64_t r = 0; r < 3; ++r) {
        const std::uint64_t age =
            r == 0 ? 250'000'000 : (seed + b * 31 + r) * 1'000'000'007 % 7'200'000'000'000;
        batch_ages.observe(age);
        ages_in.observe(age);
      }
      counters->emit_ages.add(batch_ages);
    }
    auto& p = partition(0);
    p.batch_times = counters->batch_times.read();
    p.emit_ages = counters->emit_ages.read();
  };
  std::vector<prometheus::MetricFamily> keep;

  work(40, 1);
  bridge.publish();
  bridge.publish();  // nothing new: nothing observed twice
  {
    const auto& b = histogram(*m, "kdedup_batch_processing_seconds", keep);
    EXPECT_EQ(b.histogram.sample_count, 40u);
    EXPECT_EQ(exported_buckets<metrics::kBatchProcessingBounds>(b), as_vector(batches_in));
    EXPECT_NEAR(b.histogram.sample_sum, batches_in.sum_seconds(), 1e-6);
    const auto& a = histogram(*m, "kdedup_record_age_at_emit_seconds", keep);
    EXPECT_EQ(a.histogram.sample_count, 120u);
    EXPECT_EQ(exported_buckets<metrics::kEmitAgeBounds>(a), as_vector(ages_in));
    EXPECT_NEAR(a.histogram.sample_sum, ages_in.sum_seconds(), 1e-3);
  }

  work(25, 2);  // the next period
  bridge.publish();
  {
    const auto& b = histogram(*m, "kdedup_batch_processing_seconds", keep);
    EXPECT_EQ(b.histogram.sample_count, 65u);
    EXPECT_EQ(exported_buckets<metrics::kBatchProcessingBounds>(b), as_vector(batches_in));
    const auto& a = histogram(*m, "kdedup_record_age_at_emit_seconds", keep);
    EXPECT_EQ(a.histogram.sample_count, 195u);
    EXPECT_EQ(exported_buckets<metrics::kEmitAgeBounds>(a), as_vector(ages_in));
    EXPECT_NEAR(a.histogram.sample_sum, ages_in.sum_seconds(), 1e-3);
  }

  // Revoked, then re-assigned with a new Slice whose counters start at zero:
  // the exported histograms keep everything and add only the new batches.
  now.partitions.clear();
  bridge.publish();
  SliceOptions o;
  o.filter.type = filter::FilterType::kExact;
  ASSERT_TRUE(inst.make_slice(PartitionId{"in", 0}, o));
  counters = std::make_unique<PartitionCounters>();
  work(10, 3);
  bridge.publish();
  bridge.publish();
  {
    const auto& b = histogram(*m, "kdedup_batch_processing_seconds", keep);
    EXPECT_EQ(b.histogram.sample_count, 75u);
    EXPECT_EQ(exported_buckets<metrics::kBatchProcessingBounds>(b), as_vector(batches_in));
    const auto& a = histogram(*m, "kdedup_record_age_at_emit_seconds", keep);
    EXPECT_EQ(a.histogram.sample_count, 225u);
    EXPECT_EQ(exported_buckets<metrics::kEmitAgeBounds>(a), as_vector(ages_in));
  }
}

TEST_F(BridgeTest, ReadyOnceTheGroupAssignedEvenNothing) {
  bridge.publish();
  auto r = m->health().readiness();
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("joining the consumer group"), std::string::npos) << r.body;
  now.ready = true;  // first assignment callback, zero partitions
  bridge.publish();
  EXPECT_EQ(m->health().readiness().status, 200);
}

// Recovery: /readyz stays 503 while any partition replays; replayed records,
// restores (duration, bytes) and rebuilds reach their metrics; snapshot
// writes (also of a partition no longer assigned) and failures are counted.
TEST_F(BridgeTest, RestoringPartitionsKeepTheInstanceUnreadyAndRecoveryIsCounted) {
  now.ready = true;
  SliceOptions o;
  o.filter.type = filter::FilterType::kExact;
  ASSERT_TRUE(inst.make_slice(PartitionId{"in", 0}, o));
  ASSERT_TRUE(inst.make_slice(PartitionId{"in", 1}, o));
  partition(0).restoring = true;
  partition(0).replayed = 40;
  partition(1).restoring = true;
  bridge.publish();
  auto r = m->health().readiness();
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("restoring 2 of 2 partitions"), std::string::npos) << r.body;
  EXPECT_EQ(value(*m, "kdedup_rebuild_replayed_records_total", p0), 40);

  const SliceHooks hooks = inst.hooks();
  partition(0).restoring = false;
  partition(0).replayed = 100;
  RecoveryOutcome rebuilt;
  rebuilt.reason = RecoveryReason::kRebuildFromWindow;
  hooks.on_recovered(PartitionId{"in", 0}, rebuilt);
  bridge.publish();
  r = m->health().readiness();
  EXPECT_NE(r.body.find("restoring 1 of 2 partitions"), std::string::npos) << r.body;
  EXPECT_EQ(value(*m, "kdedup_rebuild_replayed_records_total", p0), 100);
  EXPECT_EQ(value(*m, "kdedup_rebuilds_total", p0), 1);

  const LabelMap p1{{"topic", "in"}, {"partition", "1"}};
  partition(1).restoring = false;
  RecoveryOutcome restored;
  restored.reason = RecoveryReason::kRestored;
  restored.seconds = 0.5;
  restored.restored_bytes = 4096;
  hooks.on_recovered(PartitionId{"in", 1}, restored);
  bridge.publish();
  EXPECT_EQ(m->health().readiness().status, 200);
  EXPECT_EQ(value(*m, "kdedup_restores_total", p1), 1);
  EXPECT_EQ(value(*m, "kdedup_restore_read_bytes_total", p1), 4096);
  EXPECT_EQ(value(*m, "kdedup_rebuilds_total", p1), 0);

  state::WriteReport written;
  written.bytes_written = 1000;
  written.write_time = std::chrono::milliseconds(20);
  hooks.on_snapshot(PartitionId{"in", 1}, written);
  hooks.on_snapshot(PartitionId{"in", 7}, written);  // already revoked
  hooks.on_snapshot(PartitionId{"in", 1}, fail("disk full"));
  EXPECT_EQ(value(*m, "kdedup_snapshots_total", p1), 1);
  EXPECT_EQ(value(*m, "kdedup_snapshot_written_bytes_total", p1), 1000);
  EXPECT_EQ(value(*m, "kdedup_snapshot_failures_total", p1), 1);
  EXPECT_EQ(value(*m, "kdedup_snapshots_total", {{"topic", "in"}, {"partition", "7"}}), 1);
}

TEST_F(BridgeTest, StatisticsFeedConsumerLagAndProducerQueueOffTheCallbackThread) {
  now.ready = true;
  const SliceHooks hooks = inst.hooks();
  ASSERT_TRUE(hooks.on_statistics);
  hooks.on_statistics(R"({"name": "rdkafka#consumer-1", "type": "consumer", "ts": 1,
    "topics": {"in": {"topic": "in", "partitions": {
      "0": {"partition": 0, "consumer_lag": 42},
      "-1": {"partition": -1, "consumer_lag": -1}}}}})");
  hooks.on_statistics(R"({"name": "rdkafka#producer-2", "type": "producer", "ts": 1,
    "msg_cnt": 37, "msg_size": 18432})");
  hooks.on_statistics("{not json");
  // Nothing is parsed on the caller's thread: the bridge does it.
  EXPECT_EQ(find_sample(m->collect(), "kdedup_consumer_lag", p0), nullptr);
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_consumer_lag", p0), 42);
  EXPECT_EQ(value(*m, "kdedup_producer_queue_messages"), 37);
  EXPECT_EQ(value(*m, "kdedup_producer_queue_bytes"), 18432);
  EXPECT_EQ(bridge.statistics_rejected(), 1u);
  EXPECT_TRUE(inst.take_statistics().empty());

  // A burst beyond the bound keeps the newest documents only.
  for (std::size_t i = 0; i < Instrumentation::kMaxPendingStatistics + 3; ++i) {
    inst.offer_statistics(std::to_string(i));
  }
  const auto kept = inst.take_statistics();
  ASSERT_EQ(kept.size(), Instrumentation::kMaxPendingStatistics);
  EXPECT_EQ(kept.back(), std::to_string(Instrumentation::kMaxPendingStatistics + 2));
}

TEST_F(BridgeTest, PublishesQueueDepthPerPartition) {
  now.ready = true;
  partition(0).queued = 123;
  partition(1).queued = 0;
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_queue_depth", p0), 123);
  partition(0).queued = 0;
  bridge.publish();
  const auto families = m->collect();
  const auto* s = find_sample(families, "kdedup_queue_depth", p0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->gauge.value, 0.0);
}

TEST_F(BridgeTest, PublishesParkedFiltersAndTheirUnparks) {
  now.ready = true;
  partition(0).parked = true;
  partition(1).parked = false;
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_filter_parked", p0), 1);
  EXPECT_EQ(value(*m, "kdedup_filter_parked", {{"topic", "in"}, {"partition", "1"}}), 0);
  partition(0).parked = false;
  partition(0).unparks = 2;
  bridge.publish();
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_filter_parked", p0), 0);
  EXPECT_EQ(value(*m, "kdedup_filter_unparks_total", p0), 2);
}

TEST_F(BridgeTest, ASnapshotCoveringEveryProcessedRecordIsNeverStale) {
  // The gauge starts at the assignment time; a partition whose stored
  // snapshot covers what it processed (quiet, parked) reads now.
  now.ready = true;
  partition(0).snapshot_current = false;
  partition(1).snapshot_current = false;
  bridge.publish();
  const LabelMap p1{{"topic", "in"}, {"partition", "1"}};
  const double assigned0 = value(*m, "kdedup_snapshot_last_success_timestamp_seconds", p0);
  const double assigned1 = value(*m, "kdedup_snapshot_last_success_timestamp_seconds", p1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  partition(1).snapshot_current = true;
  bridge.publish();
  EXPECT_GT(value(*m, "kdedup_snapshot_last_success_timestamp_seconds", p1), assigned1);
  EXPECT_EQ(value(*m, "kdedup_snapshot_last_success_timestamp_seconds", p0), assigned0)
      << "a partition with records its snapshot does not cover keeps its last write's time";
}

TEST(BridgeHeartbeat, BeatsOnlyWhileTheConsumerLoopTurns) {
  metrics::MetricsOptions o;
  o.heartbeat_timeout = std::chrono::milliseconds(50);
  auto created = metrics::Metrics::create(o);
  ASSERT_TRUE(created) << created.error().message;
  metrics::Metrics& m = **created;
  config::Config cfg;
  Instrumentation inst{m, cfg};
  PipelineStats now;
  now.ready = true;
  StatsBridge bridge{inst,
                     [&] { return now; },
                     "out",
                     std::chrono::milliseconds(10),
                     {},
                     /*loop_stale_after=*/std::chrono::seconds(10)};

  // Before run() starts the loop (-1), and while it turns, the bridge beats.
  bridge.publish();
  EXPECT_EQ(m.health().liveness().status, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  now.consumer_loop_age_ms = 5;
  bridge.publish();
  EXPECT_EQ(m.health().liveness().status, 200);

  // The loop is stuck: the bridge still answers but no longer beats, so
  // /healthz fails once the heartbeat timeout passed.
  now.consumer_loop_age_ms = 10'001;
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  bridge.publish();
  EXPECT_EQ(m.health().liveness().status, 503);

  now.consumer_loop_age_ms = 0;  // it turned again
  bridge.publish();
  EXPECT_EQ(m.health().liveness().status, 200);
}

TEST_F(BridgeTest, ThreadPublishesUntilStopped) {
  now.ready = true;
  partition(0).records_in = 1;
  bridge.start();
  for (int i = 0; i < 200 && value(*m, "kdedup_records_in_total", p0) != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(value(*m, "kdedup_records_in_total", p0), 1);
  bridge.stop();
  partition(0).records_in = 5;
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(value(*m, "kdedup_records_in_total", p0), 1);  // joined: no more rounds
}

TEST_F(BridgeTest, RefusedSnapshotsAreCountedByReasonAndMissingIsNot) {
  SliceOptions o;
  o.filter.type = filter::FilterType::kExact;
  ASSERT_TRUE(inst.make_slice(PartitionId{"in", 0}, o));
  ASSERT_TRUE(inst.make_slice(PartitionId{"in", 1}, o));
  const LabelMap p1{{"topic", "in"}, {"partition", "1"}};
  auto refusals = [&](const LabelMap& where, const char* reason) {
    LabelMap labels = where;
    labels["reason"] = reason;
    return value(*m, "kdedup_snapshot_refusals_total", labels);
  };
  // Every reason's series exists at zero from assignment on.
  for (std::string_view r : metrics::kSnapshotRefusalReasons) {
    EXPECT_EQ(refusals(p0, std::string(r).c_str()), 0) << r;
  }

  const SliceHooks hooks = inst.hooks();
  RecoveryOutcome corrupt;
  corrupt.reason = RecoveryReason::kRebuildFromWindow;
  corrupt.snapshot_refusal = SnapshotRefusal::kCorrupt;
  hooks.on_recovered(PartitionId{"in", 0}, corrupt);
  RecoveryOutcome missing;
  missing.reason = RecoveryReason::kRebuildFromWindow;
  missing.snapshot_refusal = SnapshotRefusal::kMissing;
  hooks.on_recovered(PartitionId{"in", 1}, missing);

  EXPECT_EQ(refusals(p0, "corrupt"), 1);
  EXPECT_EQ(refusals(p0, "config_changed"), 0);
  EXPECT_EQ(refusals(p1, "corrupt"), 0);
  EXPECT_EQ(refusals(p1, "missing"), -1) << "no snapshot is not a refusal";
  double p1_total = 0;
  for (std::string_view r : metrics::kSnapshotRefusalReasons) {
    p1_total += refusals(p1, std::string(r).c_str());
  }
  EXPECT_EQ(p1_total, 0);
  EXPECT_EQ(value(*m, "kdedup_rebuilds_total", p0), 1);
  EXPECT_EQ(value(*m, "kdedup_rebuilds_total", p1), 1);

  // A snapshot ahead of a partition the group never committed: refused,
  // although the partition starts fresh rather than being rebuilt.
  RecoveryOutcome fresh;
  fresh.reason = RecoveryReason::kFreshPartition;
  fresh.snapshot_refusal = SnapshotRefusal::kAheadOfCommit;
  hooks.on_recovered(PartitionId{"in", 1}, fresh);
  EXPECT_EQ(refusals(p1, "ahead_of_commit"), 1);
  EXPECT_EQ(value(*m, "kdedup_rebuilds_total", p1), 1);
}

TEST(SnapshotRefusalNames, MetricsListsEveryRefusalButMissing) {
  const SnapshotRefusal all[] = {SnapshotRefusal::kCorrupt,       SnapshotRefusal::kConfigChanged,
                                 SnapshotRefusal::kFormatUnknown, SnapshotRefusal::kReadError,
                                 SnapshotRefusal::kAheadOfCommit, SnapshotRefusal::kBehindRetention,
                                 SnapshotRefusal::kConfirmStore};
  ASSERT_EQ(std::size(all), metrics::kSnapshotRefusalReasons.size());
  for (std::size_t i = 0; i < std::size(all); ++i) {
    EXPECT_EQ(metrics::kSnapshotRefusalReasons[i], to_string(all[i]));
  }
}

TEST_F(BridgeTest, TransactionTotalsArePublishedAsDeltas) {
  const LabelMap committed{{"outcome", "committed"}};
  const LabelMap aborted{{"outcome", "aborted"}};
  const LabelMap discarded{{"outcome", "discarded"}};
  // Registered in every delivery mode, at zero.
  EXPECT_EQ(value(*m, "kdedup_transactions_total", committed), 0);
  EXPECT_EQ(value(*m, "kdedup_transactions_total", aborted), 0);
  EXPECT_EQ(value(*m, "kdedup_transaction_records_total", committed), 0);
  EXPECT_EQ(value(*m, "kdedup_transaction_records_total", discarded), 0);

  now.transactions.committed = 3;
  now.transactions.records_committed = 300;
  bridge.publish();
  bridge.publish();  // nothing new: nothing added twice
  EXPECT_EQ(value(*m, "kdedup_transactions_total", committed), 3);
  EXPECT_EQ(value(*m, "kdedup_transactions_total", aborted), 0);
  EXPECT_EQ(value(*m, "kdedup_transaction_records_total", committed), 300);

  now.transactions.committed = 5;
  now.transactions.aborted = 1;
  now.transactions.records_committed = 420;
  now.transactions.records_aborted = 17;
  now.transactions.partitions_rolled_back = 2;
  bridge.publish();
  EXPECT_EQ(value(*m, "kdedup_transactions_total", committed), 5);
  EXPECT_EQ(value(*m, "kdedup_transactions_total", aborted), 1);
  EXPECT_EQ(value(*m, "kdedup_transaction_records_total", committed), 420);
  EXPECT_EQ(value(*m, "kdedup_transaction_records_total", discarded), 17);
}

}  // namespace
}  // namespace kdedup::pipeline
