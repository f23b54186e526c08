#include "kdedup/pipeline/provenance.h"

#include <charconv>
#include <climits>

#include <fmt/format.h>

namespace kdedup::pipeline {

namespace {

/// Strict ASCII decimal, no sign, no spaces, fits int64.
std::optional<std::int64_t> parse_decimal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.front() == '-') return std::nullopt;
  return value;
}

}  // namespace

void ProvenanceHeaders::offer(std::string_view name, std::string_view value,
                              const ProvenanceNames& names) {
  if (name == names.topic && !topic) topic = value;
  if (name == names.partition && !partition) partition = value;
  if (name == names.offset && !offset) offset = value;
}

ProvenanceParse parse_provenance(const ProvenanceHeaders& h, const ProvenanceNames& names) {
  ProvenanceParse out;
  if (!h.topic && !h.partition && !h.offset) return out;
  auto missing = [&](std::string_view name) {
    out.malformed = fmt::format("provenance header '{}' is missing", name);
    return out;
  };
  if (!h.topic) return missing(names.topic);
  if (!h.partition) return missing(names.partition);
  if (!h.offset) return missing(names.offset);
  if (h.topic->empty()) {
    out.malformed = fmt::format("provenance header '{}' is empty", names.topic);
    return out;
  }
  const auto partition = parse_decimal(*h.partition);
  if (!partition || *partition > INT32_MAX) {
    out.malformed = fmt::format("provenance header '{}' is not a partition number: '{}'",
                                names.partition, *h.partition);
    return out;
  }
  const auto offset = parse_decimal(*h.offset);
  if (!offset) {
    out.malformed =
        fmt::format("provenance header '{}' is not an offset: '{}'", names.offset, *h.offset);
    return out;
  }
  out.provenance = Provenance{
      PartitionId{std::string(*h.topic), static_cast<std::int32_t>(*partition)}, *offset};
  return out;
}

}  // namespace kdedup::pipeline
