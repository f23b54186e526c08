// store_positions() (kafka_clients.h): positions go to librdkafka's offset
// store through the C API, and each position's own result comes back in
// the order the positions were given. No broker: the consumer never
// connects, and storing needs none (it is local to the client).

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <librdkafka/rdkafkacpp.h>

#include "kafka_clients.h"

namespace kdedup::pipeline {
namespace {

std::unique_ptr<RdKafka::KafkaConsumer> offline_consumer() {
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  std::string err;
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"bootstrap.servers", "127.0.0.1:1"},
           {"group.id", "store-positions-test"},
           {"enable.auto.offset.store", "false"},
           // Nothing to commit at close: there is no coordinator to wait for.
           {"enable.auto.commit", "false"},
           {"log_level", "0"}}) {
    EXPECT_EQ(conf->set(k, v, err), RdKafka::Conf::CONF_OK) << err;
  }
  std::unique_ptr<RdKafka::KafkaConsumer> c(RdKafka::KafkaConsumer::create(conf.get(), err));
  EXPECT_TRUE(c) << err;
  return c;
}

TEST(StorePositions, EachPositionsResultInOrder) {
  auto consumer = offline_consumer();
  ASSERT_TRUE(consumer);
  const std::string in = "in", other = "other";
  // Assigned locally: its position can be stored; the others are not
  // assigned, and each is refused on its own.
  std::vector<RdKafka::TopicPartition*> assigned{RdKafka::TopicPartition::create(in, 1)};
  ASSERT_EQ(consumer->assign(assigned), RdKafka::ERR_NO_ERROR);
  RdKafka::TopicPartition::destroy(assigned);

  const auto errors = store_positions(*consumer, {{&other, 0, 5}, {&in, 1, 9}, {&other, 3, 7}});
  ASSERT_EQ(errors.size(), 3U);
  EXPECT_NE(errors[0], RdKafka::ERR_NO_ERROR);
  EXPECT_EQ(errors[1], RdKafka::ERR_NO_ERROR);
  EXPECT_NE(errors[2], RdKafka::ERR_NO_ERROR);

  EXPECT_TRUE(store_positions(*consumer, {}).empty());
  consumer->unassign();
  consumer->close();
}

}  // namespace
}  // namespace kdedup::pipeline
