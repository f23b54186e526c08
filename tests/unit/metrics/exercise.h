#pragma once
// Drives every metric family of a Metrics instance with realistic values, as
// a running pipeline would: two topics, a few partitions, batches with every
// outcome, audit counts, filter stats, snapshots, restores, rebuilds,
// librdkafka statistics, delivery errors and rebalances. Shared by the docs
// check, the HTTP tests and the Prometheus integration test.

#include <memory>
#include <vector>

#include "kdedup/metrics/metrics.h"

namespace kdedup::testing {

/// Partition handles kept alive so their gauges stay exported.
using PartitionHandles = std::vector<std::unique_ptr<metrics::PartitionMetrics>>;

/// Assigns orders/0..2 and payments/0 and feeds them one round of traffic.
PartitionHandles exercise_every_metric(metrics::Metrics& m);

/// One more round of traffic on the given handles (counters grow, so rates
/// are non-zero between scrapes).
void add_traffic(metrics::Metrics& m, PartitionHandles& handles, int round);

}  // namespace kdedup::testing
