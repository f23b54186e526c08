#include "kafka_errors.h"

#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include "kdedup/common/kafka_log.h"

namespace kdedup::pipeline {

namespace {

const char* hint(RdKafka::ErrorCode code) {
  switch (code) {
    case RdKafka::ERR__TRANSPORT:
    case RdKafka::ERR__ALL_BROKERS_DOWN:
    case RdKafka::ERR__RESOLVE:
      return "check kafka.bootstrap.servers and that the brokers are reachable";
    case RdKafka::ERR__TIMED_OUT:
    case RdKafka::ERR_REQUEST_TIMED_OUT:
      return "the cluster did not answer in time; check broker health and network";
    case RdKafka::ERR__MSG_TIMED_OUT:
      return "the record was not delivered within producer message.timeout.ms; check that the "
             "output topic's leaders are available";
    case RdKafka::ERR_UNKNOWN_TOPIC_OR_PART:
    case RdKafka::ERR__UNKNOWN_TOPIC:
      return "the topic does not exist; create it (or check the topic name in the config)";
    case RdKafka::ERR__UNKNOWN_PARTITION:
      return "the partition does not exist in that topic; the output topic needs at least as "
             "many partitions as each input topic with output.partitioning: input";
    case RdKafka::ERR_MSG_SIZE_TOO_LARGE:
    case RdKafka::ERR_RECORD_LIST_TOO_LARGE:
      return "the record is larger than the producer or topic accepts; raise "
             "producer.message.max.bytes and the topic's max.message.bytes";
    case RdKafka::ERR_TOPIC_AUTHORIZATION_FAILED:
      return "this client may not use the topic; grant it the needed ACLs";
    case RdKafka::ERR_GROUP_AUTHORIZATION_FAILED:
      return "this client may not join the consumer group; grant it group ACLs";
    case RdKafka::ERR_CLUSTER_AUTHORIZATION_FAILED:
      return "the idempotent producer needs the IdempotentWrite cluster ACL";
    case RdKafka::ERR__AUTHENTICATION:
    case RdKafka::ERR_SASL_AUTHENTICATION_FAILED:
      return "check the security.protocol and SASL / SSL settings under kafka";
    case RdKafka::ERR__FENCED:
    case RdKafka::ERR_PRODUCER_FENCED:
    case RdKafka::ERR_FENCED_INSTANCE_ID:
      return "another process uses the same group.instance.id or transactional id; give "
             "each instance its own";
    case RdKafka::ERR__QUEUE_FULL:
      return "the producer queue is full; raise producer queue.buffering.max.messages";
    case RdKafka::ERR_INVALID_TIMESTAMP:
      return "the broker rejected the record timestamp; check the topic's "
             "message.timestamp.difference.max.ms";
    default:
      return nullptr;
  }
}

}  // namespace

std::string describe_kafka_error(RdKafka::ErrorCode code) {
  std::string text = RdKafka::err2str(code) + " (" +
                     rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(code)) + ")";
  if (const char* h = hint(code)) text += ": " + std::string(h);
  return text;
}

void ClientLog::event_cb(RdKafka::Event& event) {
  if (event.type() == RdKafka::Event::EVENT_LOG) {
    log_librdkafka(client_, event.severity(), event.fac(), event.str());
  } else if (event.type() == RdKafka::Event::EVENT_ERROR) {
    spdlog::warn("{}: {} ({})", client_, describe_kafka_error(event.err()), event.str());
  }
}

}  // namespace kdedup::pipeline
