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

/// The event callback of a short-lived client that needs no more than its
/// log: librdkafka's lines and its errors go to kdedup's log (set it as
/// "event_cb", or librdkafka prints raw "%7|..." lines to stderr). The
/// caller checks the results of its own calls; errors here are transient
/// ones librdkafka retries, logged as warnings. Stateless after
/// construction: one instance may serve any number of clients and threads.
class ClientLog final : public RdKafka::EventCb {
 public:
  /// `client` names the client in log lines; a string literal.
  explicit ClientLog(const char* client) : client_(client) {}
  void event_cb(RdKafka::Event& event) override;

 private:
  const char* client_;
};

}  // namespace kdedup::pipeline
