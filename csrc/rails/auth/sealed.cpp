#include "rails/auth/sealed.h"

#include "rails/auth/crypto.h"

namespace fairring::rails::auth {

namespace {

std::string sealOf(
    std::string_view key, std::string_view storeKey, std::string_view value) {
  std::string signed_ = "fairring sealed store value\n";
  signed_.append(storeKey).append("\n").append(value);
  return hmacSha256(key, signed_);
}

} // namespace

std::string sealForStore(
    std::string_view key, std::string_view storeKey, std::string_view value) {
  return std::string(value) + sealOf(key, storeKey, value);
}

std::optional<std::string> openFromStore(
    std::string_view key, std::string_view storeKey, std::string_view sealed) {
  if (sealed.size() < kMacBytes) {
    return std::nullopt;
  }
  const std::string_view value = sealed.substr(0, sealed.size() - kMacBytes);
  if (!equalInConstantTime(
          sealed.substr(value.size()), sealOf(key, storeKey, value))) {
    return std::nullopt;
  }
  return std::string(value);
}

} // namespace fairring::rails::auth
