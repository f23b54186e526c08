#pragma once
// Where a newly assigned partition starts, and when a snapshot may be taken
// (DESIGN.md "Recovery protocol (the invariants)").
//
// RecoveryPlan: a pure function of what is known at assignment time:
//   (a) the SnapshotStore load result: a snapshot (next offset S, clock) or
//       why there is none (missing, corrupt, config changed, format, read);
//   (b) the group's committed offset C, or none;
//   (c) H, the highest source offset of this input partition already in the
//       output (reconcile.h), or none;
//   (d) the window and the offsets-for-times answer for
//       (timestamp at C) - window.
// It answers: restore the snapshot's filter or start empty; the offset to
// fetch from; the offset up to which records are replayed in REBUILD mode
// (filter updated, nothing emitted) = max(C, H + 1); and why.
//
// The central invariant: S is never ahead of C. A snapshot whose next offset
// is past the committed offset covers records whose output may never have
// been delivered; restoring it would make those records duplicates of
// themselves after the replay (silent loss). Such a snapshot is refused,
// reported (snapshot_ahead), and the partition is rebuilt from Kafka.
//
// How the pipeline must use it, on the consumer thread, per assigned
// partition, before the partition is resumed (it stays paused and not ready
// until the rebuild reaches rebuild_until):
//   1. store.load(key, fingerprint)  -> SnapshotOffer via offer_from()
//   2. consumer.committed()           -> committed
//   3. if no usable snapshot: timestamp of the record at C-1,
//      rewind_target_ms(ts, window + one tick), offsetsForTimes ->
//      window_start_offset; the low watermark L -> low_watermark (a
//      snapshot with S < L is refused as behind_retention, the rebuild
//      never starts before L)
//   4. read the output (reconcile.h): its tail (idempotent mode) ->
//      highest_emitted and the emitted offsets; for a rebuild, also every
//      record delivered since the rewind target (less state.rebuild_lateness)
//      -> the offsets delivered in the window. In transactional mode leave
//      highest_emitted empty: aborted output is not visible to
//      read_committed readers and committed output matches C.
//   5. plan_recovery(); build the Slice from the restored filter (when
//      filter == kRestored, with clock_ms) or empty; seek to fetch_from
//      (none = leave the consumer's auto.offset.reset to decide); give the
//      slice its ReplayRule (slice.h): below C a restored filter decides
//      every record again, an empty one learns only the records that were
//      delivered (found in the output) at their ticks, which rebuilds the
//      previous owner's state; in [C, rebuild_until) the emitted offsets are
//      learned, the others processed. Replayed records are never produced
//      and their offsets are committable at once.
//   6. log `explanation`, count `reason` and any `snapshot_refusal`.
//
// SnapshotGate: the other half of the invariant, for writing. It remembers
// the last successfully committed offset per partition; a capture at next
// offset N may be submitted only while N <= that offset.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "kdedup/pipeline/slice.h"
#include "kdedup/state/snapshot.h"

