#pragma once
// MockCluster: an in-process Kafka-protocol cluster (librdkafka's mock
// cluster) listening on loopback. Real clients (kcat, librdkafka, the kdedup
// pipeline) connect to bootstrap() as to any Kafka cluster.
//
// Known limits (librdkafka 2.0.2): at most ~5 MiB kept per partition (older
// records are dropped), no transaction markers, offsets sent in a transaction
// are not stored, zombie producers are not fenced.
//
// Ownership: one owner (the `kdedup testbroker` process or a test). The mock
// runs its own I/O thread; every method here only posts a request to it, so
// methods may be called from any one thread at a time.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kdedup/common/result.h"

namespace kdedup::testbroker {

class MockCluster {
 public:
  /// Starts `brokers` mock brokers (ids 1..brokers) on 127.0.0.1, random ports.
  [[nodiscard]] static Result<std::unique_ptr<MockCluster>> start(int brokers);

  ~MockCluster();
  MockCluster(const MockCluster&) = delete;
  MockCluster& operator=(const MockCluster&) = delete;

  /// Comma-separated host:port list for `bootstrap.servers`.
  [[nodiscard]] const std::string& bootstrap() const noexcept { return bootstrap_; }
  [[nodiscard]] int brokers() const noexcept { return brokers_; }

  /// Creates a topic; replication 0 means min(3, brokers). Fails if the topic
  /// exists or the counts are out of range.
  [[nodiscard]] Status create_topic(const std::string& name, int partitions, int replication = 0);

  /// Takes a broker off the network (connections closed, new ones refused)
  /// or brings it back.
  [[nodiscard]] Status set_broker_up(std::int32_t broker, bool up);

  /// Delays every response of `broker` by `rtt_ms` (0 = no delay).
  [[nodiscard]] Status set_rtt(std::int32_t broker, int rtt_ms);

  /// The next errors.size() requests of `api_key`, cluster-wide, fail with
  /// errors[0], errors[1], ... in order. Empty `errors` clears the stack.
  void push_request_errors(std::int16_t api_key, const std::vector<int>& errors);

 private:
  struct Handles;
  explicit MockCluster(std::unique_ptr<Handles> handles, int brokers);
  [[nodiscard]] Status check_broker(std::int32_t broker) const;

  std::unique_ptr<Handles> handles_;
  int brokers_ = 0;
  std::string bootstrap_;
};

}  // namespace kdedup::testbroker
