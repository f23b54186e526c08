#pragma once
// PartitionProcessor: the per-partition data plane, without Kafka. Given a
// batch of records of one partition (offset, timestamp, key/value/headers
// as an identity::RecordView) and the partition's Slice, it
//   1. applies the Slice's ReplayRule (recovery: decide, learn or skip
//      records without producing them, slice.h);
//   2. moves the partition clock and extracts each record's identity;
//   3. fingerprints and decides first-test-then-set (seed 000 §4) in one
//      batch call to the filter (confirmed mode: its duplicates confirmed
//      in the exact store, Slice::decide);
//   4. routes: distinct records to the output, duplicates (dropped, or to the
//      duplicates sink when routed), records without identity per
//      `on_invalid` (dead letter, pass, drop, or stop the batch there);
//   5. registers every processed offset with the Slice's OffsetTracker (and
//      how many outputs it waits for) BEFORE any output is handed to the
//      sinks, so no delivery report can overtake its registration;
//   6. hands the outputs to the RecordSinks, in input order, and counts.
// `kdedup run`'s workers (sinks = the producer) and `kdedup filter` (sinks =
// files) both use it, so they make the same decisions by construction.
//
// Threading: one processor per thread (it keeps scratch buffers); a Slice is
// processed by one thread at a time (its owning worker).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kdedup/config/config.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/identity/extractor.h"
#include "kdedup/pipeline/offset_tracker.h"
#include "kdedup/pipeline/slice.h"

namespace kdedup::pipeline {

/// One input record of a batch.
struct RecordIn {
  std::int64_t offset = 0;
  std::int64_t timestamp_ms = 0;  ///< <= 0: none (judged at the partition clock)
  identity::RecordView view;
};

/// Where the outputs of a batch go; called in input order, after the
/// batch's offsets were registered. `index` is the record's position in the
/// batch.
class RecordSinks {
 public:
  virtual ~RecordSinks() = default;
  /// A distinct record (or, with on_invalid: pass, one without identity).
  virtual void output(std::size_t index) = 0;
  /// A duplicate; called only when ProcessorOptions::route_duplicates.
  virtual void duplicate(std::size_t index) = 0;
  /// A record without identity and on_invalid: dlq.
  virtual void dead_letter(std::size_t index, const identity::ExtractError& error) = 0;
  /// True when the sinks cannot take more (a fatal producer error): the
  /// rest of the batch's outputs are not handed over.
  [[nodiscard]] virtual bool stopped() const { return false; }
};

/// What shapes the routing.
struct ProcessorOptions {
  bool filter_enabled = true;  ///< false: every record with identity is distinct
  config::OnInvalid on_invalid = config::OnInvalid::kDlq;
  bool route_duplicates = false;  ///< duplicates go to RecordSinks::duplicate
  /// on_duplicate: refresh. The Slice's SliceOptions::refresh makes the
  /// filter renew duplicates; here it makes a replayed record the previous
  /// owner dropped (ReplayRule::kDropped) renew its identity as well.
  bool refresh = false;
  /// Decide each record at the timestamp its extractor reads from the record
  /// (a time spec, `kdedup filter --time json:/ptr`) instead of
  /// RecordIn::timestamp_ms; a record whose time cannot be read has no
  /// identity (its error says why).
  bool time_from_extractor = false;

  /// The options of `kdedup run` for `config`.
  [[nodiscard]] static ProcessorOptions of(const config::Config& config);
};

/// What one batch did.
struct BatchResult {
  /// Records processed: all of them, or up to (not including) the record
  /// that stopped the batch (on_invalid: fail).
  std::size_t processed = 0;
  /// Set when on_invalid: fail stopped the batch at record `processed`;
  /// its offset is not registered, so it is never committed.
  std::optional<std::string> fail_message;
  std::optional<identity::ExtractError> fail_error;  ///< why that record has no identity
  /// The Slice's OffsetTracker refused the offsets (they went backwards):
  /// an internal error; nothing was handed to the sinks.
  bool offsets_rejected = false;
  /// Set with fail_message (and processed 0) when the Slice cannot decide
  /// (confirmed mode: the confirm store failed): nothing of the batch was
  /// registered or handed to the sinks, so none of it is committed.
  bool slice_failed = false;
};

class PartitionProcessor {
 public:
  /// `fingerprinter` is taken by reference and copied: its key is 64-byte
  /// aligned, and passed by value GCC notes an ABI change at every call.
  PartitionProcessor(ProcessorOptions options, identity::IdentityExtractor extractor,
                     const filter::Fingerprinter& fingerprinter);

  /// Processes `records` (offsets increasing, all of `slice`'s partition).
  /// `wall_ms` is the wall clock for the clock's future cap.
  BatchResult process(Slice& slice, std::span<const RecordIn> records, std::int64_t wall_ms,
                      RecordSinks& sinks);

  [[nodiscard]] const ProcessorOptions& options() const noexcept { return options_; }

 private:
  enum class Route : std::uint8_t { kOutput, kDuplicate, kDeadLetter, kNone };

  // The steps of process(), in order.
  std::size_t classify(Slice& slice, std::span<const RecordIn> records, std::int64_t wall_ms,
                       BatchResult& result);
  bool route_invalid(Slice& slice, std::int64_t offset, std::size_t i, identity::ExtractError error,
                     BatchResult& result);
  bool decide(Slice& slice);
  bool register_processed(Slice& slice, std::span<const RecordIn> processed);
  void hand_out(std::size_t count, RecordSinks& sinks);

  ProcessorOptions options_;
  identity::IdentityExtractor extractor_;
  filter::Fingerprinter fingerprinter_;
  // Scratch, reused from batch to batch.
  std::vector<Route> routes_;
  std::vector<char> replayed_;
  std::vector<std::optional<identity::ExtractError>> errors_;
  std::vector<filter::Fingerprint> fps_;
  std::vector<filter::Tick> ticks_;
  std::vector<std::int64_t> offsets_;  // input offset of each fps_ element
  std::vector<std::uint8_t> learn_;
  std::vector<std::size_t> decided_;  // batch index of each fps_ element
  std::vector<filter::Decision> decisions_;
  std::vector<OffsetTracker::Processed> processed_;
  bool any_learn_ = false;  // some fps_ element is learned, not decided
};

}  // namespace kdedup::pipeline
