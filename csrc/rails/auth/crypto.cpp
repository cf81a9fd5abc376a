#include "rails/auth/crypto.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <c10/util/Exception.h>

namespace fairring::rails::auth {

namespace {

// The functions used, with OpenSSL's C signatures (stable from 1.1 on).
struct EvpMd; // OpenSSL's EVP_MD, EVP_CIPHER and EVP_CIPHER_CTX, by pointer
struct EvpCipher;
struct EvpCipherCtx;
// EVP_CIPHER_CTX_ctrl's commands for GCM (OpenSSL's evp.h).
constexpr int kGcmSetIvLength = 0x9;
constexpr int kGcmGetTag = 0x10;
constexpr int kGcmSetTag = 0x11;
struct Libcrypto {
  EvpCipherCtx* (*cipherNew)() = nullptr;
  void (*cipherFree)(EvpCipherCtx*) = nullptr;
  const EvpCipher* (*aes256Gcm)() = nullptr;
  int (*cipherInit)(
      EvpCipherCtx*,
      const EvpCipher*,
      void*,
      const unsigned char*,
      const unsigned char*,
      int) = nullptr; // EVP_CipherInit_ex; the last: 1 encrypts, 0 decrypts
  int (*cipherUpdate)(
      EvpCipherCtx*, unsigned char*, int*, const unsigned char*, int) = nullptr;
  int (*cipherFinal)(EvpCipherCtx*, unsigned char*, int*) = nullptr;
  int (*cipherCtrl)(EvpCipherCtx*, int, int, void*) = nullptr;
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
  resolve("EVP_CIPHER_CTX_new", functions.cipherNew);
  resolve("EVP_CIPHER_CTX_free", functions.cipherFree);
  resolve("EVP_aes_256_gcm", functions.aes256Gcm);
  resolve("EVP_CipherInit_ex", functions.cipherInit);
  resolve("EVP_CipherUpdate", functions.cipherUpdate);
  resolve("EVP_CipherFinal_ex", functions.cipherFinal);
  resolve("EVP_CIPHER_CTX_ctrl", functions.cipherCtrl);
  return functions;
}

const Libcrypto& libcrypto() {
  static const Libcrypto loaded = load(); // a failed load throws, and retries
  return loaded;
}

const unsigned char* bytesOf(std::string_view text) {
  return reinterpret_cast<const unsigned char*>(text.data());
}

// One AES-256-GCM pass over `bytes` of `in` into `out`, with `aad`;
// `encrypt` chooses the direction. Returns the context (for the tag).
class GcmPass {
 public:
  GcmPass(
      std::string_view key,
      uint64_t counter,
      std::string_view aad,
      bool encrypt)
      : crypto_(libcrypto()), context_(crypto_.cipherNew()) {
    TORCH_CHECK(context_ != nullptr, "fairring: EVP_CIPHER_CTX_new failed");
    TORCH_CHECK(
        key.size() == kKeyBytes,
        "fairring: an AES key of ",
        key.size(),
        " bytes");
    unsigned char nonce[12] = {};
    for (int index = 0; index < 8; ++index) {
      nonce[4 + index] = static_cast<unsigned char>(counter >> (8 * index));
    }
    const int direction = encrypt ? 1 : 0;
    int length = 0;
    check(
        crypto_.cipherInit(
            context_,
            crypto_.aes256Gcm(),
            nullptr,
            nullptr,
            nullptr,
            direction) == 1 &&
        crypto_.cipherCtrl(context_, kGcmSetIvLength, sizeof(nonce), nullptr) ==
            1 &&
        crypto_.cipherInit(
            context_, nullptr, nullptr, bytesOf(key), nonce, direction) == 1 &&
        (aad.empty() ||
         crypto_.cipherUpdate(
             context_,
             nullptr,
             &length,
             bytesOf(aad),
             static_cast<int>(aad.size())) == 1));
  }
  ~GcmPass() {
    crypto_.cipherFree(context_);
  }
  GcmPass(const GcmPass&) = delete;
  GcmPass& operator=(const GcmPass&) = delete;

  // In chunks: EVP takes an int length.
  void update(const void* in, size_t bytes, void* out) {
    constexpr size_t kChunk = size_t{1} << 30;
    const auto* from = static_cast<const unsigned char*>(in);
    auto* to = static_cast<unsigned char*>(out);
    for (size_t done = 0; done < bytes; done += kChunk) {
      const int chunk = static_cast<int>(std::min(kChunk, bytes - done));
      int length = 0;
      check(
          crypto_.cipherUpdate(
              context_, to + done, &length, from + done, chunk) == 1 &&
          length == chunk);
    }
  }
  bool finish() {
    unsigned char none[16];
    int length = 0;
    return crypto_.cipherFinal(context_, none, &length) == 1;
  }
  int control(int command, int argument, void* pointer) {
    return crypto_.cipherCtrl(context_, command, argument, pointer);
  }

 private:
  static void check(bool ok) {
    TORCH_CHECK(ok, "fairring: OpenSSL's AES-256-GCM failed");
  }
  const Libcrypto& crypto_;
  EvpCipherCtx* const context_;
};

} // namespace

void sealAesGcm(
    std::string_view key,
    uint64_t counter,
    std::string_view aad,
    const void* plain,
    size_t bytes,
    void* sealed) {
  GcmPass pass(key, counter, aad, /*encrypt=*/true);
  pass.update(plain, bytes, sealed);
  TORCH_CHECK(
      pass.finish() &&
          pass.control(
              kGcmGetTag,
              kGcmTagBytes,
              static_cast<unsigned char*>(sealed) + bytes) == 1,
      "fairring: OpenSSL's AES-256-GCM failed");
}

bool openAesGcm(
    std::string_view key,
    uint64_t counter,
    std::string_view aad,
    const void* sealed,
    size_t bytes,
    void* plain) {
  unsigned char tag[kGcmTagBytes];
  std::memcpy(
      tag, static_cast<const unsigned char*>(sealed) + bytes, sizeof(tag));
  GcmPass pass(key, counter, aad, /*encrypt=*/false);
  pass.update(sealed, bytes, plain);
  return pass.control(kGcmSetTag, kGcmTagBytes, tag) == 1 && pass.finish();
}

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
