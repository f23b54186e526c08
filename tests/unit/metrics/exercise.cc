#include "exercise.h"

#include "kdedup/metrics/stats_json.h"

namespace kdedup::testing {

using metrics::BatchCounts;

void add_traffic(metrics::Metrics& m, PartitionHandles& handles, int round) {
  for (std::size_t i = 0; i < handles.size(); ++i) {
    auto& p = *handles[i];
    // Partition 0 of "orders" is hot, the rest share the remainder.
    const std::uint64_t in = i == 0 ? 4000 : 1000;
    BatchCounts c;
    c.in = in;
    c.duplicate = in / 10;
    c.invalid[m.reason_index("not_json")] = 3;
    c.invalid[m.reason_index("missing_field")] = 2;
    c.dlq = 5;
    c.distinct = in - c.duplicate - c.dlq;
    // A producer on payments stamps some records minutes ahead: capped.
    c.clock_capped = i == 3 ? 12 : 0;
    c.no_timestamp = i == 1 ? 2 : 0;
    p.add_batch(c);
    // What the StatsBridge passes on: 50 output records 2 ms .. 100 ms old,
    // and a few batch times (hundreds of microseconds, one slower batch).
    metrics::EmitAgeCounts ages;
    for (std::uint64_t k = 0; k < 50; ++k) ages.observe(2'000'000 * (k + 1));
    p.add_emit_ages(ages);
    metrics::BatchTimeCounts times;
    for (std::uint64_t k = 0; k < 4; ++k) times.observe(400'000 + 100'000 * (i + k));
    times.observe(30'000'000);
    p.add_batch_times(times);
    p.add_audit(metrics::AuditCounts{in / 1024 + 4, in / 1024 + 3, 0, 0});

    filter::FilterStats s;
    s.bytes = (2u << 20) + static_cast<std::uint64_t>(round) * 4096;
    s.cells = 1u << 21;
    s.live_cells = (1u << 19) + static_cast<std::uint64_t>(round) * 100;
    s.subfilters = 2;
    s.insertions = static_cast<std::uint64_t>(round) * in;
    s.fpp_estimate = 0.002 + 0.0001 * static_cast<double>(i);
    p.set_filter(s, i == 3 ? -42.0 : 0.8);  // payments' clock runs ahead
    p.set_queue_depth(120 + i);
    // Confirmed mode: the filter's duplicates looked up, a few of them
    // prevented false positives, one lookup batch per 100 records.
    metrics::ConfirmLookupCounts lookups;
    for (std::uint64_t k = 0; k < in / 100; ++k) lookups.observe(20'000 + 1'000 * k);
    p.add_confirm(c.duplicate + 2, 2, lookups);
    p.set_confirm_store_bytes((3u << 20) + static_cast<std::uint64_t>(round) * 36 * in);
  }
  m.add_busy_seconds(0.35);
  m.health().beat();
}

PartitionHandles exercise_every_metric(metrics::Metrics& m) {
  PartitionHandles handles;
  handles.push_back(m.partition("orders", 0));
  handles.push_back(m.partition("orders", 1));
  handles.push_back(m.partition("orders", 2));
  handles.push_back(m.partition("payments", 0));
  m.set_assigned_partitions(4);
  m.set_workers(2);
  m.add_repartition({.in = 10, .repartitioned = 8, .dead_lettered = 1, .dropped = 1, .passed = 0});
  m.set_repartition(42, 4);
  m.set_memory(64u << 20, 9u << 20, 0.01);
  m.add_rebalance();
  m.health().set_ready();
  add_traffic(m, handles, 1);

  // One audited false positive on orders/1 so the accuracy panels have data.
  handles[1]->add_audit(metrics::AuditCounts{1, 1, 1, 0, 3});
  handles[2]->add_audit(metrics::AuditCounts{1, 0, 0, 1});

  for (auto& p : handles) {
    p->restored(0.12, 2u << 20);
    p->add_replayed(350);
    p->snapshot_written(0.045, 2u << 20);
  }
  // A refusal the alert leaves out (a crash between snapshot and commit).
  handles[3]->snapshot_refused("ahead_of_commit");
  handles[3]->rebuilt(12000);
  handles[3]->snapshot_failed();
  m.add_delivery_errors("orders-dedup", 2);
  m.add_transactions(12, 1, 4800, 350);

  auto consumer = metrics::parse_statistics(R"({
    "name": "rdkafka#consumer-1", "type": "consumer", "ts": 1000, "msg_cnt": 0, "msg_size": 0,
    "topics": {
      "orders": {"topic": "orders", "partitions": {
        "0": {"partition": 0, "consumer_lag": 420},
        "1": {"partition": 1, "consumer_lag": 15},
        "2": {"partition": 2, "consumer_lag": 0},
        "-1": {"partition": -1, "consumer_lag": -1}}},
      "payments": {"topic": "payments", "partitions": {
        "0": {"partition": 0, "consumer_lag": 7}}}}})");
  if (consumer) m.apply_statistics(*consumer);
  auto producer = metrics::parse_statistics(
      R"({"name": "rdkafka#producer-2", "type": "producer", "ts": 1000,
          "msg_cnt": 37, "msg_size": 18432})");
  if (producer) m.apply_statistics(*producer);
  return handles;
}

}  // namespace kdedup::testing
