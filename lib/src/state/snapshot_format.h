#pragma once
// Internal: the on-disk encoding of snapshots (keys, manifest, chunks).
// Only the store reads and writes it; see snapshot_store.h for the layout.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/state/snapshot.h"

namespace kdedup::state::format {

/// Envelope kinds (kdedup/common/bytes.h); distinct from the filter kinds.
inline constexpr std::uint16_t kManifestKind = 0x4D46;  // "MF"
inline constexpr std::uint16_t kChunkKind = 0x4348;     // "CH"
/// Snapshot format this build writes and reads.
inline constexpr std::uint16_t kVersion = 1;  ///< chunks
/// Manifests: 2 adds the tick scale fingerprint; 1 is still read (its
/// snapshots are refused as config_changed: ticks of the old mapping).
inline constexpr std::uint16_t kManifestVersion = 2;

inline constexpr char kManifestTag = 'm';
inline constexpr char kChunkTag = 'c';

/// XXH3-128 of a chunk's bytes: its identity. 128 bits so that two different
/// chunks of one partition never share a key.
struct ChunkId {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  friend bool operator==(const ChunkId&, const ChunkId&) = default;
};
struct ChunkIdHash {
  std::size_t operator()(const ChunkId& id) const noexcept { return id.lo ^ (id.hi << 1); }
};
[[nodiscard]] ChunkId chunk_id(std::string_view bytes) noexcept;
[[nodiscard]] std::string to_hex(const ChunkId& id);

/// tag | u16 topic length (big-endian) | topic | u32 partition (big-endian).
/// Length-prefixing the topic makes the prefix of one partition never a
/// prefix of another's, so a range delete of it is exact.
[[nodiscard]] std::string partition_prefix(char tag, const PartitionKey& key);
[[nodiscard]] std::string manifest_key(const PartitionKey& key);
[[nodiscard]] std::string chunk_key(const PartitionKey& key, const ChunkId& id);
/// Smallest string greater than every string starting with `prefix`.
[[nodiscard]] std::string prefix_end(std::string prefix);
/// Inverse of manifest_key(); error when the key is not a manifest key.
[[nodiscard]] Result<PartitionKey> parse_manifest_key(std::string_view key);

struct Manifest {
  SnapshotInfo info;             ///< disk_bytes is not stored
  std::uint64_t state_hash = 0;  ///< XXH3-64 of the whole state blob
  std::vector<ChunkId> chunks;   ///< in state order; equal chunks repeat the id
};

[[nodiscard]] std::string encode_manifest(const Manifest& manifest);
/// Checks the envelope, kind, version and fields; `stored_under` is the key the
/// manifest was found at and must match the one inside.
[[nodiscard]] LoadResult<Manifest> decode_manifest(std::string_view value,
                                                   const PartitionKey& stored_under);

[[nodiscard]] std::string encode_chunk(std::string_view bytes);
/// Checks the envelope, that the bytes hash to `id` and have `expected_size`.
/// `index` only names the chunk in messages.
[[nodiscard]] LoadResult<std::string_view> decode_chunk(std::string_view value, std::size_t index,
                                                        const ChunkId& id,
                                                        std::size_t expected_size);

}  // namespace kdedup::state::format
