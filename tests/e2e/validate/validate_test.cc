// End-to-end tests of `kdedup validate`: the real binary, real files, the
// process environment and --set flags; exit 0 with an OK line for a good
// config, exit 2 with every error and its key path otherwise.

#include <cstdlib>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "process.h"

namespace {

using kdedup::testing::ProcessResult;
using kdedup::testing::run_process;
using kdedup::testing::TempDir;
using kdedup::testing::write_file;
using ::testing::HasSubstr;

constexpr const char* kGood = R"(group_id: g
input:
  topics: [in]
output:
  topic: out
identity:
  salt: s
window: 10m
dlq_topic: dlq
kafka:
  bootstrap.servers: 127.0.0.1:9092
)";

/// Runs `env VARS... kdedup validate ARGS...` so each test controls the
/// environment the binary sees.
ProcessResult validate(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {"/usr/bin/env", "-u", "KDEDUP_BOOTSTRAP", "-u",
                                   "KDEDUP_SALT",  "-u", "KAFKA_BOOTSTRAP"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(KDEDUP_BINARY);
  argv.push_back("validate");
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv);
}

class Validate : public ::testing::Test {
 protected:
  std::string write(const std::string& yaml) {
    std::string path = dir_.file("kdedup.yaml");
    write_file(path, yaml);
    return path;
  }
  TempDir dir_;
};

