#include "kdedup/testbroker/pipeline_rig.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "kdedup/testbroker/kafka_io.h"

namespace kdedup::testbroker {

std::string file_tail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  for (std::string l; std::getline(in, l);) {
    tail.push_back(l);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  std::string out;
  for (const auto& l : tail) out += "    " + l + "\n";
  return out;
}

Result<int> free_loopback_port() {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return fail(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(s);
  if (port < 0)
    return fail(fmt::format("cannot find a free loopback port: {}", std::strerror(errno)));
  return port;
}

Result<std::unique_ptr<PipelineRig>> PipelineRig::start(const RigOptions& options) {
  auto rig = std::unique_ptr<PipelineRig>(new PipelineRig());
  rig->options_ = options;
  std::error_code ec;
  std::filesystem::create_directories(options.work_dir, ec);
  if (ec) return fail(fmt::format("work dir {}: {}", options.work_dir, ec.message()));

  BrokerOptions bo;
  bo.kdedup_binary = options.kdedup_binary;
  bo.brokers = options.brokers;
  bo.topics = {fmt::format("{}:{}", options.input_topic, options.partitions),
               fmt::format("{}:{}", options.output_topic, options.partitions),
               fmt::format("{}:1", options.dlq_topic)};
  // The mock cluster has no admin API: the internal topic is created here,
  // and the instances only check it (repartition.create_topic: false).
  if (!options.repartition_topic.empty()) {
    bo.topics.push_back(fmt::format("{}:{}", options.repartition_topic, options.partitions));
  }
  bo.stderr_file = options.work_dir + "/broker.log";
  auto broker = BrokerProcess::start(bo);
  if (!broker) return tl::unexpected(broker.error());
  rig->broker_ = std::move(*broker);

  for (int i = 0; i < options.instances; ++i) {
    if (auto added = rig->add_instance(); !added) return tl::unexpected(added.error());
  }
  return rig;
}

Result<int> PipelineRig::add_instance(const std::vector<std::string>& overrides) {
  const int i = static_cast<int>(instances_.size());
  auto port = free_loopback_port();
  if (!port) return tl::unexpected(port.error());
  const RigOptions& o = options_;
  std::vector<std::string> argv{o.instance_binary.empty() ? o.kdedup_binary : o.instance_binary,
                                "run", "--config", o.config_path};
  for (const auto& set : std::vector<std::string>{
           "kafka.bootstrap.servers=" + bootstrap(),
           "group_id=" + o.group,
           "input.topics=[" + o.input_topic + "]",
           "output.topic=" + o.output_topic,
           "dlq_topic=" + o.dlq_topic,
           fmt::format("state.dir={}/state-{}", o.work_dir, i),
           fmt::format("metrics.address=127.0.0.1:{}", *port),
       }) {
    argv.insert(argv.end(), {"--set", set});
  }
  if (!o.repartition_topic.empty()) {
    for (const auto& set :
         std::vector<std::string>{"repartition.topic=" + o.repartition_topic,
                                  fmt::format("repartition.partitions={}", o.partitions),
                                  std::string("repartition.create_topic=false")}) {
      argv.insert(argv.end(), {"--set", set});
    }
  }
  for (const auto& set : o.overrides) argv.insert(argv.end(), {"--set", set});
  for (const auto& set : overrides) argv.insert(argv.end(), {"--set", set});
  ChildOptions co;
  co.stderr_file = instance_log(i);
  // Configs such as config/local.yaml take the address from the environment.
  co.env = {"KDEDUP_BOOTSTRAP=" + bootstrap()};
  auto child = ChildProcess::spawn(argv, co);
  if (!child) return tl::unexpected(child.error());
  instances_.push_back(std::move(*child));
  return i;
}

PipelineRig::~PipelineRig() { stop(); }

std::string PipelineRig::instance_log(int i) const {
  return fmt::format("{}/run-{}.log", options_.work_dir, i);
}

Status PipelineRig::check_instances() {
  for (std::size_t i = 0; i < instances_.size(); ++i) {
    if (auto st = instances_[i]->poll_exit()) {
      const auto log = instance_log(static_cast<int>(i));
      return fail(fmt::format("kdedup run #{} exited with status {}; log {}:\n{}", i, *st, log,
                              file_tail(log, 15)));
    }
  }
  return {};
}

Result<GroupProgress> PipelineRig::progress() {
  if (options_.repartition_topic.empty()) return progress_of(options_.group, options_.input_topic);
  auto stage = progress_of(options_.group + "-repartition", options_.input_topic);
  if (!stage) return stage;
  auto dedup = progress_of(options_.group, options_.repartition_topic);
  // The internal topic exists once the first instance created it.
  if (!dedup) return GroupProgress{0, stage->end, false};
  // The stage commits an input offset only once the internal topic holds its
  // record: with the stage caught up, the internal topic is complete.
  dedup->caught_up = dedup->caught_up && stage->caught_up;
  return dedup;
}

Result<GroupProgress> PipelineRig::progress_of(const std::string& group, const std::string& topic) {
  auto marks = query_watermarks(bootstrap(), topic);
  if (!marks) return tl::unexpected(marks.error());
  auto committed = committed_offsets(bootstrap(), group, topic);
  if (!committed) return tl::unexpected(committed.error());
  GroupProgress p;
  p.caught_up = true;
  for (const auto& m : *marks) {
    const auto c = m.partition < static_cast<std::int32_t>(committed->size())
                       ? (*committed)[static_cast<std::size_t>(m.partition)]
                       : -1;
    p.end += m.high;
    p.committed += std::max<std::int64_t>(c, 0);
    if (m.high > 0 && c < m.high) p.caught_up = false;
  }
  return p;
}

Status PipelineRig::stop_instances(std::chrono::milliseconds grace) {
  for (auto& c : instances_) c->signal(SIGTERM);
  std::string problems;
  for (std::size_t i = 0; i < instances_.size(); ++i) {
    auto st = instances_[i]->wait(grace);
    if (!st) st = instances_[i]->stop(std::chrono::milliseconds(100));
    if (*st != 0) {
      const auto log = instance_log(static_cast<int>(i));
      problems += fmt::format("kdedup run #{} exited with status {} on SIGTERM; log {}:\n{}", i,
                              *st, log, file_tail(log, 10));
    }
  }
  if (!problems.empty()) return fail(problems);
  return {};
}

void PipelineRig::stop() {
  for (auto& c : instances_) c->signal(SIGTERM);
  for (auto& c : instances_) c->stop(std::chrono::seconds(20));
  if (broker_) broker_->stop();
}

}  // namespace kdedup::testbroker
