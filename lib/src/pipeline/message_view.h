#pragma once
// Consumed librdkafka messages seen as identity::RecordView (key, value,
// headers) without copying: header names and values are read with
// librdkafka's C API, which points into the message (its C++ Headers
// copies every header). Views are valid while the messages live.
//
// MessageView: one message at a time (recovery's output reads). BatchView:
// a whole batch as pipeline::RecordIn for the PartitionProcessor. One per
// thread; each call reuses the previous call's buffers.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <librdkafka/rdkafkacpp.h>

#include "kdedup/identity/record.h"
#include "kdedup/pipeline/partition_processor.h"

namespace kdedup::pipeline {

/// The record's timestamp in milliseconds; 0 when it has none.
[[nodiscard]] inline std::int64_t timestamp_ms(const RdKafka::Message& m) {
  const auto ts = m.timestamp();
  return ts.type == RdKafka::MessageTimestamp::MSG_TIMESTAMP_NOT_AVAILABLE ? 0 : ts.timestamp;
}

class MessageView {
 public:
  /// The record view of `m`, valid until the next call.
  const identity::RecordView& of(RdKafka::Message& m);

 private:
  std::vector<identity::RecordHeader> headers_;
  identity::RecordView view_;
};

class BatchView {
 public:
  /// The records of `messages` (of one partition, in order), valid until the
  /// next call.
  std::span<const RecordIn> of(std::span<const std::unique_ptr<RdKafka::Message>> messages);

 private:
  std::vector<RecordIn> records_;
  std::vector<identity::RecordHeader> headers_;
  std::vector<std::size_t> first_;  // index of each record's first header
};

}  // namespace kdedup::pipeline
