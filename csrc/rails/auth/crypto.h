#pragma once

// The cryptography of the rails' authentication (handshake.h, rails_key.h):
// HMAC-SHA256, a CSPRNG and a constant-time comparison, all OpenSSL's
// libcrypto, loaded at run time (libcrypto.so.3, or 1.1), so that building
// needs no OpenSSL headers and a wheel links no OpenSSL of its own. None of
// it is written here.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace fairring::rails::auth {

constexpr size_t kKeyBytes = 32;
constexpr size_t kNonceBytes = 16;
constexpr size_t kMacBytes = 32; // SHA-256's

// `count` bytes from OpenSSL's CSPRNG (RAND_bytes). Throws if libcrypto
// cannot be loaded, saying what to install.
std::string randomBytes(size_t count);

// HMAC-SHA256 of `data` under `key`: kMacBytes bytes.
std::string hmacSha256(std::string_view key, std::string_view data);

// Whether `a` and `b` are equal, in time that does not depend on where they
// differ (CRYPTO_memcmp), so a forger cannot find a MAC byte by byte.
bool equalInConstantTime(std::string_view a, std::string_view b);

// Lowercase hexadecimal, and back: nullopt unless `hex` is exactly `bytes`
// bytes in lowercase hex (one spelling per value, as the wire grammars want).
std::string toHex(std::string_view bytes);
std::optional<std::string> fromHex(std::string_view hex, size_t bytes);

} // namespace fairring::rails::auth
