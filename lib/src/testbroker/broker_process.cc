#include "kdedup/testbroker/broker_process.h"

#include <fmt/format.h>

namespace kdedup::testbroker {

Result<std::unique_ptr<BrokerProcess>> BrokerProcess::start(const BrokerOptions& options) {
  std::vector<std::string> argv{options.kdedup_binary, "testbroker", "--brokers",
                                std::to_string(options.brokers)};
  for (const auto& t : options.topics) {
    argv.push_back("--topic");
    argv.push_back(t);
  }
  ChildOptions co;
  co.pipe_stdin = true;
  co.pipe_stdout = true;
  co.stderr_file = options.stderr_file;
  auto child = ChildProcess::spawn(argv, co);
  if (!child) return tl::unexpected(child.error());
  auto broker = std::unique_ptr<BrokerProcess>(new BrokerProcess());
  broker->child_ = std::move(*child);
  auto line = broker->child_->read_line(std::chrono::seconds(20));
  if (!line) {
    auto st = broker->child_->stop(std::chrono::seconds(2));
    return fail(
        fmt::format("test broker did not start (exit status {}): {}", st, line.error().message));
  }
  broker->bootstrap_ = *line;
  return broker;
}

Result<std::string> BrokerProcess::control(std::string_view command) {
  if (auto ok = child_->write_stdin(std::string(command) + "\n"); !ok) {
    return tl::unexpected(ok.error());
  }
  auto reply = child_->read_line(std::chrono::seconds(10));
  if (!reply) return tl::unexpected(reply.error());
  if (reply->rfind("ok", 0) == 0) return reply->size() > 3 ? reply->substr(3) : std::string();
  if (reply->rfind("error ", 0) == 0) {
    return fail(fmt::format("test broker: '{}': {}", command, reply->substr(6)));
  }
  return fail(fmt::format("test broker: '{}': unexpected reply '{}'", command, *reply));
}

int BrokerProcess::stop() {
  child_->close_stdin();
  return child_->stop(std::chrono::seconds(10));
}

}  // namespace kdedup::testbroker
