// kdedup: Kafka deduplication service. Dispatches to the subcommands that
// app/cmd_*.cc register.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "command.h"
#include "kdedup/common/crash_report.h"
#include "kdedup/filter/simd.h"

namespace kdedup::app {
std::vector<Command>& commands() {
  static std::vector<Command> registry;
  return registry;
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI::Success (--help) exits 0; every other parse error is bad usage.
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  return std::nullopt;
}
}  // namespace kdedup::app

namespace {

void print_usage(std::FILE* out) {
  auto cmds = kdedup::app::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(out, "usage: kdedup <command> [options]\n\ncommands:\n");
  for (const auto& c : cmds) std::fprintf(out, "  %-12s %s\n", c.name.c_str(), c.summary.c_str());
  std::fprintf(out, "\n'kdedup <command> --help' describes a command's options.\n");
  std::fprintf(out,
               "Environment: KDEDUP_SIMD=portable|avx2|avx512 caps the vector instructions the "
               "filters use.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("kdedup %s\n", KDEDUP_VERSION);
    return 0;
  }
  // A fatal signal leaves its backtrace on stderr (the log) before the
  // process dies of it.
  kdedup::install_crash_report();
  // KDEDUP_SIMD caps the vector instructions the filters use (simd.h).
  if (const char* simd = std::getenv("KDEDUP_SIMD"); simd != nullptr && *simd != '\0') {
    const auto level = kdedup::filter::simd_from_string(simd);
    if (!level) {
      std::fprintf(stderr,
                   "kdedup: environment variable KDEDUP_SIMD='%s' is not one of portable, avx2, "
                   "avx512\n",
                   simd);
      return 2;
    }
    kdedup::filter::set_simd(*level);
  }
  // Log lines of every command go to stderr (stdout is data: filter output,
  // the test broker's bootstrap line and replies); `kdedup run` replaces the
  // logger with its own format and level. librdkafka's lines come here too
  // (kdedup/common/kafka_log.h).
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  for (const auto& c : kdedup::app::commands()) {
    if (c.name == argv[1]) {
      std::string name = std::string("kdedup ") + argv[1];
      argv[1] = name.data();
      return c.main(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "kdedup: unknown command '%s'\n\n", argv[1]);
  print_usage(stderr);
  return 2;
}
