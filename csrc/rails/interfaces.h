#pragma once

#include <string>
#include <vector>

namespace fairring::rails {

// One IPv4 or IPv6 address of a network interface, as getifaddrs() lists it.
struct InterfaceAddress {
  std::string name;
  bool ipv6 = false;
  std::string address; // numeric, without a scope or port
  bool up = false; // IFF_UP and IFF_RUNNING: the link can carry traffic
  bool loopback = false;
  bool linkLocal = false; // IPv6 fe80::/10: needs a scope, never routed
};

// Every IPv4 and IPv6 address of this host's interfaces, in getifaddrs()
// order (the kernel's: interface index, then IPv4 before IPv6). Choosing
// among them is fairring/_interfaces.py's job; this only reads the kernel.
std::vector<InterfaceAddress> interfaceAddresses();

} // namespace fairring::rails