TEST_F(Validate, GoodConfigExitsZeroWithSummary) {
  auto r = validate({"--config", write(kGood)});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("OK"));
  EXPECT_THAT(r.out, HasSubstr("in -> out"));
  EXPECT_THAT(r.out, HasSubstr("window 10m"));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST_F(Validate, ShippedExamples) {
  auto r = validate({"--config", std::string(KDEDUP_SOURCE_DIR) + "/config/kdedup.yaml"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // local.yaml needs KDEDUP_BOOTSTRAP: an unset variable is an error naming it and the key.
  auto unset = validate({"--config", std::string(KDEDUP_SOURCE_DIR) + "/config/local.yaml"});
  EXPECT_EQ(unset.exit_code, 2);
  EXPECT_THAT(unset.err, HasSubstr("kafka.bootstrap.servers"));
  EXPECT_THAT(unset.err, HasSubstr("KDEDUP_BOOTSTRAP is not set"));
  auto set = validate({"--config", std::string(KDEDUP_SOURCE_DIR) + "/config/local.yaml"},
                      {"KDEDUP_BOOTSTRAP=127.0.0.1:39092"});
  EXPECT_EQ(set.exit_code, 0) << set.err;
}

TEST_F(Validate, EveryErrorIsPrintedWithItsKeyPath) {
  std::string yaml = kGood;
  yaml +=
      "filter:\n  fpp: 2\n  timer_bits: 3\nthreads: 0\ndelivery: eventually\nmax_future_skew: "
      "soon\n";
  auto r = validate({"--config", write(yaml)});
  EXPECT_EQ(r.exit_code, 2);
  for (const char* path :
       {"filter.fpp", "filter.timer_bits", "threads", "delivery", "max_future_skew"}) {
    EXPECT_THAT(r.err, HasSubstr(std::string("error: ") + path + ":")) << r.err;
  }
  EXPECT_THAT(r.err, HasSubstr("5 errors")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(Validate, TypeErrorsAndMissingKeys) {
  auto r = validate({"--config", write("group_id: [a]\nwindow: 5\n")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("group_id:"));
  EXPECT_THAT(r.err, HasSubstr("window:"));
  for (const char* key : {"input", "output", "kafka"}) EXPECT_THAT(r.err, HasSubstr(key));
}

TEST_F(Validate, UnknownKeyIsRejected) {
  auto r = validate({"--config", write(std::string(kGood) + "outptu:\n  topic: x\n")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("outptu: unknown key (did you mean 'output'?)"));
  EXPECT_THAT(r.err, HasSubstr("kdedup.yaml:12:1")) << r.err;  // where the key is in the file
}

TEST_F(Validate, ProtectedKeyIsRejectedWithTheReason) {
  auto r =
      validate({"--config", write(std::string(kGood) + "consumer:\n  enable.auto.commit: true\n")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(
      r.err,
      HasSubstr("consumer.enable.auto.commit: cannot be set: kdedup commits offsets itself"));
  auto by_flag = validate({"--config", write(kGood), "--set", "producer.enable.idempotence=false"});
  EXPECT_EQ(by_flag.exit_code, 2);
  EXPECT_THAT(by_flag.err, HasSubstr("producer.enable.idempotence: cannot be set"));
  EXPECT_THAT(by_flag.err, HasSubstr("--set producer.enable.idempotence=false"));
}

// librdkafka's own check, as `kdedup run` applies the properties to its
// clients: an unknown name or an invalid value is an error at its key path.
TEST_F(Validate, LibrdkafkaRefusesUnknownPropertiesAndInvalidValues) {
  const std::string path = write(std::string(kGood) +
                                 "  no.such.property: 1\n"
                                 "consumer:\n  socket.timeout.ms: soon\n"
                                 "producer:\n  linger.ms: 5\n");
  auto r = validate({"--config", path});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("error: kafka.no.such.property: librdkafka refuses it: No such "
                               "configuration property"));
  EXPECT_THAT(r.err, HasSubstr("kdedup.yaml:12:"));
  EXPECT_THAT(r.err,
              HasSubstr("error: consumer.socket.timeout.ms: librdkafka refuses it: Invalid value"));
  EXPECT_THAT(r.err, HasSubstr("2 errors")) << r.err;
  // `kdedup run` stops on the same errors, with the same words, before it
  // touches a state dir or connects to anything.
  auto run = run_process(
      {KDEDUP_BINARY, "run", "--config", path, "--set", "state.dir=", "--set", "metrics.address="});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("error: kafka.no.such.property: librdkafka refuses it"));
  EXPECT_THAT(run.err, HasSubstr("error: consumer.socket.timeout.ms: librdkafka refuses it"));
  auto by_flag = validate({"--config", write(kGood), "--set", "producer.acks=sometimes"});
  EXPECT_EQ(by_flag.exit_code, 2);
  EXPECT_THAT(by_flag.err, HasSubstr("error: producer.acks: librdkafka refuses it"));
  EXPECT_THAT(by_flag.err, HasSubstr("--set producer.acks=sometimes"));
}

// A secret given with the wrong type, by file or by --set, is named by its
// key path but its value never appears (salt, passwords, keys, secrets).
TEST_F(Validate, SecretValuesAreNeverPrinted) {
  std::string yaml = kGood;
  yaml.replace(yaml.find("salt: s"), 7, "salt: [salt-in-a-list]");
  yaml +=
      "  sasl.password: [password-in-a-list]\n"
      "  ssl.key.pem: {pem: key-in-a-map}\n"
      "consumer:\n  sasl.oauthbearer.client.secret: [client-secret-in-a-list]\n";
  const std::string path = write(yaml);
  const std::vector<std::string> secrets = {"salt-in-a-list", "password-in-a-list",
                                            "key-in-a-map",   "client-secret-in-a-list",
                                            "flag-salt",      "flag-password"};
  for (const std::string command : {"validate", "run"}) {
    auto r = run_process({KDEDUP_BINARY, command, "--config", path, "--set",
                          "identity={salt: [flag-salt]}", "--set",
                          "producer.ssl.key.password=[flag-password]", "--set",
                          "state.dir=", "--set", "metrics.address="});
    EXPECT_EQ(r.exit_code, 2) << command;
    for (const char* key :
         {"identity.salt:", "kafka.sasl.password:", "kafka.ssl.key.pem:",
          "consumer.sasl.oauthbearer.client.secret:", "producer.ssl.key.password:"}) {
      EXPECT_THAT(r.err, HasSubstr(key)) << command << "\n" << r.err;
    }
    EXPECT_THAT(r.err, HasSubstr("(value hidden)")) << r.err;
    for (const auto& secret : secrets) {
      EXPECT_EQ(r.err.find(secret), std::string::npos)
          << command << " printed '" << secret << "':\n"
          << r.err;
      EXPECT_EQ(r.out.find(secret), std::string::npos) << command << r.out;
    }
  }
}

TEST_F(Validate, SemanticErrors) {
  auto r = validate({"--config", write(kGood), "--set", "output.topic=in", "--set", "dlq_topic="});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("output.topic: 'in' is also an input topic"));
  EXPECT_THAT(r.err, HasSubstr("dlq_topic: required when on_invalid is dlq"));
}

TEST_F(Validate, EnvironmentInterpolation) {
  std::string yaml = kGood;
  yaml.replace(yaml.find("127.0.0.1:9092"), 14, "${BROKERS}");
  yaml.replace(yaml.find("salt: s"), 7, "salt: ${SALT:-}");
  auto unset = validate({"--config", write(yaml)});
  EXPECT_EQ(unset.exit_code, 2);
  EXPECT_THAT(unset.err,
              HasSubstr("kafka.bootstrap.servers: environment variable BROKERS is not set"));
  auto ok = validate({"--config", write(yaml)}, {"BROKERS=broker-1:9092"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  // The empty default salt is accepted with a warning.
  EXPECT_THAT(ok.err, HasSubstr("warning: identity.salt"));
}

TEST_F(Validate, SetOverridesKeys) {
  auto r = validate({"--config", write(kGood), "--set", "input.topics=[a,b]", "--set",
                     "filter.fpp=0.001", "--set", "kafka.bootstrap.servers=127.0.0.1:1234", "--set",
                     "window=1h"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("a,b -> out"));
  EXPECT_THAT(r.out, HasSubstr("fpp=0.001"));
  EXPECT_THAT(r.out, HasSubstr("window 1h"));
  auto bad = validate({"--config", write(kGood), "--set", "filter.fpp=lots"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("filter.fpp:"));
  EXPECT_THAT(bad.err, HasSubstr("--set filter.fpp=lots"));
}

TEST_F(Validate, YamlSyntaxErrorNamesFileLineAndColumn) {
  std::string path = write("group_id: g\ninput:\n  topics: [a, b\n");
  auto r = validate({"--config", path});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("YAML syntax error"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex("kdedup\\.yaml:[0-9]+:[0-9]+"));
}

TEST_F(Validate, MissingFileAndUsage) {
  auto missing = validate({"--config", dir_.file("absent.yaml")});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("cannot open config file"));
  EXPECT_THAT(missing.err, HasSubstr("absent.yaml"));
  auto usage = validate({});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_THAT(usage.err, HasSubstr("--config"));
  auto help = validate({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("--set"));
}

TEST_F(Validate, PrintSchemaIsTheSchemaFile) {
  auto r = validate({"--print-schema"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, kdedup::testing::read_file(std::string(KDEDUP_SOURCE_DIR) +
                                              "/schemas/config.schema.json"));
}

}  // namespace
