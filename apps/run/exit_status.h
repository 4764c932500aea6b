// How a program `tessera run` started ended, as `tessera run` reports it: its exit code (a
// signal death is 128 + the signal) and "exit N" / "killed by signal N (NAME)".
#pragma once

#include <sys/wait.h>

#include <cstring>
#include <string>

namespace tessera::run {

inline int DescribeExit(int wstatus, std::string* how) {
  if (WIFEXITED(wstatus)) {
    *how = "exit " + std::to_string(WEXITSTATUS(wstatus));
    return WEXITSTATUS(wstatus);
  }
  if (WIFSIGNALED(wstatus)) {
    *how = "killed by signal " + std::to_string(WTERMSIG(wstatus)) + " (" +
           strsignal(WTERMSIG(wstatus)) + ")";
    return 128 + WTERMSIG(wstatus);
  }
  *how = "unknown status";
  return 1;
}

}  // namespace tessera::run
