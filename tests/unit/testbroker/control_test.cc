// The control-channel parser: every command form, and errors that name the
// offending word.

#include "kdedup/testbroker/control.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kdedup::testbroker {
namespace {

using ::testing::HasSubstr;
using Kind = ControlCommand::Kind;

TEST(ControlParse, BrokerDownAndUp) {
  auto down = parse_control_command("broker 2 down");
  ASSERT_TRUE(down) << down.error().message;
  EXPECT_EQ(down->kind, Kind::kBroker);
  EXPECT_EQ(down->broker, 2);
  EXPECT_FALSE(down->up);
  auto up = parse_control_command("  BROKER 3 Up \r");
  ASSERT_TRUE(up) << up.error().message;
  EXPECT_TRUE(up->up);
  EXPECT_EQ(up->broker, 3);
}

TEST(ControlParse, BrokerErrorsNameTheWord) {
  auto bad_state = parse_control_command("broker 1 sideways");
  ASSERT_FALSE(bad_state);
  EXPECT_THAT(bad_state.error().message, HasSubstr("'sideways'"));
  auto bad_id = parse_control_command("broker x down");
  ASSERT_FALSE(bad_id);
  EXPECT_THAT(bad_id.error().message, HasSubstr("'x'"));
  EXPECT_FALSE(parse_control_command("broker 1"));
  EXPECT_FALSE(parse_control_command("broker 0 down"));
}

TEST(ControlParse, Rtt) {
  auto c = parse_control_command("rtt 1 250");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->kind, Kind::kRtt);
  EXPECT_EQ(c->broker, 1);
  EXPECT_EQ(c->rtt_ms, 250);
  EXPECT_FALSE(parse_control_command("rtt 1 -5"));
  EXPECT_FALSE(parse_control_command("rtt 1 5ms"));
}

TEST(ControlParse, ErrorsRepeatCodesToFillCount) {
  auto c = parse_control_command("errors Produce 3 NOT_LEADER_OR_FOLLOWER");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->kind, Kind::kErrors);
  EXPECT_EQ(c->api_key, 0);
  EXPECT_EQ(c->errors, (std::vector<int>{6, 6, 6}));

  auto mixed =
      parse_control_command("errors fetch 4 REQUEST_TIMED_OUT RD_KAFKA_RESP_ERR__TRANSPORT");
  ASSERT_TRUE(mixed) << mixed.error().message;
  EXPECT_EQ(mixed->api_key, 1);
  EXPECT_EQ(mixed->errors, (std::vector<int>{7, -195, 7, -195}));
}

TEST(ControlParse, ErrorsCountZeroClears) {
  auto c = parse_control_command("errors OffsetCommit 0");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->api_key, 8);
  EXPECT_TRUE(c->errors.empty());
}

TEST(ControlParse, ErrorsRejectUnknownNames) {
  auto api = parse_control_command("errors Produc 1 REQUEST_TIMED_OUT");
  ASSERT_FALSE(api);
  EXPECT_THAT(api.error().message, HasSubstr("'Produc'"));
  auto code = parse_control_command("errors Produce 1 NOT_A_CODE");
  ASSERT_FALSE(code);
  EXPECT_THAT(code.error().message, HasSubstr("'NOT_A_CODE'"));
  EXPECT_FALSE(parse_control_command("errors Produce 2"));
}

TEST(ControlParse, ApiKeysAndErrorCodesByNumber) {
  EXPECT_EQ(parse_api_key("22").value(), 22);
  EXPECT_EQ(parse_api_key("InitProducerId").value(), 22);
  EXPECT_EQ(parse_api_key("joingroup").value(), 11);
  EXPECT_EQ(parse_error_code("6").value(), 6);
  EXPECT_EQ(parse_error_code("coordinator_not_available").value(), 15);
}

TEST(ControlParse, TopicCreate) {
  auto c = parse_control_command("topic create clicks 8");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->kind, Kind::kTopicCreate);
  EXPECT_EQ(c->topic, "clicks");
  EXPECT_EQ(c->partitions, 8);
  EXPECT_EQ(c->replication, 0);
  auto r = parse_control_command("topic create out 2 1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->replication, 1);
  EXPECT_FALSE(parse_control_command("topic delete x"));
  EXPECT_FALSE(parse_control_command("topic create x zero"));
}

TEST(ControlParse, UnknownCommandIsNamed) {
  auto c = parse_control_command("reboot everything");
  ASSERT_FALSE(c);
  EXPECT_THAT(c.error().message, HasSubstr("unknown command 'reboot'"));
}

TEST(ControlParse, HelpAndQuit) {
  EXPECT_EQ(parse_control_command("help").value().kind, Kind::kHelp);
  EXPECT_EQ(parse_control_command("quit").value().kind, Kind::kQuit);
  EXPECT_THAT(control_help(), HasSubstr("broker <id> down|up"));
}

}  // namespace
}  // namespace kdedup::testbroker