namespace kdedup::pipeline {

/// Why a stored snapshot is not used, in the store's words plus the one
/// refusal only the pipeline can make.
enum class SnapshotRefusal : std::uint8_t {
  kMissing,
  kCorrupt,
  kConfigChanged,
  kFormatUnknown,
  kReadError,
  /// Confirmed mode: the confirm store cannot back this snapshot (absent,
  /// refused, or bound to another snapshot); rebuilt like the filter.
  kConfirmStore,
  kAheadOfCommit,  ///< S > C, or a snapshot with no committed offset at all
  /// S < L, the input's low watermark: records [S, L) were deleted by
  /// retention, so replaying from S would miss them (the filter would not
  /// know identities the previous owner delivered).
  kBehindRetention,
};

[[nodiscard]] const char* to_string(SnapshotRefusal refusal) noexcept;

/// What SnapshotStore::load() returned, without the filter itself (the
/// caller keeps the restored filter and moves it into the Slice when the
/// plan says kRestored).
struct SnapshotOffer {
  struct Position {
    std::int64_t next_offset = 0;  ///< S: first offset not reflected in the state
    std::int64_t clock_ms = 0;     ///< partition clock at S
  };
  std::optional<Position> snapshot;                     ///< set when the store loaded one
  SnapshotRefusal refusal = SnapshotRefusal::kMissing;  ///< when `snapshot` is empty
  std::string message;  ///< the store's complete sentence when refused
};

/// Reduces a SnapshotStore::load() (or read()) result to an offer. Header
/// only, so the pipeline needs no link dependency on the state module here.
template <class T>
[[nodiscard]] SnapshotOffer offer_from(const state::LoadResult<T>& loaded) {
  SnapshotOffer offer;
  if (loaded) {
    offer.snapshot = SnapshotOffer::Position{loaded->info.next_offset, loaded->info.clock_ms};
    return offer;
  }
  switch (loaded.error().reason) {
    case state::LoadFailure::kMissing:
      offer.refusal = SnapshotRefusal::kMissing;
      break;
    case state::LoadFailure::kCorrupt:
      offer.refusal = SnapshotRefusal::kCorrupt;
      break;
    case state::LoadFailure::kConfigChanged:
      offer.refusal = SnapshotRefusal::kConfigChanged;
      break;
    case state::LoadFailure::kFormatUnknown:
      offer.refusal = SnapshotRefusal::kFormatUnknown;
      break;
    case state::LoadFailure::kReadError:
      offer.refusal = SnapshotRefusal::kReadError;
      break;
    case state::LoadFailure::kConfirmStore:
      offer.refusal = SnapshotRefusal::kConfirmStore;
      break;
  }
  offer.message = loaded.error().message;
  return offer;
}

/// Everything plan_recovery() looks at.
struct RecoveryInputs {
  PartitionId partition;
  SnapshotOffer snapshot;
  /// C: the group's committed offset (next record to read); none = the
  /// group never committed this partition.
  std::optional<std::int64_t> committed;
  /// H: highest source offset of this partition found in the output.
  std::optional<std::int64_t> highest_emitted;
  std::int64_t window_ms = 0;
  /// offsetsForTimes(rewind_target_ms(...)): the first offset whose
  /// timestamp is at or after (timestamp at C) - window. None when there is
  /// no such record or the timestamp at C is unknown: then an empty filter
  /// starts at C (nothing older can be replayed; reported as kNoHistory).
  std::optional<std::int64_t> window_start_offset;
  /// L: the partition's low watermark (oldest offset still stored); none =
  /// unknown (treated as 0).
  std::optional<std::int64_t> low_watermark;
};

/// Which branch the plan took (a metric label and a log word each).
enum class RecoveryReason : std::uint8_t {
  kRestored,           ///< snapshot restored, replay [S, rebuild_until)
  kRebuildFromWindow,  ///< empty filter, replay one window before C
  kNoHistory,          ///< empty filter from C: no record in the window before C is known
  kFreshPartition,     ///< nothing committed and no snapshot: consumer reset policy decides
};

[[nodiscard]] const char* to_string(RecoveryReason reason) noexcept;

struct RecoveryPlan {
  enum class FilterSource : std::uint8_t { kRestored, kEmpty };
  FilterSource filter = FilterSource::kEmpty;
  std::int64_t clock_ms = 0;  ///< the partition clock to start with (0 = empty)
  /// Offset to seek to; none = no committed position: let auto.offset.reset
  /// decide (rebuild_until still applies to whatever is read).
  std::optional<std::int64_t> fetch_from;
  /// Records with offset < rebuild_until are replayed in rebuild mode;
  /// 0 = no rebuild. Always >= C and > H. Below C every record is replayed;
  /// in [C, rebuild_until) only those already in the output (ReplayRule).
  std::int64_t rebuild_until = 0;
  /// C, or 0 without a committed offset: the ReplayRule's `committed`.
  std::int64_t committed_until = 0;
  /// The window before C reaches back past the input's retention: the
  /// rebuild starts at the low watermark; identities delivered before it
  /// are learned from the output records themselves (a duplicate of one the
  /// output no longer holds can pass once).
  bool window_past_retention = false;
  RecoveryReason reason = RecoveryReason::kFreshPartition;
  /// Why the stored snapshot was not used (none when restored).
  std::optional<SnapshotRefusal> snapshot_refusal;
  std::string explanation;  ///< one log line, naming the partition and the offsets
};

/// How one partition's recovery ended (Pipeline -> SliceHooks::on_recovered,
/// for metrics): restored or rebuilt, how long from assignment until the
/// replay reached its end, and the snapshot's size when restored.
struct RecoveryOutcome {
  RecoveryReason reason = RecoveryReason::kFreshPartition;
  std::optional<SnapshotRefusal> snapshot_refusal;
  double seconds = 0.0;
  std::uint64_t restored_bytes = 0;
  std::uint64_t replayed = 0;
};

/// (timestamp at the committed position) - rewind, floored at 0: the time
/// to ask offsetsForTimes for when a partition is rebuilt without snapshot
/// (rewind = window + one tick: a delivery older than that is forgotten).
[[nodiscard]] std::int64_t rewind_target_ms(std::int64_t committed_timestamp_ms,
                                            std::int64_t rewind_ms) noexcept;

/// The plan for one partition. Fails only on inputs that cannot come from
/// Kafka (negative offsets, window <= 0), naming the partition and the value.
[[nodiscard]] Result<RecoveryPlan> plan_recovery(const RecoveryInputs& in);

/// Decides whether a snapshot may be written now. Shared by the consumer
/// thread (commit results: committed(), forget()) and the worker threads
/// (may_snapshot() before submitting a capture); thread-safe, one short lock.
class SnapshotGate {
 public:
  /// A commit of `offset` for `partition` SUCCEEDED (commit callback /
  /// commit_transaction returned kProceed). Offsets never move back here:
  /// a lower value than known is ignored (a late callback of an older commit).
  void committed(const PartitionId& partition, std::int64_t offset);

  /// The partition was revoked or lost: its committed position is no longer
  /// ours to vouch for.
  void forget(const PartitionId& partition);

  /// True when a capture with next offset `next_offset` is covered by a
  /// successful commit (next_offset <= committed). False otherwise, and the
  /// refusal is counted: the caller keeps the capture or drops it, never
  /// writes it.
  [[nodiscard]] bool may_snapshot(const PartitionId& partition, std::int64_t next_offset);

  /// Last committed offset known for `partition`.
  [[nodiscard]] std::optional<std::int64_t> committed_offset(const PartitionId& partition) const;

  /// Snapshots refused by may_snapshot() so far.
  [[nodiscard]] std::uint64_t refused() const;

 private:
  mutable std::mutex mu_;
  std::map<PartitionId, std::int64_t> committed_;
  std::uint64_t refused_ = 0;
};

}  // namespace kdedup::pipeline
