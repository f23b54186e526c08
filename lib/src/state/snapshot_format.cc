#include "snapshot_format.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>

#include "kdedup/common/bytes.h"

namespace kdedup::state::format {
namespace {

void put_be(std::string& out, std::uint64_t value, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

std::uint64_t get_be(std::string_view in, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(in[i]);
  return v;
}

LoadError corrupt(const PartitionKey& key, const std::string& what) {
  return LoadError{LoadFailure::kCorrupt,
                   "snapshot of " + key.to_string() + " is corrupt: " + what};
}

}  // namespace

ChunkId chunk_id(std::string_view bytes) noexcept {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return ChunkId{h.low64, h.high64};
}

std::string to_hex(const ChunkId& id) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(id.hi),
                static_cast<unsigned long long>(id.lo));
  return buf;
}

std::string partition_prefix(char tag, const PartitionKey& key) {
  std::string out(1, tag);
  put_be(out, key.topic.size(), 2);
  out += key.topic;
  put_be(out, static_cast<std::uint32_t>(key.partition), 4);
  return out;
}

std::string manifest_key(const PartitionKey& key) { return partition_prefix(kManifestTag, key); }

std::string chunk_key(const PartitionKey& key, const ChunkId& id) {
  std::string out = partition_prefix(kChunkTag, key);
  put_be(out, id.hi, 8);
  put_be(out, id.lo, 8);
  return out;
}

std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last != 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return prefix;  // unreachable for our prefixes: the tag byte is never 0xff
}

Result<PartitionKey> parse_manifest_key(std::string_view key) {
  if (key.size() < 1 + 2 + 4 || key[0] != kManifestTag) return fail("not a manifest key");
  const std::size_t len = get_be(key.substr(1), 2);
  if (key.size() != 1 + 2 + len + 4) return fail("manifest key of wrong length");
  PartitionKey out;
  out.topic = std::string(key.substr(3, len));
  out.partition = static_cast<std::int32_t>(get_be(key.substr(3 + len), 4));
  return out;
}

std::string encode_manifest(const Manifest& m) {
  std::string payload;
  ByteWriter w(payload);
  const SnapshotInfo& i = m.info;
  w.put_string(i.key.topic);
  w.put<std::int32_t>(i.key.partition);
  w.put<std::int64_t>(i.next_offset);
  w.put<std::int64_t>(i.clock_ms);
  w.put<std::uint64_t>(i.fingerprint.config);
  w.put<std::uint64_t>(i.fingerprint.salt_check);
  w.put<std::uint64_t>(i.fingerprint.tick_scale);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(i.filter_type));
  w.put<std::int64_t>(i.created_ms);
  w.put<std::uint64_t>(i.logical_bytes);
  w.put<std::uint64_t>(m.state_hash);
  w.put<std::uint32_t>(i.chunk_size);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(m.chunks.size()));
  for (const ChunkId& id : m.chunks) {
    w.put<std::uint64_t>(id.lo);
    w.put<std::uint64_t>(id.hi);
  }
  return seal_envelope(kManifestKind, kManifestVersion, payload);
}

