#pragma once
// Subcommand registry of the kdedup executable. Each app/cmd_*.cc file
// registers one subcommand with a file-scope CommandRegistration; main()
// dispatches on argv[1]. Subcommands only wire library modules together.

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace kdedup::app {

/// Runs a subcommand. argv[0] is "kdedup <name>". Returns the process exit
/// code: 0 success, 1 runtime failure, 2 bad usage or invalid input.
using CommandMain = std::function<int(int argc, char** argv)>;

struct Command {
  std::string name;
  std::string summary;  ///< one line for `kdedup --help`
  CommandMain main;
};

std::vector<Command>& commands();

/// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  ///< runtime failure
inline constexpr int kExitUsage = 2;    ///< bad usage or invalid input

/// Parses a subcommand's command line with CLI11. Returns the code the
/// subcommand must exit with now — 0 after printing --help, kExitUsage after
/// printing CLI11's message for a usage error (it names the flag) — or
/// std::nullopt when the subcommand should go on and run.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

struct CommandRegistration {
  CommandRegistration(std::string name, std::string summary, CommandMain main) {
    commands().push_back(Command{std::move(name), std::move(summary), std::move(main)});
  }
};

}  // namespace kdedup::app
