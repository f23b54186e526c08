#pragma once
// Consumed librdkafka messages seen as identity::RecordView (key, value,
// headers) without copying: header names and values are read with
// librdkafka's C API, which points into the message (its C++ Headers
// copies every header). Views are valid while the messages live.
//
// MessageView: one message at a time (recovery's output reads). BatchView:
// a whole batch as pipeline::RecordIn for the PartitionProcessor. One per
// thread; each call reuses the previous call's buffers.
//
// MessagePtr: a consumed record as the consumer loop takes it, librdkafka's
// C message (batches through the C API: no wrapper object per record).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafkacpp.h>

#include "kdedup/identity/record.h"
#include "kdedup/pipeline/partition_processor.h"

namespace kdedup::pipeline {

struct MessageFree {
  void operator()(rd_kafka_message_t* m) const noexcept { rd_kafka_message_destroy(m); }
};
using MessagePtr = std::unique_ptr<rd_kafka_message_t, MessageFree>;

/// The record's timestamp in milliseconds; 0 when it has none.
[[nodiscard]] inline std::int64_t timestamp_ms(const rd_kafka_message_t& m) {
  rd_kafka_timestamp_type_t type = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
  const std::int64_t ts = rd_kafka_message_timestamp(&m, &type);
  return type == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? 0 : ts;
}
[[nodiscard]] inline std::int64_t timestamp_ms(RdKafka::Message& m) {
  return timestamp_ms(*m.c_ptr());
}

class MessageView {
 public:
  /// The record view of `m`, valid until the next call.
  const identity::RecordView& of(const rd_kafka_message_t& m);
  const identity::RecordView& of(RdKafka::Message& m) { return of(*m.c_ptr()); }

 private:
  std::vector<identity::RecordHeader> headers_;
  identity::RecordView view_;
};

class BatchView {
 public:
  /// The records of `messages` (of one partition, in order), valid until the
  /// next call. With `headers` false their header lists are left empty and
  /// unparsed (librdkafka parses a record's headers, with an allocation even
  /// when it has none, on first access): for identity specs without a
  /// header part, so a record that is dropped never has them parsed.
  std::span<const RecordIn> of(std::span<const MessagePtr> messages, bool headers);

 private:
  std::vector<RecordIn> records_;
  std::vector<identity::RecordHeader> headers_;
  std::vector<std::size_t> first_;  // index of each record's first header
};

}  // namespace kdedup::pipeline
