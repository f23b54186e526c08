#pragma once
// Value types of the snapshot store: which partition a snapshot belongs to,
// what it records, what a write cost, and why a load was refused.
//
// A snapshot of one input partition records (DESIGN.md "Recovery protocol"):
// the filter state (SlidingFilter::serialize()), the next input offset the
// state covers, the partition clock, a fingerprint of the filter configuration
// and salt, a format version and the wall time it was taken.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "kdedup/filter/sliding_filter.h"
#include "kdedup/filter/tick_scale.h"

namespace kdedup::state {

/// One input partition: the unit of snapshotting (one horizontal slice).
struct PartitionKey {
  std::string topic;
  std::int32_t partition = 0;
  friend bool operator==(const PartitionKey&, const PartitionKey&) = default;
  /// "topic/partition", for messages.
  [[nodiscard]] std::string to_string() const;
};

/// "in[1-3,7], orders[0]": partitions grouped by topic with ranges, so a log
/// line stays readable with a thousand partitions.
[[nodiscard]] std::string summarize(std::vector<PartitionKey> keys);

/// Identifies the configuration a filter state was built with. A snapshot is
/// only usable by a filter with an equal StateFingerprint: another config,
/// window, time -> tick mapping or salt gives other decisions (or other
/// fingerprints for the same identity, or other tick numbers).
struct StateFingerprint {
  std::uint64_t config = 0;      ///< filter::config_fingerprint()
  std::uint64_t salt_check = 0;  ///< filter::salt_check() of the identity salt
  /// filter::TickScale::fingerprint(); 0 in snapshots written before the
  /// mapping was made exact (manifest format 1), which never matches.
  std::uint64_t tick_scale = 0;
  friend bool operator==(const StateFingerprint&, const StateFingerprint&) = default;
};

[[nodiscard]] StateFingerprint state_fingerprint(const filter::FilterConfig& config,
                                                 const filter::TickScale& scale,
                                                 std::uint64_t salt_check);

/// Step 1 of a snapshot: an immutable copy of one partition's state, taken on
/// the worker thread that owns the partition, then handed to
/// SnapshotStore::submit() which writes it on its own thread.
struct SnapshotCapture {
  PartitionKey key;
  std::int64_t next_offset = 0;  ///< first input offset NOT reflected in `state`
  std::int64_t clock_ms = 0;     ///< partition clock (event time) when captured
  StateFingerprint fingerprint;
  filter::FilterType filter_type = filter::FilterType::kExact;
  std::string state;  ///< SlidingFilter::serialize() output (checksummed envelope)
  std::chrono::nanoseconds capture_time{0};  ///< how long step 1 blocked the worker
};

/// Step 1: serializes `filter` (owned by the calling thread, which must be the
/// one that owns the filter) into a capture. This is the only snapshot work
/// on the worker: one SlidingFilter::serialize() call, i.e. a pass over and a
/// copy of the whole state (bench/snapshot_bench.cc measures it; seconds for
/// a 256 MiB timer filter, see docs/performance.md). Stagger captures of a
/// worker's partitions. `next_offset` must be the offset after the last
/// record the filter has seen; `scale` the mapping that numbered its ticks.
[[nodiscard]] SnapshotCapture capture_snapshot(PartitionKey key,
                                               const filter::SlidingFilter& filter,
                                               const filter::TickScale& scale,
                                               std::int64_t next_offset, std::int64_t clock_ms,
                                               std::uint64_t salt_check);

/// What a stored snapshot's manifest says (no filter state).
struct SnapshotInfo {
  PartitionKey key;
  std::int64_t next_offset = 0;
  std::int64_t clock_ms = 0;
  StateFingerprint fingerprint;
  filter::FilterType filter_type = filter::FilterType::kExact;
  std::uint16_t format_version = 0;
  std::int64_t created_ms = 0;        ///< wall clock (Unix ms) when written
  std::uint64_t logical_bytes = 0;    ///< size of the filter state blob
  std::uint32_t chunk_size = 0;       ///< bytes per chunk (last one may be shorter)
  std::uint32_t chunk_count = 0;      ///< chunks in the state, in order
  std::uint32_t distinct_chunks = 0;  ///< stored chunk records (equal chunks share one)
  std::uint64_t disk_bytes = 0;       ///< approximate compressed bytes on disk (list() only)
};

/// What one snapshot write cost.
struct WriteReport {
  PartitionKey key;
  std::uint64_t logical_bytes = 0;   ///< size of the filter state
  std::uint64_t bytes_written = 0;   ///< keys + values put into RocksDB (before compression)
  std::uint32_t chunks_total = 0;    ///< distinct chunks the new snapshot references
  std::uint32_t chunks_written = 0;  ///< chunks that were new or changed
  std::uint32_t chunks_deleted = 0;  ///< chunks no longer referenced, deleted
  bool full = false;  ///< true when every chunk was rewritten (first write of the partition)
  std::chrono::nanoseconds capture_time{0};  ///< step 1, copied from the capture
  std::chrono::nanoseconds write_time{0};    ///< step 2: hash, diff, WriteBatch, fsync
};

/// Why a stored snapshot cannot be used. Every reason means: rebuild this
/// partition from Kafka (and count/log the reason); none is fatal.
enum class LoadFailure : std::uint8_t {
  kMissing,        ///< no snapshot for this partition
  kCorrupt,        ///< a checksum, size or cross-check failed; message names the part
  kConfigChanged,  ///< taken with another filter config or salt
  kFormatUnknown,  ///< written by a kdedup with a snapshot format this one cannot read
  kReadError,      ///< RocksDB could not read (I/O error); message says what
  /// Confirmed mode: the confirm store does not hold exactly this
  /// snapshot's deliveries (confirm_store.h, "Recovery").
  kConfirmStore,
};

[[nodiscard]] const char* to_string(LoadFailure reason) noexcept;

struct LoadError {
  LoadFailure reason;
  std::string message;  ///< complete sentence for a log line
};

template <class T>
using LoadResult = tl::expected<T, LoadError>;

/// A verified snapshot with its state blob (every checksum checked).
struct Snapshot {
  SnapshotInfo info;
  std::string state;
};

/// A verified snapshot restored into a filter ready to continue processing
/// from info.next_offset with clock info.clock_ms.
struct RestoredSnapshot {
  SnapshotInfo info;
  std::unique_ptr<filter::SlidingFilter> filter;
};

}  // namespace kdedup::state
