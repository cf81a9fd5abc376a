#include "rails/interfaces.h"

#include <memory>

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <c10/util/Exception.h>
#include <c10/util/error.h>

namespace fairring::rails {

std::vector<InterfaceAddress> interfaceAddresses() {
  ifaddrs* listed = nullptr;
  TORCH_CHECK(
      getifaddrs(&listed) == 0,
      "fairring: cannot list this host's network interfaces (getifaddrs: ",
      c10::utils::str_error(errno),
      ")");
  const std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> owned(
      listed, &freeifaddrs);
  std::vector<InterfaceAddress> addresses;
  for (const ifaddrs* entry = listed; entry != nullptr;
       entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr) {
      continue;
    }
    const int family = entry->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) {
      continue;
    }
    char host[NI_MAXHOST];
    const socklen_t length =
        family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (getnameinfo(
            entry->ifa_addr,
            length,
            host,
            sizeof(host),
            nullptr,
            0,
            NI_NUMERICHOST) != 0) {
      continue;
    }
    InterfaceAddress address;
    address.name = entry->ifa_name;
    address.ipv6 = family == AF_INET6;
    address.address = host;
    // getnameinfo appends "%<interface>" to scoped (link-local) addresses.
    if (const auto scope = address.address.find('%');
        scope != std::string::npos) {
      address.address.resize(scope);
    }
    address.up =
        (entry->ifa_flags & IFF_UP) && (entry->ifa_flags & IFF_RUNNING);
    address.loopback = (entry->ifa_flags & IFF_LOOPBACK) != 0;
    if (address.ipv6) {
      const auto& in6 =
          reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr)->sin6_addr;
      address.linkLocal = IN6_IS_ADDR_LINKLOCAL(&in6);
    }
    addresses.push_back(std::move(address));
  }
  return addresses;
}

} // namespace fairring::rails
