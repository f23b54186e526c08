#include "kdedup/testbroker/mock_cluster.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <fmt/format.h>

#include "kdedup/common/kafka_log.h"

namespace kdedup::testbroker {

namespace {

/// The hosting client's log lines (and the mock brokers') into the process's
/// log instead of librdkafka's raw stderr lines.
void log_line(const rd_kafka_t* /*rk*/, int level, const char* fac, const char* buf) {
  log_librdkafka("test broker", level, fac, buf);
}

struct KafkaDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
struct ConfDeleter {
  void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};
struct MockDeleter {
  void operator()(rd_kafka_mock_cluster_t* mc) const { rd_kafka_mock_cluster_destroy(mc); }
};

}  // namespace

// Member order matters: the mock cluster must be destroyed before the client
// handle that created it.
struct MockCluster::Handles {
  std::unique_ptr<rd_kafka_t, KafkaDeleter> client;
  std::unique_ptr<rd_kafka_mock_cluster_t, MockDeleter> cluster;
};

MockCluster::MockCluster(std::unique_ptr<Handles> handles, int brokers)
    : handles_(std::move(handles)),
      brokers_(brokers),
      bootstrap_(rd_kafka_mock_cluster_bootstraps(handles_->cluster.get())) {}

MockCluster::~MockCluster() = default;

Result<std::unique_ptr<MockCluster>> MockCluster::start(int brokers) {
  if (brokers < 1 || brokers > 64) {
    return fail(fmt::format("brokers: {} is out of range (1..64)", brokers));
  }
  // The mock cluster needs a client instance to host it; it never connects.
  std::unique_ptr<rd_kafka_conf_t, ConfDeleter> conf(rd_kafka_conf_new());
  char err[512];
  if (rd_kafka_conf_set(conf.get(), "log_level", "3", err, sizeof err) != RD_KAFKA_CONF_OK) {
    return fail(std::string("mock cluster: ") + err);
  }
  rd_kafka_conf_set_log_cb(conf.get(), log_line);
  auto handles = std::make_unique<Handles>();
  handles->client.reset(rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), err, sizeof err));
  if (!handles->client) return fail(std::string("mock cluster: cannot create client: ") + err);
  conf.release();  // owned by the client from here on
  handles->cluster.reset(rd_kafka_mock_cluster_new(handles->client.get(), brokers));
  if (!handles->cluster) {
    return fail("mock cluster: cannot start (could not bind loopback listeners?)");
  }
  return std::unique_ptr<MockCluster>(new MockCluster(std::move(handles), brokers));
}

Status MockCluster::check_broker(std::int32_t broker) const {
  if (broker < 1 || broker > brokers_) {
    return fail(fmt::format("no broker {} (brokers are 1..{})", broker, brokers_));
  }
  return {};
}

Status MockCluster::create_topic(const std::string& name, int partitions, int replication) {
  if (name.empty()) return fail("topic name is empty");
  if (partitions < 1 || partitions > 10000) {
    return fail(fmt::format("topic {}: partitions {} out of range (1..10000)", name, partitions));
  }
  if (replication == 0) replication = brokers_ < 3 ? brokers_ : 3;
  if (replication < 1 || replication > brokers_) {
    return fail(fmt::format("topic {}: replication {} out of range (1..{} brokers)", name,
                            replication, brokers_));
  }
  rd_kafka_resp_err_t e =
      rd_kafka_mock_topic_create(handles_->cluster.get(), name.c_str(), partitions, replication);
  if (e) return fail(fmt::format("topic {}: {}", name, rd_kafka_err2str(e)));
  return {};
}

Status MockCluster::set_broker_up(std::int32_t broker, bool up) {
  if (auto ok = check_broker(broker); !ok) return ok;
  rd_kafka_resp_err_t e = up ? rd_kafka_mock_broker_set_up(handles_->cluster.get(), broker)
                             : rd_kafka_mock_broker_set_down(handles_->cluster.get(), broker);
  if (e) return fail(fmt::format("broker {}: {}", broker, rd_kafka_err2str(e)));
  return {};
}

Status MockCluster::set_rtt(std::int32_t broker, int rtt_ms) {
  if (auto ok = check_broker(broker); !ok) return ok;
  if (rtt_ms < 0) return fail(fmt::format("rtt {} ms is negative", rtt_ms));
  rd_kafka_resp_err_t e = rd_kafka_mock_broker_set_rtt(handles_->cluster.get(), broker, rtt_ms);
  if (e) return fail(fmt::format("broker {}: {}", broker, rd_kafka_err2str(e)));
  return {};
}

void MockCluster::push_request_errors(std::int16_t api_key, const std::vector<int>& errors) {
  if (errors.empty()) {
    rd_kafka_mock_clear_request_errors(handles_->cluster.get(), api_key);
    return;
  }
  std::vector<rd_kafka_resp_err_t> codes;
  codes.reserve(errors.size());
  for (int e : errors) codes.push_back(static_cast<rd_kafka_resp_err_t>(e));
  rd_kafka_mock_push_request_errors_array(handles_->cluster.get(), api_key, codes.size(),
                                          codes.data());
}

}  // namespace kdedup::testbroker
