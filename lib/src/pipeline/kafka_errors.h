#pragma once
// Translation of librdkafka error codes into messages a person can act on.
// Used at every boundary where a Kafka error leaves the pipeline (logs,
// returned errors, dead-letter headers).

#include <string>

#include <librdkafka/rdkafkacpp.h>

namespace kdedup::pipeline {

/// "<librdkafka's description> (<NAME>)" plus, for common codes, what to check
/// or change, e.g. for MSG_SIZE_TOO_LARGE: "raise producer.message.max.bytes
/// and the topic's max.message.bytes".
[[nodiscard]] std::string describe_kafka_error(RdKafka::ErrorCode code);

}  // namespace kdedup::pipeline
