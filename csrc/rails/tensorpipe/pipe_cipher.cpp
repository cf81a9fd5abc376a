#include "rails/tensorpipe/pipe_cipher.h"

#include "rails/auth/crypto.h"

namespace fairring::rails {

namespace {

constexpr std::string_view kDiallerToListener =
    "fairring-rails dialler to listener";
constexpr std::string_view kListenerToDialler =
    "fairring-rails listener to dialler";

} // namespace

PipeCipher::PipeCipher(std::string_view session, bool dialler)
    : sendKey_(
          auth::hmacSha256(
              session, dialler ? kDiallerToListener : kListenerToDialler)),
      receiveKey_(
          auth::hmacSha256(
              session, dialler ? kListenerToDialler : kDiallerToListener)) {
  static_assert(kSealBytes == auth::kGcmTagBytes);
}

void PipeCipher::sealNext(
    std::string_view aad, const void* plain, size_t bytes, void* sealed) {
  auth::sealAesGcm(sendKey_, sent_++, aad, plain, bytes, sealed);
}

bool PipeCipher::open(
    uint64_t number,
    std::string_view aad,
    const void* sealed,
    size_t bytes,
    void* plain) const {
  return auth::openAesGcm(receiveKey_, number, aad, sealed, bytes, plain);
}

} // namespace fairring::rails
