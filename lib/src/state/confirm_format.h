#pragma once
// Internal: the confirm store's keys and its per-partition meta record
// (layout in kdedup/state/confirm_store.h).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kdedup/filter/fingerprint.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/state/snapshot.h"

namespace kdedup::state::confirm {

inline constexpr char kEntryTag = 'e';
inline constexpr char kMetaTag = 'm';
inline constexpr std::string_view kNextIdKey = "n";
inline constexpr std::size_t kEntryKeyBytes = 1 + 4 + 16;
inline constexpr std::size_t kEntryValueBytes = 8;
/// Envelope kind of a meta record (kdedup/common/bytes.h).
inline constexpr std::uint16_t kMetaKind = 0x434D;  // "CM"
inline constexpr std::uint16_t kMetaVersion = 1;

/// 'e' | id (BE): every entry of one partition starts with it.
[[nodiscard]] std::string entry_prefix(std::uint32_t id);
/// entry_prefix(id) | fp.hi (BE) | fp.lo (BE), written into `out`.
void entry_key(std::uint32_t id, const filter::Fingerprint& fp, std::string& out);
[[nodiscard]] std::string encode_tick(filter::Tick tick);
/// The partition id of an entry key; none for other keys.
[[nodiscard]] std::optional<std::uint32_t> entry_id(std::string_view key) noexcept;
/// The tick of an entry value; none when it is not 8 bytes.
[[nodiscard]] std::optional<filter::Tick> decode_tick(std::string_view value) noexcept;

/// 'm' | u16 topic length (BE) | topic | u32 partition (BE).
[[nodiscard]] std::string meta_key(const PartitionKey& key);
[[nodiscard]] std::optional<PartitionKey> parse_meta_key(std::string_view key);

/// What the store keeps about one partition.
struct Meta {
  std::uint32_t id = 0;
  std::int64_t window_ms = 0;
  std::uint32_t ticks_per_window = 0;
  /// The snapshot the entries belong to: the database holds exactly the
  /// deliveries below `bound_offset` (confirm_store.h, "Recovery").
  bool bound = false;
  std::int64_t bound_offset = 0;
  std::int64_t bound_created_ms = 0;
  std::int64_t bound_clock_ms = 0;
  /// A move of staged deliveries up to this offset started and has not been
  /// recorded as finished: the entries may reach past the binding. -1: none.
  std::int64_t flushing_to = -1;
  /// The expiry horizon (a tick of the partition's mapping).
  filter::Tick horizon = 0;
};

[[nodiscard]] std::string encode_meta(const Meta& meta);
[[nodiscard]] Result<Meta> decode_meta(std::string_view value);

}  // namespace kdedup::state::confirm
