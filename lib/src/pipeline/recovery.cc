#include "kdedup/pipeline/recovery.h"

#include <algorithm>

#include <fmt/format.h>

namespace kdedup::pipeline {

const char* to_string(SnapshotRefusal refusal) noexcept {
  switch (refusal) {
    case SnapshotRefusal::kMissing:
      return "missing";
    case SnapshotRefusal::kCorrupt:
      return "corrupt";
    case SnapshotRefusal::kConfigChanged:
      return "config_changed";
    case SnapshotRefusal::kFormatUnknown:
      return "format_unknown";
    case SnapshotRefusal::kReadError:
      return "read_error";
    case SnapshotRefusal::kConfirmStore:
      return "confirm_store";
    case SnapshotRefusal::kAheadOfCommit:
      return "ahead_of_commit";
    case SnapshotRefusal::kBehindRetention:
      return "behind_retention";
  }
  return "unknown";
}

const char* to_string(RecoveryReason reason) noexcept {
  switch (reason) {
    case RecoveryReason::kRestored:
      return "restored";
    case RecoveryReason::kRebuildFromWindow:
      return "rebuild_from_window";
    case RecoveryReason::kNoHistory:
      return "no_history";
    case RecoveryReason::kFreshPartition:
      return "fresh_partition";
  }
  return "unknown";
}

std::int64_t rewind_target_ms(std::int64_t committed_timestamp_ms,
                              std::int64_t rewind_ms) noexcept {
  return std::max<std::int64_t>(0, committed_timestamp_ms - rewind_ms);
}

namespace {

std::string opt(const std::optional<std::int64_t>& v) {
  return v ? std::to_string(*v) : std::string("none");
}

/// Inputs that cannot come from Kafka (a librdkafka sentinel passed as an
/// offset, a window <= 0).
Status check_inputs(const RecoveryInputs& in) {
  const std::string where = in.partition.str();
  if (in.window_ms <= 0) {
    return fail(
        fmt::format("recovery of {}: window must be positive, got {} ms", where, in.window_ms));
  }
  auto negative = [](const std::optional<std::int64_t>& v) { return v && *v < 0; };
  if (negative(in.committed) || negative(in.highest_emitted) || negative(in.window_start_offset) ||
      negative(in.low_watermark) ||
      (in.snapshot.snapshot && in.snapshot.snapshot->next_offset < 0)) {
    return fail(fmt::format(
        "recovery of {}: negative offset (committed {}, highest emitted {}, window start {}, "
        "snapshot {}); pass 'none' for an unknown offset, not a librdkafka sentinel",
        where, opt(in.committed), opt(in.highest_emitted), opt(in.window_start_offset),
        in.snapshot.snapshot ? std::to_string(in.snapshot.snapshot->next_offset) : "none"));
  }
  return {};
}

/// Step 1: the snapshot, if any, must be covered by a commit (S <= C).
/// Sets the plan to restore it and returns true, or records why not.
bool restore_snapshot(const RecoveryInputs& in, std::int64_t low, const std::string& reconciled,
                      RecoveryPlan& plan) {
  if (!in.snapshot.snapshot) {
    plan.snapshot_refusal = in.snapshot.refusal;
    return false;
  }
  const auto& s = *in.snapshot.snapshot;
  // S < L with S < C: committed records [S, min(C, L)) the filter must
  // learn are gone. (S == C < L misses nothing that anyone could replay.)
  if (in.committed && s.next_offset < *in.committed && s.next_offset < low) {
    plan.snapshot_refusal = SnapshotRefusal::kBehindRetention;
    return false;
  }
  if (!in.committed || s.next_offset > *in.committed) {
    plan.snapshot_refusal = SnapshotRefusal::kAheadOfCommit;
    return false;
  }
  plan.filter = RecoveryPlan::FilterSource::kRestored;
  plan.clock_ms = s.clock_ms;
  plan.fetch_from = s.next_offset;
  plan.reason = RecoveryReason::kRestored;
  plan.explanation = fmt::format(
      "{}: restored snapshot at offset {} (committed {}); replaying [{}, {}) in rebuild mode{}",
      in.partition.str(), s.next_offset, *in.committed, s.next_offset, plan.rebuild_until,
      reconciled);
  return true;
}

/// Why the snapshot was not used, for the plan's log line.
std::string describe_refusal(const RecoveryInputs& in, std::int64_t low, SnapshotRefusal refusal) {
  switch (refusal) {
    case SnapshotRefusal::kAheadOfCommit:
      return in.committed
                 ? fmt::format(
                       "snapshot at offset {} refused: it is ahead of the committed offset {} "
                       "and would hide undelivered records",
                       in.snapshot.snapshot->next_offset, *in.committed)
                 : fmt::format(
                       "snapshot at offset {} refused: it is ahead of what the group committed "
                       "(the group has no committed offset for it) and would hide undelivered "
                       "records",
                       in.snapshot.snapshot->next_offset);
    case SnapshotRefusal::kBehindRetention:
      return fmt::format(
          "snapshot at offset {} refused: the input's retention already deleted offsets "
          "below {}, so the records after the snapshot cannot all be replayed",
          in.snapshot.snapshot->next_offset, low);
    case SnapshotRefusal::kMissing:
      return "no snapshot";
    default:
      return fmt::format("snapshot not usable ({}){}", to_string(refusal),
                         in.snapshot.message.empty() ? "" : ": " + in.snapshot.message);
  }
}

/// Step 2, with a committed offset C and a known window start: an empty
/// filter rebuilt from one window before C.
void plan_rebuild(const RecoveryInputs& in, std::int64_t low, const std::string& refusal,
                  const std::string& reconciled, RecoveryPlan& plan) {
  // offsetsForTimes may answer past C when the clock of later records ran
  // backwards; never start after the committed position, nor before the
  // oldest record still stored.
  plan.fetch_from = std::max(low, std::min(*in.window_start_offset, *in.committed));
  // offsetsForTimes answers the first record at or after the target: when
  // that is the oldest stored record, older ones in the window may have
  // been deleted already.
  plan.window_past_retention = low > 0 && *plan.fetch_from == low;
  plan.reason = RecoveryReason::kRebuildFromWindow;
  plan.explanation = fmt::format(
      "{}: {}; rebuilding from offset {} (one window of {} ms before committed {}) from what "
      "was delivered, replaying [{}, {}) in rebuild mode{}{}",
      in.partition.str(), refusal, *plan.fetch_from, in.window_ms, *in.committed, *plan.fetch_from,
      plan.rebuild_until, reconciled,
      plan.window_past_retention
          ? fmt::format(
                "; the window may reach back past the input's retention (oldest stored offset "
                "{}): deliveries before it are learned from the output records themselves; "
                "those the output no longer holds cannot be known, a duplicate of one can "
                "pass once",
                low)
          : "");
}

}  // namespace

Result<RecoveryPlan> plan_recovery(const RecoveryInputs& in) {
  if (auto s = check_inputs(in); !s) return tl::unexpected(s.error());
  const std::string where = in.partition.str();
  RecoveryPlan plan;
  // Everything already emitted (H) and everything committed (C) must be
  // replayed without emitting: max(C, H + 1).
  plan.rebuild_until =
      std::max(in.committed.value_or(0), in.highest_emitted ? *in.highest_emitted + 1 : 0);
  plan.committed_until = in.committed.value_or(0);
  const std::int64_t low = in.low_watermark.value_or(0);
  const std::string reconciled =
      in.highest_emitted
          ? fmt::format("; output already holds source offsets up to {}", *in.highest_emitted)
          : "";

  // 1. The snapshot, if any, must be covered by a commit (S <= C).
  if (restore_snapshot(in, low, reconciled, plan)) return plan;
  const std::string refusal = describe_refusal(in, low, *plan.snapshot_refusal);

  // 2. Empty filter.
  plan.filter = RecoveryPlan::FilterSource::kEmpty;
  plan.clock_ms = 0;
  if (!in.committed) {
    // Nothing committed: there is no position to rebuild up to except what
    // reconciliation found; the consumer's reset policy picks the start.
    plan.fetch_from.reset();
    plan.reason = RecoveryReason::kFreshPartition;
    plan.explanation = fmt::format(
        "{}: {}; no committed offset, starting from the consumer's reset position{}{}", where,
        refusal,
        in.highest_emitted
            ? fmt::format(" and replaying up to offset {} in rebuild mode", plan.rebuild_until)
            : std::string(),
        reconciled);
    return plan;
  }
  if (in.window_start_offset && *in.committed > low) {
    plan_rebuild(in, low, refusal, reconciled, plan);
    return plan;
  }
  plan.fetch_from = std::max(low, *in.committed);
  plan.reason = RecoveryReason::kNoHistory;
  plan.explanation = fmt::format(
      "{}: {}; no record found in the window before committed offset {}, starting empty at "
      "offset {} (replaying up to {} in rebuild mode){}",
      where, refusal, *in.committed, *plan.fetch_from, plan.rebuild_until, reconciled);
  return plan;
}

void SnapshotGate::committed(const PartitionId& partition, std::int64_t offset) {
  std::lock_guard lock(mu_);
  auto [it, inserted] = committed_.try_emplace(partition, offset);
  if (!inserted) it->second = std::max(it->second, offset);
}

void SnapshotGate::forget(const PartitionId& partition) {
  std::lock_guard lock(mu_);
  committed_.erase(partition);
}

bool SnapshotGate::may_snapshot(const PartitionId& partition, std::int64_t next_offset) {
  std::lock_guard lock(mu_);
  auto it = committed_.find(partition);
  if (it != committed_.end() && next_offset <= it->second) return true;
  ++refused_;
  return false;
}

std::optional<std::int64_t> SnapshotGate::committed_offset(const PartitionId& partition) const {
  std::lock_guard lock(mu_);
  auto it = committed_.find(partition);
  if (it == committed_.end()) return std::nullopt;
  return it->second;
}

std::uint64_t SnapshotGate::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
}

}  // namespace kdedup::pipeline
