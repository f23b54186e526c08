#pragma once
// Subcommand registry of the kdedup executable. Each app/cmd_*.cc file
// registers one subcommand with a file-scope CommandRegistration; main()
// dispatches on argv[1]. Subcommands only wire library modules together.

#include <functional>
#include <string>
#include <vector>

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

struct CommandRegistration {
  CommandRegistration(std::string name, std::string summary, CommandMain main) {
    commands().push_back(Command{std::move(name), std::move(summary), std::move(main)});
  }
};

}  // namespace kdedup::app
