#pragma once

// The cryptography of the rails' authentication (handshake.h, rails_key.h)
// and encryption: HMAC-SHA256, a CSPRNG, a constant-time comparison and
// AES-256-GCM, all OpenSSL's
// libcrypto, loaded at run time (libcrypto.so.3, or 1.1), so that building
// needs no OpenSSL headers and a wheel links no OpenSSL of its own. None of
// it is written here.

#include <cstddef>
#include <cstdint>
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

// AES-256-GCM (OpenSSL's EVP), for the rails' encryption
// (FAIRRING_RAILS_ENCRYPT): seals `bytes` of `plain` into `sealed`
// (bytes + kGcmTagBytes), authenticating `aad` with them, under `key`
// (kKeyBytes) and a 12-byte nonce made of `counter`, which must never repeat
// under one key.
constexpr size_t kGcmTagBytes = 16;
void sealAesGcm(
    std::string_view key,
    uint64_t counter,
    std::string_view aad,
    const void* plain,
    size_t bytes,
    void* sealed);
// Opens what sealAesGcm sealed (`bytes`: the plain length) into `plain`,
// which may be `sealed` itself: false, with `plain` unspecified (it may hold
// the altered bytes), if anything was altered or the key, counter or aad
// differ.
bool openAesGcm(
    std::string_view key,
    uint64_t counter,
    std::string_view aad,
    const void* sealed,
    size_t bytes,
    void* plain);

// Lowercase hexadecimal, and back: nullopt unless `hex` is exactly `bytes`
// bytes in lowercase hex (one spelling per value, as the wire grammars want).
std::string toHex(std::string_view bytes);
std::optional<std::string> fromHex(std::string_view hex, size_t bytes);

} // namespace fairring::rails::auth
