#pragma once

// Both ends of a rails pipe prove they hold the group's rails key
// (rails/auth/rails_key.h) before the pipe carries anything else:
//
//   dialler                                      listener
//   hello      (wire.h)                     ->   checks it (acceptor.h)
//                                           <-   "fairring-rails-challenge
//                                           <nonce L>"
//   "fairring-rails-proof <nonce D> <MAC D>" ->   checks MAC D
//                                           <-   "fairring-rails-welcome <MAC
//                                           L>"
//   checks MAC L
//
//   MAC D = HMAC-SHA256(key, "fairring-rails dialler\n" hello "\n" L "\n" D)
//   MAC L = the same with "listener"
//
// Nonces are 16 fresh random bytes, MACs 32, both in lowercase hex; the
// texts are exactly as encode() writes them. A proof answers only the nonce
// its listener just drew, so a recorded one cannot be replayed; the dialler
// reads nothing from a listener that has not proved itself (a forger who
// took a listener's address gets a hello, never a shard); and the role in
// each MAC keeps one side's from serving as the other's. Nothing after the
// handshake is authenticated per message: an attacker on the path between
// two ranks is outside what this protects (docs/security.md).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace tensorpipe {
class Pipe;
} // namespace tensorpipe

namespace fairring::rails {

// Why the handshake failed, or empty once the other end proved itself; then
// `session` is the pipe's session key (sessionKey below).
using Handshaken =
    std::function<void(const std::string& why, const std::string& session)>;

// The dialling side: writes `hello`, answers the listener's challenge, and
// checks its welcome. `done` runs once, on TensorPipe's loop thread.
void dialAuthenticated(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    std::string hello,
    std::string key,
    Handshaken done);

// The listening side, once `hello` has been read and checked: challenges
// the dialler, checks its proof, and welcomes it. `done` runs once, on
// TensorPipe's loop thread.
void challengeDialler(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    std::string hello,
    std::string key,
    Handshaken done);

// The texts and the MAC, alone (exposed for tests). Nonces and MACs are raw
// bytes here.
struct Proof {
  std::string nonce;
  std::string mac;
};
std::string encodeChallenge(std::string_view nonce);
std::optional<std::string> parseChallenge(std::string_view text);
std::string encodeProof(const Proof& proof);
std::optional<Proof> parseProof(std::string_view text);
std::string encodeWelcome(std::string_view mac);
std::optional<std::string> parseWelcome(std::string_view text);
// The key both ends derive once proven, which no one else can: HMAC-SHA256
// under the group's key of "fairring-rails session\n" hello "\n" L "\n" D.
// Each direction's encryption key comes from it (pipe_cipher.h).
std::string sessionKey(
    std::string_view key,
    std::string_view hello,
    std::string_view listenerNonce,
    std::string_view diallerNonce);
// `role`: "dialler" or "listener".
std::string handshakeMac(
    std::string_view key,
    std::string_view role,
    std::string_view hello,
    std::string_view listenerNonce,
    std::string_view diallerNonce);

} // namespace fairring::rails
