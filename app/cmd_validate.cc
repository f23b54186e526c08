// `kdedup validate --config FILE [--set key.path=value]...`: loads the config
// exactly as `kdedup run` would and reports every problem with its key path.
// Exit 0 with a one-line summary when valid, 2 with all errors otherwise.

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "command.h"
#include "kdedup/config/config.h"

namespace {

int validate_main(int argc, char** argv) {
  CLI::App cli{"Checks a kdedup configuration file and prints every error with its key path.",
               "kdedup validate"};
  std::string path;
  std::vector<std::string> overrides;
  bool print_schema = false;
  cli.add_option("-c,--config", path, "YAML config file")->type_name("FILE");
  cli.add_option("--set", overrides,
                 "override a key, e.g. --set filter.fpp=0.001 --set input.topics=[a,b] "
                 "--set kafka.bootstrap.servers=host:9092 (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cli.add_flag("--print-schema", print_schema,
               "print the JSON Schema the config is checked against");
  if (auto code = kdedup::app::parse_command_line(cli, argc, argv)) return *code;
  if (print_schema) {
    std::fwrite(kdedup::config::schema_json().data(), 1, kdedup::config::schema_json().size(),
                stdout);
    return 0;
  }
  if (path.empty()) {
    std::fprintf(stderr, "kdedup validate: --config FILE is required\n");
    return 2;
  }

  auto report = kdedup::config::check_config_file(path, overrides);
  for (const auto& w : report.warnings) {
    std::fprintf(stderr, "warning: %s\n", kdedup::config::to_string(w).c_str());
  }
  if (!report.ok()) {
    std::fprintf(stderr, "%s: %zu error%s\n", path.c_str(), report.errors.size(),
                 report.errors.size() == 1 ? "" : "s");
    for (const auto& e : report.errors) {
      std::fprintf(stderr, "error: %s\n", kdedup::config::to_string(e).c_str());
    }
    return 2;
  }
  std::printf("OK %s: %s\n", path.c_str(), kdedup::config::summary(*report.config).c_str());
  return 0;
}

const kdedup::app::CommandRegistration kValidateCommand{
    "validate", "check a config file and print every error with its key path", validate_main};

}  // namespace
