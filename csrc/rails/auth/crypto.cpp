#include "rails/auth/crypto.h"

#include <dlfcn.h>

#include <type_traits>

#include <c10/util/Exception.h>

namespace fairring::rails::auth {

namespace {

// The four functions used, with OpenSSL's C signatures (stable from 1.1 on).
struct EvpMd; // OpenSSL's EVP_MD, used only by pointer
struct Libcrypto {
  const EvpMd* (*sha256)() = nullptr;
  unsigned char* (*hmac)(
      const EvpMd*,
      const void*,
      int,
      const unsigned char*,
      size_t,
      unsigned char*,
      unsigned int*) = nullptr;
  int (*randBytes)(unsigned char*, int) = nullptr;
  int (*memcmp)(const void*, const void*, size_t) = nullptr;
};

Libcrypto load() {
  std::string tried;
  void* library = nullptr;
  for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1"}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      break;
    }
    const char* why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why ? why : name);
  }
  TORCH_CHECK(
      library != nullptr,
      "fairring: the rails authenticate their connections with OpenSSL's "
      "libcrypto, which could not be loaded (",
      tried,
      "); install OpenSSL's runtime library (Debian and Ubuntu: libssl3; "
      "RHEL and Fedora: openssl-libs)");
  // Loaded for the process's life: nothing here is ever unloaded.
  Libcrypto functions;
  const auto resolve = [&](const char* symbol, auto& function) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(
        dlsym(library, symbol));
    TORCH_CHECK(
        function != nullptr,
        "fairring: OpenSSL's libcrypto has no ",
        symbol,
        "; the rails need OpenSSL 1.1 or later");
  };
  resolve("EVP_sha256", functions.sha256);
  resolve("HMAC", functions.hmac);
  resolve("RAND_bytes", functions.randBytes);
  resolve("CRYPTO_memcmp", functions.memcmp);
  return functions;
}

const Libcrypto& libcrypto() {
  static const Libcrypto loaded = load(); // a failed load throws, and retries
  return loaded;
}

const unsigned char* bytesOf(std::string_view text) {
  return reinterpret_cast<const unsigned char*>(text.data());
}

} // namespace

std::string randomBytes(size_t count) {
  std::string bytes(count, '\0');
  TORCH_CHECK(
      libcrypto().randBytes(
          reinterpret_cast<unsigned char*>(bytes.data()),
          static_cast<int>(count)) == 1,
      "fairring: OpenSSL's RAND_bytes failed");
  return bytes;
}

std::string hmacSha256(std::string_view key, std::string_view data) {
  const Libcrypto& crypto = libcrypto();
  std::string mac(kMacBytes, '\0');
  unsigned int length = 0;
  TORCH_CHECK(
      crypto.hmac(
          crypto.sha256(),
          key.data(),
          static_cast<int>(key.size()),
          bytesOf(data),
          data.size(),
          reinterpret_cast<unsigned char*>(mac.data()),
          &length) != nullptr &&
          length == kMacBytes,
      "fairring: OpenSSL's HMAC failed");
  return mac;
}

bool equalInConstantTime(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
      libcrypto().memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string toHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * bytes.size());
  for (const char byte : bytes) {
    const auto value = static_cast<unsigned char>(byte);
    hex.push_back(kDigits[value >> 4]);
    hex.push_back(kDigits[value & 0xf]);
  }
  return hex;
}

std::optional<std::string> fromHex(std::string_view hex, size_t bytes) {
  if (hex.size() != 2 * bytes) {
    return std::nullopt;
  }
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') {
      return c - '0';
    }
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  std::string out(bytes, '\0');
  for (size_t index = 0; index < bytes; ++index) {
    const int high = digit(hex[2 * index]);
    const int low = digit(hex[2 * index + 1]);
    if (high < 0 || low < 0) {
      return std::nullopt;
    }
    out[index] = static_cast<char>((high << 4) | low);
  }
  return out;
}

} // namespace fairring::rails::auth
