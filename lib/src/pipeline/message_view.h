#pragma once
// A consumed librdkafka message seen as an identity::RecordView (key, value,
// headers) and its timestamp, for the identity extractors. librdkafka's C++
// Header returns names by value, so the view keeps copies of the header
// objects and names; the buffers are reused from record to record.
//
// One per thread (a worker, the consumer thread during recovery); a view
// is valid until the next call or until the message is destroyed.

#include <cstdint>
#include <string>
#include <vector>

#include <librdkafka/rdkafkacpp.h>

#include "kdedup/identity/record.h"

namespace kdedup::pipeline {

class MessageView {
 public:
  /// The record view of `m` (header values are views into `m`'s copies).
  const identity::RecordView& of(RdKafka::Message& m);

 private:
  std::vector<RdKafka::Headers::Header> copies_;
  std::vector<std::string> names_;
  std::vector<identity::RecordHeader> headers_;
  identity::RecordView view_;
};

/// The record's timestamp in milliseconds; 0 when it has none.
[[nodiscard]] inline std::int64_t timestamp_ms(const RdKafka::Message& m) {
  const auto ts = m.timestamp();
  return ts.type == RdKafka::MessageTimestamp::MSG_TIMESTAMP_NOT_AVAILABLE ? 0 : ts.timestamp;
}

}  // namespace kdedup::pipeline
