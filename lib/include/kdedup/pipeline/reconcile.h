#pragma once
// Reading the output topic on assignment (DESIGN.md "Recovery protocol"):
// the output is the record of what was delivered.
// - Reconciliation: before a newly assigned input partition emits anything
//   past its committed offset C, find the source offsets of that partition
//   already present in the output (H is the highest), so they are replayed
//   in rebuild mode instead of being produced a second time. A crash between
//   "produced" and "committed" then costs no duplicates with an idempotent
//   producer and a single owner per partition.
// - Rebuild from what was delivered: a partition without a usable snapshot
//   rebuilds its filter from the records a previous owner emitted in the
//   window before C (recovery.h), so the output is also read back to the
//   first record at or after a given event time.
//
// Every distinct record kdedup produces carries provenance headers
// (provenance.h, written by the pipeline's produce path).
// What is read of each output partition: the last `tail_records` records
// (from max(low, high - N) to high), and, when a rebuild needs it, every
// record from the first one whose timestamp is at or after `since_ms` (found
// with offsets-for-times, or by bisection on brokers that cannot look
// offsets up by time). Size N so that it covers what can be produced but
// not yet committed: at least commit_interval x the output rate per
// partition, with margin (the default covers 10'000). An output record's
// timestamp is its input record's, so `since_ms` finds every delivery whose
// input timestamp is at or after it (see state.rebuild_lateness).
//
// Which output partitions: with `output.partitioning: input` input partition
// p writes only output partition p; with `key` any input partition can land
// anywhere, so all output partitions are read.
//
// How the pipeline must call it: on the consumer thread, during assignment,
// for the newly assigned partitions together (one read serves them all),
// before they are resumed; feed highest() into RecoveryInputs.
// highest_emitted. Not needed in transactional mode. On an error (timeout,
// topic missing) keep the partitions paused and retry, or stop: starting
// without H may re-emit records produced by the previous owner.
//
// Threading: the function creates and destroys its own short-lived consumer
// (no group membership, no commits) on the calling thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"
#include "kdedup/identity/record.h"
#include "kdedup/pipeline/provenance.h"
#include "kdedup/pipeline/slice.h"

namespace kdedup::pipeline {

/// Output partitions to read for input partition `input_partition`.
[[nodiscard]] std::vector<std::int32_t> output_partitions_to_read(
    config::Partitioning partitioning, std::int32_t input_partition,
    std::int32_t output_partition_count);

struct ReconcileOptions {
  /// Consumer properties (bootstrap.servers, security, ...). group.id,
  /// enable.partition.eof and auto commit are set by the reconciler.
  std::map<std::string, std::string> properties;
  /// Records read from the end of each output partition.
  std::int64_t tail_records = 10'000;
  /// Each step (metadata, watermarks, a time search) must finish within
  /// it; reading the ranges fails when nothing arrives for this long, so a
  /// long window's deliveries can take longer as a whole.
  std::chrono::milliseconds timeout{15'000};
};

/// What one tail read found.
struct ReconcileReport {
  /// Highest source offset per source partition seen in the tail.
  std::map<PartitionId, std::int64_t> highest_by_source;
  /// Every source offset per source partition seen in the tail, sorted and
  /// unique (at most tail_records per output partition read): the
  /// ReplayRule's `emitted` set.
  std::map<PartitionId, std::vector<std::int64_t>> emitted_by_source;
  /// Output partitions whose tail did not reach back to their low watermark
  /// (older records were not read).
  std::vector<std::int32_t> truncated;
  std::uint64_t records_read = 0;
  /// Output partitions read further back than the tail and since_ms to
  /// cover a source's uncommitted output.
  std::size_t extended = 0;
  std::uint64_t without_provenance = 0;         ///< records with none of the headers
  std::uint64_t malformed = 0;                  ///< counted and skipped (warning logged)
  std::vector<std::string> malformed_examples;  ///< the first few messages
  /// H for one input partition; none if the tail holds nothing from it.
  [[nodiscard]] std::optional<std::int64_t> highest(const PartitionId& source) const;
  /// The source offsets of `source` found (empty if none).
  [[nodiscard]] std::vector<std::int64_t> emitted(const PartitionId& source) const;
};

/// What a read of the output must find of one input partition's
/// deliveries: every source offset at or after `from_offset`.
struct Coverage {
  /// C, the committed offset (0 when the group never committed).
  std::int64_t from_offset = 0;
  /// How old (by timestamp) a delivery at or after C can be: the timestamp
  /// of the record at C - 1 less state.rebuild_lateness. None: unknown, the
  /// output partition's start.
  std::optional<std::int64_t> since_ms;
};

/// Reads `output_partitions` of `output_topic`: the tail of each, and for
/// each partition in `since_ms` everything from its first record at or
/// after that timestamp (a rebuild's window). Then, where an output
/// partition holds records of a source in `cover` that all lie at or past
/// its `from_offset` (so more of them may precede the part read: commits
/// stalled, e.g. while the group kept rebalancing, and the uncommitted
/// output outgrew the tail), it reads further back, to the first record at
/// or after that source's `since_ms` (or the partition's start). Offsets
/// are kept for the sources in `cover` only (empty: all), and each such
/// record is handed to `on_delivery` (when set) with its provenance, its
/// key, value and headers, and its timestamp (0: none), on the calling
/// thread. Empty partitions are fine. Fails (with topic, partition and
/// position) when the topic or a partition does not exist, or the read does
/// not finish within the timeout.
using DeliveryVisitor =
    std::function<void(const Provenance&, const identity::RecordView&, std::int64_t timestamp_ms)>;
[[nodiscard]] Result<ReconcileReport> read_output(
    const ReconcileOptions& options, const std::string& output_topic,
    const std::vector<std::int32_t>& output_partitions,
    const std::map<std::int32_t, std::int64_t>& since_ms = {},
    const std::map<PartitionId, Coverage>& cover = {}, const DeliveryVisitor& on_delivery = {});

/// The committed position of one partition, as the input shows it.
struct CommitPoint {
  std::int64_t timestamp_ms = 0;  ///< of the record at C - 1
  /// Where a rebuild without snapshot starts (asked for): the first offset
  /// whose timestamp is >= since_ms = timestamp_ms - rewind.
  std::optional<std::int64_t> window_offset;
  std::int64_t since_ms = 0;
};

/// For each partition, given its committed offset C (> 0, and C - 1 still
/// stored), reads the record at C - 1 (its timestamp bounds how old the
/// deliveries after C can be); for the partitions in `rebuild`, also asks
/// offsetsForTimes for that timestamp minus `rewind_ms` (rewind_target_ms;
/// the window plus one tick: a delivery is forgotten by then), which is
/// where a rebuild without snapshot starts (RecoveryInputs::
/// window_start_offset). Partitions whose record has no timestamp (or is
/// gone) are absent from the result. One short-lived consumer for all
/// partitions, on the calling thread; fails on a timeout or a broker error,
/// naming the partition.
[[nodiscard]] Result<std::map<PartitionId, CommitPoint>> find_commit_points(
    const ReconcileOptions& options, const std::map<PartitionId, std::int64_t>& committed,
    const std::set<PartitionId>& rebuild, std::int64_t rewind_ms);

/// The output topic's partition count (for output_partitions_to_read with
/// `key`), from metadata.
[[nodiscard]] Result<std::int32_t> output_partition_count(const ReconcileOptions& options,
                                                          const std::string& output_topic);

}  // namespace kdedup::pipeline
