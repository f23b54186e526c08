// Value-type helpers of the snapshot store and step 1 of a snapshot (the
// capture on the worker thread).

#include "kdedup/state/snapshot.h"

#include <algorithm>

#include "kdedup/common/partitions.h"

namespace kdedup::state {

std::string PartitionKey::to_string() const { return topic + "/" + std::to_string(partition); }

std::string summarize(std::vector<PartitionKey> keys) {
  std::vector<std::pair<std::string, std::int32_t>> parts;
  parts.reserve(keys.size());
  for (auto& k : keys) parts.emplace_back(std::move(k.topic), k.partition);
  return summarize_partitions(std::move(parts));
}

StateFingerprint state_fingerprint(const filter::FilterConfig& config,
                                   const filter::TickScale& scale, std::uint64_t salt_check) {
  return StateFingerprint{filter::config_fingerprint(config), salt_check, scale.fingerprint()};
}

SnapshotCapture capture_snapshot(PartitionKey key, const filter::SlidingFilter& filter,
                                 const filter::TickScale& scale, std::int64_t next_offset,
                                 std::int64_t clock_ms, std::uint64_t salt_check) {
  const auto start = std::chrono::steady_clock::now();
  SnapshotCapture c;
  c.key = std::move(key);
  c.next_offset = next_offset;
  c.clock_ms = clock_ms;
  c.fingerprint = state_fingerprint(filter.config(), scale, salt_check);
  c.filter_type = filter.type();
  // The only work on the worker: everything else (hashing, diffing, writing)
  // happens on the store's writer thread.
  c.state = filter.serialize();
  c.capture_time = std::chrono::steady_clock::now() - start;
  return c;
}

const char* to_string(LoadFailure reason) noexcept {
  switch (reason) {
    case LoadFailure::kMissing:
      return "missing";
    case LoadFailure::kCorrupt:
      return "corrupt";
    case LoadFailure::kConfigChanged:
      return "config_changed";
    case LoadFailure::kFormatUnknown:
      return "format_unknown";
    case LoadFailure::kReadError:
      return "read_error";
    case LoadFailure::kConfirmStore:
      return "confirm_store";
  }
  return "unknown";
}

}  // namespace kdedup::state