LoadResult<Manifest> decode_manifest(std::string_view value, const PartitionKey& stored_under) {
  auto env = open_envelope(value, "manifest");
  if (!env) return tl::unexpected(corrupt(stored_under, env.error().message));
  if (env->kind != kManifestKind) {
    return tl::unexpected(
        corrupt(stored_under, "manifest record has kind " + std::to_string(env->kind)));
  }
  if (env->version != 1 && env->version != kManifestVersion) {
    return tl::unexpected(
        LoadError{LoadFailure::kFormatUnknown,
                  "snapshot of " + stored_under.to_string() + " has format version " +
                      std::to_string(env->version) + "; this kdedup reads versions 1 and " +
                      std::to_string(kManifestVersion) + " (written by another kdedup release)"});
  }
  ByteReader r(env->payload);
  Manifest m;
  SnapshotInfo& i = m.info;
  i.format_version = env->version;
  auto topic = r.get_string("manifest.topic");
  auto partition = r.get<std::int32_t>("manifest.partition");
  auto next_offset = r.get<std::int64_t>("manifest.next_offset");
  auto clock = r.get<std::int64_t>("manifest.clock_ms");
  auto config = r.get<std::uint64_t>("manifest.config_fingerprint");
  auto salt = r.get<std::uint64_t>("manifest.salt_check");
  // Version 1: the old time -> tick mapping, which no scale matches.
  Result<std::uint64_t> scale = std::uint64_t{0};
  if (env->version >= 2) scale = r.get<std::uint64_t>("manifest.tick_scale");
  auto type = r.get<std::uint8_t>("manifest.filter_type");
  auto created = r.get<std::int64_t>("manifest.created_ms");
  auto logical = r.get<std::uint64_t>("manifest.logical_bytes");
  auto state_hash = r.get<std::uint64_t>("manifest.state_hash");
  auto chunk_size = r.get<std::uint32_t>("manifest.chunk_size");
  auto count = r.get<std::uint32_t>("manifest.chunk_count");
  if (!topic || !partition || !next_offset || !clock || !config || !salt || !scale || !type ||
      !created || !logical || !state_hash || !chunk_size || !count) {
    return tl::unexpected(corrupt(stored_under, "manifest truncated"));
  }
  i.key = PartitionKey{std::string(*topic), *partition};
  if (!(i.key == stored_under)) {
    return tl::unexpected(corrupt(stored_under, "manifest names partition " + i.key.to_string()));
  }
  i.next_offset = *next_offset;
  i.clock_ms = *clock;
  i.fingerprint = StateFingerprint{*config, *salt, *scale};
  i.filter_type = static_cast<filter::FilterType>(*type);
  i.created_ms = *created;
  i.logical_bytes = *logical;
  m.state_hash = *state_hash;
  i.chunk_size = *chunk_size;
  i.chunk_count = *count;
  if (i.chunk_size == 0) return tl::unexpected(corrupt(stored_under, "manifest chunk size is 0"));
  const std::uint64_t expected_chunks = (i.logical_bytes + i.chunk_size - 1) / i.chunk_size;
  if (expected_chunks != i.chunk_count || r.remaining() != std::uint64_t{i.chunk_count} * 16) {
    return tl::unexpected(corrupt(stored_under, "manifest chunk list does not match state size"));
  }
  m.chunks.reserve(i.chunk_count);
  for (std::uint32_t n = 0; n < i.chunk_count; ++n) {
    ChunkId id{*r.get<std::uint64_t>("chunk id"), *r.get<std::uint64_t>("chunk id")};
    m.chunks.push_back(id);
  }
  {
    std::vector<ChunkId> sorted = m.chunks;
    std::sort(sorted.begin(), sorted.end(), [](const ChunkId& a, const ChunkId& b) {
      return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
    });
    i.distinct_chunks =
        static_cast<std::uint32_t>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
  }
  return m;
}

std::string encode_chunk(std::string_view bytes) {
  return seal_envelope(kChunkKind, kVersion, bytes);
}

LoadResult<std::string_view> decode_chunk(std::string_view value, std::size_t index,
                                          const ChunkId& id, std::size_t expected_size) {
  const std::string name = "chunk " + std::to_string(index) + " (" + to_hex(id) + ")";
  auto env = open_envelope(value, name.c_str());
  auto bad = [&](const std::string& what) {
    return tl::unexpected(LoadError{LoadFailure::kCorrupt, what});
  };
  if (!env) return bad(env.error().message);
  if (env->kind != kChunkKind) return bad(name + ": wrong record kind");
  if (env->version != kVersion) return bad(name + ": unknown chunk version");
  if (env->payload.size() != expected_size) {
    return bad(name + ": " + std::to_string(env->payload.size()) + " bytes, expected " +
               std::to_string(expected_size));
  }
  if (!(chunk_id(env->payload) == id)) return bad(name + ": content does not match its id");
  return env->payload;
}

}  // namespace kdedup::state::format
