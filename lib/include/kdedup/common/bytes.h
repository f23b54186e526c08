#pragma once
// Little-endian binary encoding with bounds checks, and the checksummed
// envelope every persisted kdedup blob travels in (filter state, snapshots).
//
// Envelope layout (all little-endian):
//   magic "KDDP" | u16 format version | u16 kind | u64 payload size |
//   payload | u64 XXH3-64 of everything before it
// A reader rejects a wrong magic, kind or version, a size that does not match
// the input, and any checksum mismatch, so a truncated or flipped blob is an
// error, never a silently different value.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "kdedup/common/result.h"

namespace kdedup {

/// Appends fixed-width little-endian values to a string. Not thread-safe.
class ByteWriter {
 public:
  explicit ByteWriter(std::string& out) : out_(out) {}

  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& value) {
    static_assert(std::endian::native == std::endian::little, "little-endian hosts only");
    const auto* p = reinterpret_cast<const char*>(&value);
    out_.append(p, sizeof(T));
  }
  /// Raw bytes without a length; the reader must know the size.
  void put_bytes(std::string_view bytes) { out_.append(bytes); }
  /// u64 length followed by the bytes.
  void put_string(std::string_view bytes) {
    put<std::uint64_t>(bytes.size());
    out_.append(bytes);
  }

 private:
  std::string& out_;
};

/// Reads what ByteWriter wrote; every read checks that enough input remains
/// and reports which field ran short.
class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}

  template <class T>
  requires std::is_trivially_copyable_v<T>
  [[nodiscard]] Result<T> get(const char* field) {
    if (in_.size() - pos_ < sizeof(T)) return truncated(field);
    T value;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  [[nodiscard]] Result<std::string_view> get_bytes(std::size_t n, const char* field) {
    if (in_.size() - pos_ < n) return truncated(field);
    std::string_view out = in_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  [[nodiscard]] Result<std::string_view> get_string(const char* field) {
    auto n = get<std::uint64_t>(field);
    if (!n) return tl::unexpected(n.error());
    return get_bytes(*n, field);
  }
  std::size_t remaining() const { return in_.size() - pos_; }
  /// Error unless every byte was consumed (trailing garbage is corruption).
  [[nodiscard]] Status expect_end(const char* what) const;

 private:
  tl::unexpected<Error> truncated(const char* field) const {
    return fail(std::string("truncated input: ran out of bytes reading ") + field);
  }
  std::string_view in_;
  std::size_t pos_ = 0;
};

/// Wraps `payload` in a checksummed envelope of the given kind and version.
[[nodiscard]] std::string seal_envelope(std::uint16_t kind, std::uint16_t version,
                                        std::string_view payload);

/// Bytes of the envelope header before the payload, and of the checksum after.
inline constexpr std::size_t kEnvelopeHeaderBytes = 16;
inline constexpr std::size_t kEnvelopeTrailerBytes = 8;

/// The same envelope as seal_envelope(), without copying a large payload:
/// `buffer` holds kEnvelopeHeaderBytes placeholder bytes followed by the
/// payload (reserve kEnvelopeTrailerBytes more so the checksum fits without a
/// reallocation). Fills in the header, appends the checksum, returns buffer.
[[nodiscard]] std::string seal_envelope_in_place(std::uint16_t kind, std::uint16_t version,
                                                 std::string buffer);

/// Header of an opened envelope; `payload` points into the input.
struct Envelope {
  std::uint16_t kind;
  std::uint16_t version;
  std::string_view payload;
};

/// Verifies magic, size and checksum and returns the payload. `what` names the
/// blob in error messages ("timer filter state").
[[nodiscard]] Result<Envelope> open_envelope(std::string_view blob, const char* what);

/// XXH3-64 of `bytes` with the given seed.
[[nodiscard]] std::uint64_t hash64(std::string_view bytes, std::uint64_t seed = 0);

}  // namespace kdedup
