#pragma once

// A value a rank publishes in the group's store for its peers, sealed with
// the group's rails key (rails_key.h): the value, then HMAC-SHA256 over the
// store key it is published under and the value. A reader opens it before
// believing a byte of it, so that, where the key comes from
// FAIRRING_RAILS_SECRET, whoever can write the store can neither forge a
// rank's value nor move one rank's to another's key. (Where the key is met in
// the store, whoever can write the store can read the key too: the store is
// then the trust boundary, as for every c10d backend.)

#include <optional>
#include <string>
#include <string_view>

namespace fairring::rails::auth {

std::string sealForStore(
    std::string_view key, std::string_view storeKey, std::string_view value);

// The value sealed in `sealed` for `storeKey` with `key`, or nullopt.
std::optional<std::string> openFromStore(
    std::string_view key, std::string_view storeKey, std::string_view sealed);

} // namespace fairring::rails::auth
