#pragma once
// Output reconciliation (DESIGN.md "Recovery protocol"): before a newly
// assigned input partition emits anything past its committed offset C, find
// H, the highest source offset of that partition already present in the
// output topic, so records up to H are replayed in rebuild mode instead of
// being produced a second time. A crash between "produced" and "committed"
// then costs no duplicates with an idempotent producer and a single owner
// per partition.
//
// Every distinct record kdedup produces carries provenance headers (written
// by the pipeline's produce path):
//   kdedup-source-topic      input topic name
//   kdedup-source-partition  input partition, ASCII decimal
//   kdedup-source-offset     input offset, ASCII decimal
// Only the tail of each output partition is read: the last `tail_records`
// records (from max(low, high - N) to high). Size N so that it covers what
// can be produced but not yet committed: at least commit_interval x the
// output rate per partition, with margin (the default covers 10'000).
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
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"
#include "kdedup/pipeline/slice.h"

namespace kdedup::pipeline {

inline constexpr std::string_view kProvenanceTopicHeader = "kdedup-source-topic";
inline constexpr std::string_view kProvenancePartitionHeader = "kdedup-source-partition";
inline constexpr std::string_view kProvenanceOffsetHeader = "kdedup-source-offset";

/// The provenance header values of one output record (first occurrence of
/// each name), as found.
struct ProvenanceHeaders {
  std::optional<std::string_view> topic;
  std::optional<std::string_view> partition;
  std::optional<std::string_view> offset;
};

/// Where an output record came from.
struct Provenance {
  PartitionId source;
  std::int64_t offset = 0;
};

/// Parse result: a provenance, nothing (a record kdedup did not write: no
/// provenance header at all), or an error naming the malformed header.
struct ProvenanceParse {
  std::optional<Provenance> provenance;
  std::optional<std::string> malformed;  ///< set when some header is present but unusable
};

/// Parses the three headers. All absent = not a kdedup record (neither set).
/// Partial or non-decimal values (sign, spaces, empty, overflow, negative
/// partition or offset) are malformed with a message naming the header.
[[nodiscard]] ProvenanceParse parse_provenance(const ProvenanceHeaders& headers);

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
  /// Whole read, metadata and watermarks included.
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
  std::uint64_t without_provenance = 0;         ///< records with none of the headers
  std::uint64_t malformed = 0;                  ///< counted and skipped (warning logged)
  std::vector<std::string> malformed_examples;  ///< the first few messages
  /// H for one input partition; none if the tail holds nothing from it.
  [[nodiscard]] std::optional<std::int64_t> highest(const PartitionId& source) const;
  /// The source offsets of `source` found (empty if none).
  [[nodiscard]] std::vector<std::int64_t> emitted(const PartitionId& source) const;
};

/// Reads the tails of `output_partitions` of `output_topic`. Empty partitions
/// are fine. Fails (with topic, partition and position) when the topic or a
/// partition does not exist, or the read does not finish within the timeout.
[[nodiscard]] Result<ReconcileReport> read_output_tail(
    const ReconcileOptions& options, const std::string& output_topic,
    const std::vector<std::int32_t>& output_partitions);

/// Where a rebuild without snapshot starts (RecoveryInputs::
/// window_start_offset): for each partition, given its committed offset C
/// (> 0, and C - 1 still stored), reads the record at C - 1 and asks
/// offsetsForTimes for its timestamp minus `window_ms` (rewind_target_ms).
/// Partitions without an answer (the record has no timestamp, or no record
/// at or after the target) are absent from the result. One short-lived
/// consumer for all partitions, on the calling thread; fails on a timeout
/// or a broker error, naming the partition.
[[nodiscard]] Result<std::map<PartitionId, std::int64_t>> find_window_starts(
    const ReconcileOptions& options, const std::map<PartitionId, std::int64_t>& committed,
    std::int64_t window_ms);

/// The output topic's partition count (for output_partitions_to_read with
/// `key`), from metadata.
[[nodiscard]] Result<std::int32_t> output_partition_count(const ReconcileOptions& options,
                                                          const std::string& output_topic);

}  // namespace kdedup::pipeline
