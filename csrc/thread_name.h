#pragma once

#include <pthread.h>

#include <string>

namespace fairring {

// Names the calling thread, as top -H, gdb, py-spy and /proc show it, so that
// an operator can tell fairring's threads from torch's and the transports'
// (docs/design.md, "Threads"). The kernel keeps 15 characters; every name
// starts "fr-".
inline void nameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

} // namespace fairring
