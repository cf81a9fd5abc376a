#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/auth/rails_key.h"

#include <c10/util/Exception.h>

#include "rails/auth/crypto.h"

namespace fairring::rails::auth {

std::string railsKey(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& storeKey,
    const std::string& operatorSecret) {
  const std::string offered = randomBytes(kKeyBytes);
  // Absent, it becomes what this rank offers; present, every rank reads the
  // one the first rank put there.
  const std::vector<uint8_t> stored = store->compareSet(
      storeKey, {}, std::vector<uint8_t>(offered.begin(), offered.end()));
  TORCH_CHECK(
      stored.size() == kKeyBytes,
      "fairring: the group's store holds a rails key of ",
      stored.size(),
      " bytes under '",
      storeKey,
      "' where ",
      kKeyBytes,
      " were expected; something else wrote that key");
  const std::string perGroup(stored.begin(), stored.end());
  return operatorSecret.empty()
      ? perGroup
      : hmacSha256(operatorSecret, "fairring rails key\n" + perGroup);
}

} // namespace fairring::rails::auth
