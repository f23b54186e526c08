#include "kdedup/metrics/metrics.h"

#include "kdedup/identity/extractor.h"

#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <chrono>
#include <map>
#include <optional>
#include <thread>

namespace kdedup::metrics {
namespace {

using LabelMap = std::map<std::string, std::string>;

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

std::size_t series_count(const std::vector<prometheus::MetricFamily>& families,
                         const std::string& name) {
  for (const auto& f : families) {
    if (f.name == name) return f.metric.size();
  }
  return 0;
}

/// The wall clock in seconds, as precise as the metrics' own timestamps.
/// (std::time() may read a coarse clock a few milliseconds behind, which put
/// a timestamp taken just after a second's turn "in the future".)
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double counter(const std::vector<prometheus::MetricFamily>& fs, const std::string& name,
               const LabelMap& labels) {
  const auto* m = find_sample(fs, name, labels);
  EXPECT_NE(m, nullptr) << name;
  return m ? m->counter.value : -1.0;
}

double gauge(const std::vector<prometheus::MetricFamily>& fs, const std::string& name,
             const LabelMap& labels) {
  const auto* m = find_sample(fs, name, labels);
  EXPECT_NE(m, nullptr) << name;
  return m ? m->gauge.value : -1.0;
}

std::unique_ptr<Metrics> make(MetricsOptions options = {}) {
  auto m = Metrics::create(std::move(options));
  EXPECT_TRUE(m) << m.error().message;
  return m ? std::move(*m) : nullptr;
}

TEST(Metrics, BatchCountersAddUpPerPartition) {
  auto m = make();
  auto p0 = m->partition("orders", 0);
  auto p1 = m->partition("orders", 1);
  BatchCounts a;
  a.in = 100;
  a.distinct = 80;
  a.duplicate = 15;
  a.dlq = 5;
  a.clock_capped = 6;
  a.no_timestamp = 2;
  a.invalid[m->reason_index("not_json")] = 4;
  a.invalid[m->reason_index("no_such_reason")] = 1;  // counted as "other"
  p0->add_batch(a);
  p0->add_batch(a);
  BatchCounts b;
  b.in = 7;
  b.distinct = 7;
  p1->add_batch(b);

  const auto fs = m->collect();
  const LabelMap o0{{"topic", "orders"}, {"partition", "0"}};
  const LabelMap o1{{"topic", "orders"}, {"partition", "1"}};
  EXPECT_EQ(counter(fs, "kdedup_records_in_total", o0), 200);
  EXPECT_EQ(counter(fs, "kdedup_records_distinct_total", o0), 160);
  EXPECT_EQ(counter(fs, "kdedup_records_duplicate_total", o0), 30);
  EXPECT_EQ(counter(fs, "kdedup_records_dlq_total", o0), 10);
  EXPECT_EQ(counter(fs, "kdedup_clock_capped_records_total", o0), 12);
  EXPECT_EQ(counter(fs, "kdedup_clock_missing_timestamp_records_total", o0), 4);
  EXPECT_EQ(counter(fs, "kdedup_clock_capped_records_total", o1), 0);
  EXPECT_EQ(counter(fs, "kdedup_records_invalid_total",
                    {{"topic", "orders"}, {"partition", "0"}, {"reason", "not_json"}}),
            8);
  EXPECT_EQ(counter(fs, "kdedup_records_invalid_total",
                    {{"topic", "orders"}, {"partition", "0"}, {"reason", "other"}}),
            2);
  EXPECT_EQ(counter(fs, "kdedup_records_invalid_total",
                    {{"topic", "orders"}, {"partition", "0"}, {"reason", "missing_key"}}),
            0);
  EXPECT_EQ(counter(fs, "kdedup_records_in_total", o1), 7);
  // Counts alone observe nothing in the latency histograms.
  const auto* batches = find_sample(fs, "kdedup_batch_processing_seconds", {{"topic", "orders"}});
  ASSERT_NE(batches, nullptr);
  EXPECT_EQ(batches->histogram.sample_count, 0u);
}

// Cumulative count of the `le` bucket of a histogram sample.
std::uint64_t cumulative(const prometheus::ClientMetric& h, double le) {
  for (const auto& bucket : h.histogram.bucket) {
    if (bucket.upper_bound == le) return bucket.cumulative_count;
  }
  ADD_FAILURE() << "no bucket le=" << le;
  return 0;
}

TEST(DurationCounts, BoundsAreInclusiveLikePrometheusLe) {
  // An observation of exactly a bound is in that bound's bucket; one
  // nanosecond more is in the next one.
  for (std::size_t i = 0; i < kEmitAgeBounds.size(); ++i) {
    const auto at = static_cast<std::uint64_t>(kEmitAgeBounds[i] * 1e9 + 0.5);
    EXPECT_EQ(EmitAgeCounts::bucket_of(at), i) << "le=" << kEmitAgeBounds[i];
    EXPECT_EQ(EmitAgeCounts::bucket_of(at + 1), i + 1) << "le=" << kEmitAgeBounds[i];
    EXPECT_EQ(static_cast<double>(at) / 1e9, kEmitAgeBounds[i]);  // whole nanoseconds
  }
  for (std::size_t i = 0; i < kBatchProcessingBounds.size(); ++i) {
    const auto at = static_cast<std::uint64_t>(kBatchProcessingBounds[i] * 1e9 + 0.5);
    EXPECT_EQ(BatchTimeCounts::bucket_of(at), i) << "le=" << kBatchProcessingBounds[i];
    EXPECT_EQ(BatchTimeCounts::bucket_of(at - 1), i) << "le=" << kBatchProcessingBounds[i];
    EXPECT_EQ(BatchTimeCounts::bucket_of(at + 1), i + 1) << "le=" << kBatchProcessingBounds[i];
  }
  EXPECT_EQ(BatchTimeCounts::bucket_of(0), 0u);
  EXPECT_EQ(BatchTimeCounts::bucket_of(UINT64_MAX), kBatchProcessingBounds.size());  // +Inf
}

TEST(DurationCounts, CountSumAndDifferencesBetweenReadings) {
  BatchTimeCounts c;
  c.observe(50'000);         // 50 us   -> le 0.0001
  c.observe(100'000);        // 100 us  -> le 0.0001 (inclusive)
  c.observe(100'001);        //         -> le 0.00025
  c.observe(3'000'000'000);  // 3 s -> +Inf
  EXPECT_EQ(c.count(), 4u);
  EXPECT_EQ(c.buckets[0], 2u);
  EXPECT_EQ(c.buckets[1], 1u);
  EXPECT_EQ(c.buckets.back(), 1u);
  EXPECT_EQ(c.sum_nanos, 3'000'250'001u);

  BatchTimeCounts later = c;
  later.observe(700'000);
  const BatchTimeCounts d = later.since(c);
  EXPECT_EQ(d.count(), 1u);
  EXPECT_EQ(d.buckets[BatchTimeCounts::bucket_of(700'000)], 1u);
  EXPECT_EQ(d.sum_nanos, 700'000u);
  EXPECT_EQ(later.since(later), BatchTimeCounts{});

  // The sum wraps modulo 2^64; the difference is still the observations'.
  BatchTimeCounts near_wrap;
  near_wrap.sum_nanos = UINT64_MAX - 10;
  BatchTimeCounts wrapped = near_wrap;
  wrapped.observe(100);
  EXPECT_EQ(wrapped.since(near_wrap).sum_nanos, 100u);

  // A histogram that started over (its buckets went backwards) is new as a whole.
  BatchTimeCounts fresh;
  fresh.observe(1'000);
  EXPECT_EQ(fresh.since(later), fresh);
}

TEST(DurationHistogram, AtomicCountsMatchTheLocalOnes) {
  EmitAgeHistogram h;
  EmitAgeCounts batch;
  batch.observe(3'000'000);    // 3 ms
  batch.observe(200'000'000);  // 200 ms
  h.add(batch);
  h.observe(5'000'000'000'000);  // 5000 s -> +Inf
  EmitAgeCounts want = batch;
  want.observe(5'000'000'000'000);
  EXPECT_EQ(h.read(), want);
  EXPECT_EQ(h.read().count(), 3u);
}

TEST(Metrics, LatencyHistogramsTakeBucketCountsAsTheyAre) {
  auto m = make();
  auto p = m->partition("orders", 0);
  EmitAgeCounts ages;
  ages.observe(3'000'000);          // 0.003 s   -> le 0.005
  ages.observe(5'000'000);          // 0.005 s   -> le 0.005 (inclusive)
  ages.observe(200'000'000);        // 0.2 s     -> le 0.25
  ages.observe(5'000'000'000'000);  // 5000 s    -> +Inf
  p->add_emit_ages(ages);
  BatchTimeCounts times;
  times.observe(1'000'000);  // 0.001 s -> le 0.001
  times.observe(1'500'000);  // 0.0015 s -> le 0.0025
  p->add_batch_times(times);
  p->add_batch_times(BatchTimeCounts{});  // nothing new: nothing observed

  const auto fs = m->collect();
  const auto* h = find_sample(fs, "kdedup_record_age_at_emit_seconds", {{"topic", "orders"}});
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->histogram.sample_count, 4u);
  EXPECT_DOUBLE_EQ(h->histogram.sample_sum, 5000.208);
  for (const auto& bucket : h->histogram.bucket) {
    const std::uint64_t want = bucket.upper_bound < 0.005  ? 0
                               : bucket.upper_bound < 0.25 ? 2
                               : bucket.upper_bound < 5000 ? 3
                                                           : 4;
    EXPECT_EQ(bucket.cumulative_count, want) << "le=" << bucket.upper_bound;
  }
  const auto* b = find_sample(fs, "kdedup_batch_processing_seconds", {{"topic", "orders"}});
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(b->histogram.sample_sum, 0.0025);
  EXPECT_EQ(cumulative(*b, 0.0005), 0u);
  EXPECT_EQ(cumulative(*b, 0.001), 1u);
  EXPECT_EQ(cumulative(*b, 0.0025), 2u);
  // The registered buckets are the shared bounds, plus +Inf.
  ASSERT_EQ(b->histogram.bucket.size(), kBatchProcessingBounds.size() + 1);
  ASSERT_EQ(h->histogram.bucket.size(), kEmitAgeBounds.size() + 1);
  for (std::size_t i = 0; i < kBatchProcessingBounds.size(); ++i) {
    EXPECT_EQ(b->histogram.bucket[i].upper_bound, kBatchProcessingBounds[i]);
  }
}

TEST(Metrics, FilterGaugesAndTheirRemovalOnRevocation) {
  auto m = make();
  auto p = m->partition("orders", 3);
  filter::FilterStats s;
  s.bytes = 4096;
  s.cells = 1000;
  s.live_cells = 250;
  s.subfilters = 3;
  s.fpp_estimate = 0.004;
  p->set_filter(s, 1.5);
  p->set_queue_depth(42);
  const LabelMap l{{"topic", "orders"}, {"partition", "3"}};
  auto fs = m->collect();
  EXPECT_EQ(gauge(fs, "kdedup_filter_bytes", l), 4096);
  EXPECT_EQ(gauge(fs, "kdedup_filter_fill_ratio", l), 0.25);
  EXPECT_EQ(gauge(fs, "kdedup_filter_subfilters", l), 3);
  EXPECT_EQ(gauge(fs, "kdedup_filter_fpp_estimate", l), 0.004);
  EXPECT_EQ(gauge(fs, "kdedup_filter_clock_lag_seconds", l), 1.5);
  EXPECT_EQ(gauge(fs, "kdedup_filter_clock_ahead_seconds", l), 0.0);
  EXPECT_EQ(gauge(fs, "kdedup_queue_depth", l), 42);
  // Until the first snapshot the timestamp is the assignment time.
  const double now = wall_seconds();
  EXPECT_NEAR(gauge(fs, "kdedup_snapshot_last_success_timestamp_seconds", l), now, 5);

  p->add_batch(BatchCounts{.in = 3});
  p.reset();  // revoked
  fs = m->collect();
  EXPECT_EQ(series_count(fs, "kdedup_filter_bytes"), 0u);
  EXPECT_EQ(series_count(fs, "kdedup_queue_depth"), 0u);
  EXPECT_EQ(counter(fs, "kdedup_records_in_total", l), 3);  // counters stay

  auto again = m->partition("orders", 3);  // reassigned: the counter continues
  again->add_batch(BatchCounts{.in = 2});
  EXPECT_EQ(counter(m->collect(), "kdedup_records_in_total", l), 5);
}

TEST(Metrics, AggregatesPerTopicWhenPartitionSeriesAreOff) {
  MetricsOptions options;
  options.per_partition = false;
  auto m = make(options);
  auto p0 = m->partition("orders", 0);
  auto p1 = m->partition("orders", 1);
  auto q = m->partition("payments", 0);
  p0->add_batch(BatchCounts{.in = 10, .distinct = 9, .duplicate = 1});
  p1->add_batch(BatchCounts{.in = 5, .distinct = 5});
  filter::FilterStats s0{
      .bytes = 100, .cells = 100, .live_cells = 10, .subfilters = 1, .fpp_estimate = 0.001};
  filter::FilterStats s1{
      .bytes = 300, .cells = 300, .live_cells = 150, .subfilters = 2, .fpp_estimate = 0.02};
  p0->set_filter(s0, 4.0);
  p1->set_filter(s1, -3.0);  // ahead of the wall clock
  p0->set_queue_depth(3);
  p1->set_queue_depth(4);
  p0->snapshot_written(0.01, 100);

  const auto fs = m->collect();
  const LabelMap orders{{"topic", "orders"}};
  EXPECT_EQ(counter(fs, "kdedup_records_in_total", orders), 15);
  EXPECT_EQ(counter(fs, "kdedup_records_distinct_total", orders), 14);
  EXPECT_EQ(gauge(fs, "kdedup_filter_bytes", orders), 400);
  EXPECT_EQ(gauge(fs, "kdedup_filter_subfilters", orders), 3);
  EXPECT_EQ(gauge(fs, "kdedup_filter_fill_ratio", orders), 160.0 / 400.0);
  EXPECT_EQ(gauge(fs, "kdedup_filter_fpp_estimate", orders), 0.02);        // worst partition
  EXPECT_EQ(gauge(fs, "kdedup_filter_clock_lag_seconds", orders), 4.0);    // worst partition
  EXPECT_EQ(gauge(fs, "kdedup_filter_clock_ahead_seconds", orders), 3.0);  // worst partition
  EXPECT_EQ(gauge(fs, "kdedup_queue_depth", orders), 7);
  // The oldest snapshot of the topic: p1 has none yet, so its assignment
  // time, which is earlier than p0's snapshot.
  EXPECT_LT(gauge(fs, "kdedup_snapshot_last_success_timestamp_seconds", orders),
            wall_seconds() + 1);
  EXPECT_EQ(series_count(fs, "kdedup_filter_bytes"), 2u);  // orders, payments
  EXPECT_EQ(find_sample(fs, "kdedup_records_in_total", {{"topic", "orders"}, {"partition", "0"}}),
            nullptr);
}

TEST(Metrics, SnapshotRefusalsByReasonFollowPartitionSeriesSwitch) {
  auto m = make();
  auto p = m->partition("orders", 0);
  const LabelMap corrupt{{"topic", "orders"}, {"partition", "0"}, {"reason", "corrupt"}};
  EXPECT_EQ(counter(m->collect(), "kdedup_snapshot_refusals_total", corrupt), 0);  // from the start
  p->snapshot_refused("corrupt");
  p->snapshot_refused("some_future_reason");  // counted under its own name, not lost
  auto fs = m->collect();
  EXPECT_EQ(counter(fs, "kdedup_snapshot_refusals_total", corrupt), 1);
  EXPECT_EQ(series_count(fs, "kdedup_snapshot_refusals_total"), kSnapshotRefusalReasons.size() + 1);
  EXPECT_EQ(counter(fs, "kdedup_snapshot_refusals_total",
                    {{"topic", "orders"}, {"partition", "0"}, {"reason", "some_future_reason"}}),
            1);

  MetricsOptions options;
  options.per_partition = false;
  auto agg = make(options);
  auto a0 = agg->partition("orders", 0);
  auto a1 = agg->partition("orders", 1);
  a0->snapshot_refused("config_changed");
  a1->snapshot_refused("config_changed");
  fs = agg->collect();
  EXPECT_EQ(counter(fs, "kdedup_snapshot_refusals_total",
                    {{"topic", "orders"}, {"reason", "config_changed"}}),
            2);
  EXPECT_EQ(series_count(fs, "kdedup_snapshot_refusals_total"), kSnapshotRefusalReasons.size());
}

TEST(Metrics, TransactionCountersExistAtZeroAndAdd) {
  auto m = make();
  auto fs = m->collect();
  EXPECT_EQ(series_count(fs, "kdedup_transactions_total"), 2u);
  EXPECT_EQ(series_count(fs, "kdedup_transaction_records_total"), 2u);
  m->add_transactions(4, 1, 400, 30);
  m->add_transactions(1, 0, 10, 0);
  fs = m->collect();
  EXPECT_EQ(counter(fs, "kdedup_transactions_total", {{"outcome", "committed"}}), 5);
  EXPECT_EQ(counter(fs, "kdedup_transactions_total", {{"outcome", "aborted"}}), 1);
  EXPECT_EQ(counter(fs, "kdedup_transaction_records_total", {{"outcome", "committed"}}), 410);
  EXPECT_EQ(counter(fs, "kdedup_transaction_records_total", {{"outcome", "discarded"}}), 30);
}

TEST(Metrics, AuditSnapshotRestoreAndRebuildCounters) {
  auto m = make();
  auto p = m->partition("orders", 0);
  p->add_audit(
      AuditCounts{.sampled = 10, .truly_new = 8, .false_positives = 1, .false_negatives = 0});
  p->add_audit(
      AuditCounts{.sampled = 5, .truly_new = 5, .false_positives = 0, .false_negatives = 2});
  p->snapshot_written(0.5, 1000);
  p->snapshot_written(0.25, 500);
  p->snapshot_failed();
  p->restored(2.0, 4000);
  p->rebuilt(700);
  p->add_replayed(30);
  const LabelMap l{{"topic", "orders"}, {"partition", "0"}};
  const auto fs = m->collect();
  EXPECT_EQ(counter(fs, "kdedup_audit_sampled_total", l), 15);
  EXPECT_EQ(counter(fs, "kdedup_audit_truly_new_total", l), 13);
  EXPECT_EQ(counter(fs, "kdedup_audit_false_positives_total", l), 1);
  EXPECT_EQ(counter(fs, "kdedup_audit_false_negatives_total", l), 2);
  EXPECT_EQ(counter(fs, "kdedup_snapshots_total", l), 2);
  EXPECT_EQ(counter(fs, "kdedup_snapshot_failures_total", l), 1);
  EXPECT_EQ(counter(fs, "kdedup_snapshot_written_bytes_total", l), 1500);
  EXPECT_EQ(counter(fs, "kdedup_restores_total", l), 1);
  EXPECT_EQ(counter(fs, "kdedup_restore_read_bytes_total", l), 4000);
  EXPECT_EQ(counter(fs, "kdedup_rebuilds_total", l), 1);
  EXPECT_EQ(counter(fs, "kdedup_rebuild_replayed_records_total", l), 730);
  const auto* snap = find_sample(fs, "kdedup_snapshot_duration_seconds", {{"topic", "orders"}});
  ASSERT_NE(snap, nullptr);
  EXPECT_EQ(snap->histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(snap->histogram.sample_sum, 0.75);
  const auto* restore = find_sample(fs, "kdedup_restore_duration_seconds", {{"topic", "orders"}});
  ASSERT_NE(restore, nullptr);
  EXPECT_EQ(restore->histogram.sample_count, 1u);
  const double now = wall_seconds();
  EXPECT_NEAR(gauge(fs, "kdedup_snapshot_last_success_timestamp_seconds", l), now, 5);
}

TEST(Metrics, InstanceWideMetrics) {
  MetricsOptions options;
  options.fpp_target = 0.005;
  auto m = make(options);
  m->add_rebalance();
  m->add_rebalance();
  m->set_assigned_partitions(6);
  m->set_workers(3);
  m->add_busy_seconds(1.25);
  m->add_busy_seconds(0.75);
  m->add_delivery_errors("out", 3);
  m->add_delivery_errors("out", 1);
  m->add_delivery_errors("dlq", 2);
  const auto fs = m->collect();
  EXPECT_EQ(counter(fs, "kdedup_consumer_rebalances_total", {}), 2);
  EXPECT_EQ(gauge(fs, "kdedup_consumer_assigned_partitions", {}), 6);
  EXPECT_EQ(gauge(fs, "kdedup_workers", {}), 3);
  EXPECT_EQ(counter(fs, "kdedup_worker_busy_seconds_total", {}), 2.0);
  EXPECT_EQ(counter(fs, "kdedup_producer_delivery_errors_total", {{"topic", "out"}}), 4);
  EXPECT_EQ(counter(fs, "kdedup_producer_delivery_errors_total", {{"topic", "dlq"}}), 2);
  EXPECT_EQ(gauge(fs, "kdedup_filter_fpp_target", {}), 0.005);
  EXPECT_EQ(gauge(fs, "kdedup_build_info",
                  {{"version", Metrics::version()}, {"revision", Metrics::revision()}}),
            1);
  EXPECT_STRNE(Metrics::revision(), "");
  EXPECT_EQ(gauge(fs, "kdedup_ready", {}), 0);
  m->health().set_ready();
  EXPECT_EQ(gauge(m->collect(), "kdedup_ready", {}), 1);
}

TEST(Metrics, StatisticsFeedLagAndProducerQueue) {
  auto m = make();
  auto consumer = parse_statistics(R"({"type": "consumer", "topics": {"orders": {"partitions": {
      "0": {"partition": 0, "consumer_lag": 12}, "1": {"partition": 1, "consumer_lag": 30}}}}})");
  ASSERT_TRUE(consumer);
  m->apply_statistics(*consumer);
  auto producer = parse_statistics(R"({"type": "producer", "msg_cnt": 9, "msg_size": 900})");
  ASSERT_TRUE(producer);
  m->apply_statistics(*producer);
  auto fs = m->collect();
  EXPECT_EQ(gauge(fs, "kdedup_consumer_lag", {{"topic", "orders"}, {"partition", "0"}}), 12);
  EXPECT_EQ(gauge(fs, "kdedup_consumer_lag", {{"topic", "orders"}, {"partition", "1"}}), 30);
  EXPECT_EQ(gauge(fs, "kdedup_producer_queue_messages", {}), 9);
  EXPECT_EQ(gauge(fs, "kdedup_producer_queue_bytes", {}), 900);

  // Partition 1 was revoked: the next document no longer reports it.
  auto later = parse_statistics(R"({"type": "consumer", "topics": {"orders": {"partitions": {
      "0": {"partition": 0, "consumer_lag": 2}}}}})");
  ASSERT_TRUE(later);
  m->apply_statistics(*later);
  fs = m->collect();
  EXPECT_EQ(gauge(fs, "kdedup_consumer_lag", {{"topic", "orders"}, {"partition", "0"}}), 2);
  EXPECT_EQ(series_count(fs, "kdedup_consumer_lag"), 1u);
  EXPECT_EQ(gauge(fs, "kdedup_producer_queue_messages", {}), 9);  // consumer docs leave it
}

TEST(Metrics, QueueDepthAddsWhatTheConsumerFetchedAndNoWorkerTookYet) {
  // A worker reads its partitions' records from its own librdkafka queue:
  // what waits there is known from the statistics (next_offset minus
  // app_offset), what the worker took and did not process from the worker.
  auto m = make();
  auto p0 = m->partition("orders", 0);
  auto p1 = m->partition("orders", 1);
  p0->set_queue_depth(4);
  auto consumer = parse_statistics(R"({"type": "consumer", "topics": {"orders": {"partitions": {
      "0": {"partition": 0, "consumer_lag": -1, "next_offset": 900, "app_offset": 600},
      "1": {"partition": 1, "consumer_lag": 3, "next_offset": 50, "app_offset": 50},
      "7": {"partition": 7, "consumer_lag": 1, "next_offset": 80, "app_offset": 10}}}}})");
  ASSERT_TRUE(consumer);
  m->apply_statistics(*consumer);
  const auto fs = m->collect();
  EXPECT_EQ(gauge(fs, "kdedup_queue_depth", {{"topic", "orders"}, {"partition", "0"}}), 304);
  EXPECT_EQ(gauge(fs, "kdedup_queue_depth", {{"topic", "orders"}, {"partition", "1"}}), 0);
  // Only assigned partitions have a queue (7 is not this member's).
  EXPECT_EQ(series_count(fs, "kdedup_queue_depth"), 2u);
  // An unknown lag is no series.
  EXPECT_EQ(series_count(fs, "kdedup_consumer_lag"), 2u);
  EXPECT_EQ(gauge(fs, "kdedup_consumer_lag", {{"topic", "orders"}, {"partition", "1"}}), 3);
}

TEST(Metrics, LoadFairnessOverTheLastInterval) {
  MetricsOptions options;
  options.load_interval = std::chrono::milliseconds(0);  // every scrape closes an interval
  auto m = make(options);
  auto a = m->partition("t", 0);
  auto b = m->partition("t", 1);
  a->add_batch(BatchCounts{.in = 100});
  b->add_batch(BatchCounts{.in = 100});
  auto fs = m->collect();
  EXPECT_DOUBLE_EQ(gauge(fs, "kdedup_load_fairness_index", {}), 1.0);
  EXPECT_DOUBLE_EQ(gauge(fs, "kdedup_load_max_share", {}), 0.5);

  a->add_batch(BatchCounts{.in = 300});  // only a is busy in this interval
  fs = m->collect();
  EXPECT_DOUBLE_EQ(gauge(fs, "kdedup_load_fairness_index", {}), 0.5);  // 1/S
  EXPECT_DOUBLE_EQ(gauge(fs, "kdedup_load_max_share", {}), 1.0);

  auto c = m->partition("t", 2);
  a->add_batch(BatchCounts{.in = 10});
  b->add_batch(BatchCounts{.in = 20});
  c->add_batch(BatchCounts{.in = 30});
  fs = m->collect();
  EXPECT_DOUBLE_EQ(gauge(fs, "kdedup_load_fairness_index", {}), 3600.0 / (3 * 1400.0));
  EXPECT_DOUBLE_EQ(gauge(fs, "kdedup_load_max_share", {}), 0.5);
}

TEST(Metrics, LoadFairnessHoldsTheLastCompletedInterval) {
  MetricsOptions options;
  options.load_interval = std::chrono::hours(1);
  auto m = make(options);
  auto a = m->partition("t", 0);
  auto b = m->partition("t", 1);
  a->add_batch(BatchCounts{.in = 100});
  // No interval completed yet: the figures so far are shown.
  EXPECT_DOUBLE_EQ(gauge(m->collect(), "kdedup_load_fairness_index", {}), 0.5);
  b->add_batch(BatchCounts{.in = 100});
  EXPECT_DOUBLE_EQ(gauge(m->collect(), "kdedup_load_fairness_index", {}), 1.0);
}

TEST(Metrics, EveryIdentityReasonHasItsOwnSeries) {
  auto m = make();
  auto p = m->partition("orders", 0);
  BatchCounts c;
  for (identity::Reason r : identity::kAllReasons) {
    const std::size_t i = m->reason_index(identity::to_string(r));
    ASSERT_NE(m->invalid_reasons()[i], "other") << identity::to_string(r);
    c.invalid[i] = 1;
  }
  p->add_batch(c);
  const auto fs = m->collect();
  for (identity::Reason r : identity::kAllReasons) {
    EXPECT_EQ(
        counter(fs, "kdedup_records_invalid_total",
                {{"topic", "orders"}, {"partition", "0"}, {"reason", identity::to_string(r)}}),
        1);
  }
  EXPECT_EQ(counter(fs, "kdedup_records_invalid_total",
                    {{"topic", "orders"}, {"partition", "0"}, {"reason", "other"}}),
            0);
}

TEST(Metrics, RejectsBadOptions) {
  MetricsOptions fpp;
  fpp.fpp_target = 0.0;
  auto a = Metrics::create(fpp);
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().message.find("fpp"), std::string::npos);

