#include "kdedup/common/bytes.h"

#include <xxhash.h>

#include <cassert>

namespace kdedup {
namespace {
constexpr std::string_view kMagic = "KDDP";
constexpr std::size_t kHeaderSize = 4 + 2 + 2 + 8;
constexpr std::size_t kTrailerSize = 8;
static_assert(kHeaderSize == kEnvelopeHeaderBytes && kTrailerSize == kEnvelopeTrailerBytes);
}  // namespace

Status ByteReader::expect_end(const char* what) const {
  if (remaining() != 0) {
    return fail(std::string(what) + ": " + std::to_string(remaining()) +
                " unexpected trailing bytes");
  }
  return {};
}

std::uint64_t hash64(std::string_view bytes, std::uint64_t seed) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

std::string seal_envelope(std::uint16_t kind, std::uint16_t version, std::string_view payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size() + kTrailerSize);
  ByteWriter w(out);
  w.put_bytes(kMagic);
  w.put<std::uint16_t>(version);
  w.put<std::uint16_t>(kind);
  w.put<std::uint64_t>(payload.size());
  w.put_bytes(payload);
  w.put<std::uint64_t>(hash64(out));
  return out;
}

std::string seal_envelope_in_place(std::uint16_t kind, std::uint16_t version, std::string buffer) {
  assert(buffer.size() >= kHeaderSize);
  const std::uint64_t size = buffer.size() - kHeaderSize;
  char* header = buffer.data();
  std::memcpy(header, kMagic.data(), kMagic.size());
  std::memcpy(header + 4, &version, sizeof version);
  std::memcpy(header + 6, &kind, sizeof kind);
  std::memcpy(header + 8, &size, sizeof size);
  const std::uint64_t sum = hash64(buffer);
  buffer.append(reinterpret_cast<const char*>(&sum), sizeof sum);
  return buffer;
}

Result<Envelope> open_envelope(std::string_view blob, const char* what) {
  const std::string name(what);
  if (blob.size() < kHeaderSize + kTrailerSize) {
    return fail(name + ": truncated (" + std::to_string(blob.size()) + " bytes)");
  }
  if (blob.substr(0, 4) != kMagic) return fail(name + ": not a kdedup blob (bad magic)");
  ByteReader r(blob.substr(4));
  Envelope env{};
  env.version = *r.get<std::uint16_t>("version");
  env.kind = *r.get<std::uint16_t>("kind");
  const auto size = *r.get<std::uint64_t>("size");
  if (size != blob.size() - kHeaderSize - kTrailerSize) {
    return fail(name + ": truncated or padded (header says " + std::to_string(size) +
                " payload bytes, found " +
                std::to_string(blob.size() - kHeaderSize - kTrailerSize) + ")");
  }
  std::uint64_t stored;
  std::memcpy(&stored, blob.data() + blob.size() - kTrailerSize, sizeof stored);
  if (stored != hash64(blob.substr(0, blob.size() - kTrailerSize))) {
    return fail(name + ": checksum mismatch (corrupted)");
  }
  env.payload = blob.substr(kHeaderSize, size);
  return env;
}

}  // namespace kdedup
