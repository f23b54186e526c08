// The confirm store's keys and meta record (confirm_format.h).

#include "confirm_format.h"

#include <cstring>
#include <type_traits>

#include "kdedup/common/bytes.h"

namespace kdedup::state::confirm {
namespace {

void put_be32(std::string& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
}
void put_be64(std::string& out, std::uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
}
std::uint32_t get_be32(std::string_view in) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v = (v << 8) | static_cast<unsigned char>(in[static_cast<std::size_t>(i)]);
  return v;
}

}  // namespace

std::string entry_prefix(std::uint32_t id) {
  std::string out(1, kEntryTag);
  put_be32(out, id);
  return out;
}

void entry_key(std::uint32_t id, const filter::Fingerprint& fp, std::string& out) {
  out.clear();
  out.push_back(kEntryTag);
  put_be32(out, id);
  put_be64(out, fp.hi);
  put_be64(out, fp.lo);
}

std::string encode_tick(filter::Tick tick) {
  std::string out;
  ByteWriter(out).put<std::uint64_t>(tick);
  return out;
}

std::optional<std::uint32_t> entry_id(std::string_view key) noexcept {
  if (key.size() != kEntryKeyBytes || key[0] != kEntryTag) return std::nullopt;
  return get_be32(key.substr(1, 4));
}

std::optional<filter::Tick> decode_tick(std::string_view value) noexcept {
  if (value.size() != kEntryValueBytes) return std::nullopt;
  std::uint64_t tick = 0;
  std::memcpy(&tick, value.data(), sizeof tick);
  return tick;
}

std::string meta_key(const PartitionKey& key) {
  std::string out(1, kMetaTag);
  out.push_back(static_cast<char>(key.topic.size() >> 8));
  out.push_back(static_cast<char>(key.topic.size() & 0xff));
  out += key.topic;
  put_be32(out, static_cast<std::uint32_t>(key.partition));
  return out;
}

std::optional<PartitionKey> parse_meta_key(std::string_view key) {
  if (key.size() < 1 + 2 + 4 || key[0] != kMetaTag) return std::nullopt;
  const std::size_t len = (static_cast<std::size_t>(static_cast<unsigned char>(key[1])) << 8) |
                          static_cast<unsigned char>(key[2]);
  if (key.size() != 1 + 2 + len + 4) return std::nullopt;
  PartitionKey out;
  out.topic = std::string(key.substr(3, len));
  out.partition = static_cast<std::int32_t>(get_be32(key.substr(3 + len, 4)));
  return out;
}

std::string encode_meta(const Meta& m) {
  std::string payload;
  ByteWriter w(payload);
  w.put<std::uint32_t>(m.id);
  w.put<std::int64_t>(m.window_ms);
  w.put<std::uint32_t>(m.ticks_per_window);
  w.put<std::uint8_t>(m.bound ? 1 : 0);
  w.put<std::int64_t>(m.bound_offset);
  w.put<std::int64_t>(m.bound_created_ms);
  w.put<std::int64_t>(m.bound_clock_ms);
  w.put<std::int64_t>(m.flushing_to);
  w.put<std::uint64_t>(m.horizon);
  return seal_envelope(kMetaKind, kMetaVersion, payload);
}

Result<Meta> decode_meta(std::string_view value) {
  auto env = open_envelope(value, "confirm store partition record");
  if (!env) return tl::unexpected(env.error());
  if (env->kind != kMetaKind || env->version != kMetaVersion) {
    return fail("confirm store partition record of an unknown kind or version " +
                std::to_string(env->version));
  }
  ByteReader r(env->payload);
  Meta m;
  std::optional<Error> error;
  // Reads one field into `out`; after the first failure nothing more.
  auto read = [&](auto& out, const char* field) {
    using T = std::remove_reference_t<decltype(out)>;
    if (error) return;
    auto v = r.get<T>(field);
    if (v) {
      out = *v;
    } else {
      error = v.error();
    }
  };
  std::uint8_t bound = 0;
  read(m.id, "id");
  read(m.window_ms, "window");
  read(m.ticks_per_window, "ticks per window");
  read(bound, "bound");
  read(m.bound_offset, "bound offset");
  read(m.bound_created_ms, "bound creation time");
  read(m.bound_clock_ms, "bound clock");
  read(m.flushing_to, "flushing offset");
  read(m.horizon, "horizon");
  if (error) return tl::unexpected(*error);
  if (auto end = r.expect_end("confirm store partition record"); !end) {
    return tl::unexpected(end.error());
  }
  m.bound = bound != 0;
  return m;
}

}  // namespace kdedup::state::confirm