  MetricsOptions bad_name;
  bad_name.invalid_reasons = {"Not Json"};
  auto b = Metrics::create(bad_name);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("'Not Json'"), std::string::npos);

  MetricsOptions twice;
  twice.invalid_reasons = {"a", "a"};
  EXPECT_FALSE(Metrics::create(twice));

  MetricsOptions many;
  many.invalid_reasons.clear();
  for (int i = 0; i < 16; ++i) many.invalid_reasons.push_back("r" + std::to_string(i));
  auto c = Metrics::create(many);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("at most 15"), std::string::npos);
}

TEST(Metrics, ScrapesWhileWorkersUpdate) {
  auto m = make();
  constexpr int kBatches = 5000;
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&m, w] {
      auto p = m->partition("orders", w);
      for (int i = 0; i < kBatches; ++i) {
        EmitAgeCounts ages;
        ages.observe(10'000'000);
        p->add_emit_ages(ages);
        p->add_batch(BatchCounts{.in = 2, .distinct = 1, .duplicate = 1});
        p->set_filter(filter::FilterStats{.bytes = static_cast<std::uint64_t>(i)}, 0.0);
        p->add_audit(AuditCounts{.sampled = 1});
      }
    });
  }
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(m->scrape().empty());
  for (auto& t : workers) t.join();
  const auto fs = m->collect();
  for (int w = 0; w < 2; ++w) {
    const LabelMap l{{"topic", "orders"}, {"partition", std::to_string(w)}};
    EXPECT_EQ(counter(fs, "kdedup_records_in_total", l), 2 * kBatches);
    EXPECT_EQ(counter(fs, "kdedup_audit_sampled_total", l), kBatches);
  }
  const auto* ages = find_sample(fs, "kdedup_record_age_at_emit_seconds", {{"topic", "orders"}});
  ASSERT_NE(ages, nullptr);
  EXPECT_EQ(ages->histogram.sample_count, 2u * kBatches);
}

TEST(Metrics, ScrapeIsPrometheusText) {
  auto m = make();
  auto p = m->partition("orders", 0);
  p->add_batch(BatchCounts{.in = 1, .distinct = 1});
  BatchTimeCounts times;
  times.observe(1'000'000);
  p->add_batch_times(times);
  const std::string text = m->scrape();
  EXPECT_NE(text.find("# TYPE kdedup_records_in_total counter"), std::string::npos);
  EXPECT_NE(text.find("kdedup_records_in_total{partition=\"0\",topic=\"orders\"} 1"),
            std::string::npos)
      << text.substr(0, 2000);
  EXPECT_NE(text.find("# TYPE kdedup_filter_fill_ratio gauge"), std::string::npos);
  EXPECT_NE(text.find("kdedup_batch_processing_seconds_bucket{topic=\"orders\",le=\"0.001\"} 1"),
            std::string::npos);
}

}  // namespace
}  // namespace kdedup::metrics
