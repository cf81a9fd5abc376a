#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/tensorpipe/handshake.h"

#include <atomic>
#include <exception>

#include <tensorpipe/tensorpipe.h>

#include "rails/auth/crypto.h"
#include "rails/peer_text.h"
#include "test_switches.h"

namespace fairring::rails {

namespace {

using auth::kMacBytes;
using auth::kNonceBytes;

constexpr std::string_view kChallenge = "fairring-rails-challenge";
constexpr std::string_view kProof = "fairring-rails-proof";
constexpr std::string_view kWelcome = "fairring-rails-welcome";
// The longest handshake text read: a proof is 118 bytes.
constexpr size_t kMaxTextBytes = 256;

// A handshake's end, reported once: a failed write and the read it fails
// both report, and the first says why.
class Once {
 public:
  explicit Once(Handshaken done) : done_(std::move(done)) {}
  void report(const std::string& why, const std::string& session = {}) {
    if (!reported_.exchange(true)) {
      done_(why, session);
    }
  }

 private:
  const Handshaken done_;
  std::atomic<bool> reported_{false};
};

tensorpipe::Message textMessage(std::string text) {
  tensorpipe::Message message;
  message.metadata = std::move(text);
  return message;
}

// Writes `text`; a failure is reported. `session`, if set, makes this the
// last step: its success reports the handshake done with that session key.
void writeText(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    std::string text,
    const std::shared_ptr<Once>& once,
    std::string what,
    std::optional<std::string> session = std::nullopt) {
  pipe->write(
      textMessage(std::move(text)),
      [once, what = std::move(what), session = std::move(session)](
          const tensorpipe::Error& error) {
        if (error) {
          once->report("writing its " + what + ": " + error.what());
        } else if (session) {
          once->report("", *session);
        }
      });
}

// Reads one message that must be a short text (no tensors or payloads) and
// hands it to `then`; reports why not otherwise.
void readText(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    const std::shared_ptr<Once>& once,
    std::string what,
    std::function<void(std::string)> then) {
  pipe->readDescriptor([pipe, once, what, then = std::move(then)](
                           const tensorpipe::Error& error,
                           tensorpipe::Descriptor descriptor) mutable {
    if (error) {
      once->report(
          "the connection closed before its " + what + ": " + error.what());
      return;
    }
    if (!descriptor.tensors.empty() || !descriptor.payloads.empty() ||
        descriptor.metadata.size() > kMaxTextBytes) {
      once->report("its " + what + " was not a short text");
      return;
    }
    pipe->read(
        tensorpipe::Allocation{},
        [once,
         what,
         then = std::move(then),
         text = std::move(descriptor.metadata)](
            const tensorpipe::Error& error) mutable {
          if (error) {
            once->report("reading its " + what + ": " + error.what());
            return;
          }
          // A callback must not throw on TensorPipe's thread.
          try {
            then(std::move(text));
          } catch (const std::exception& failure) {
            once->report(failure.what());
          }
        });
  });
}

std::string unexpected(std::string_view text, const std::string& what) {
  return "it sent '" + printable(text, 80) + "' where its " + what +
      " was expected";
}

// "<word> <hex>..." with the given hex fields' byte counts, or nullopt.
std::optional<std::vector<std::string>> parseHexFields(
    std::string_view text,
    std::string_view word,
    std::initializer_list<size_t> sizes) {
  const auto words = splitWords(text);
  if (words.size() != sizes.size() + 1 || words[0] != word) {
    return std::nullopt;
  }
  std::vector<std::string> fields;
  size_t index = 1;
  for (const size_t bytes : sizes) {
    auto field = auth::fromHex(words[index++], bytes);
    if (!field) {
      return std::nullopt;
    }
    fields.push_back(std::move(*field));
  }
  return fields;
}

} // namespace

std::string encodeChallenge(std::string_view nonce) {
  return std::string(kChallenge) + " " + auth::toHex(nonce);
}

std::optional<std::string> parseChallenge(std::string_view text) {
  auto fields = parseHexFields(text, kChallenge, {kNonceBytes});
  return fields ? std::optional<std::string>(std::move((*fields)[0]))
                : std::nullopt;
}

std::string encodeProof(const Proof& proof) {
  return std::string(kProof) + " " + auth::toHex(proof.nonce) + " " +
      auth::toHex(proof.mac);
}

std::optional<Proof> parseProof(std::string_view text) {
  auto fields = parseHexFields(text, kProof, {kNonceBytes, kMacBytes});
  return fields
      ? std::optional<Proof>(Proof{std::move((*fields)[0]), (*fields)[1]})
      : std::nullopt;
}

std::string encodeWelcome(std::string_view mac) {
  return std::string(kWelcome) + " " + auth::toHex(mac);
}

std::optional<std::string> parseWelcome(std::string_view text) {
  auto fields = parseHexFields(text, kWelcome, {kMacBytes});
  return fields ? std::optional<std::string>(std::move((*fields)[0]))
                : std::nullopt;
}

std::string sessionKey(
    std::string_view key,
    std::string_view hello,
    std::string_view listenerNonce,
    std::string_view diallerNonce) {
  return handshakeMac(key, "session", hello, listenerNonce, diallerNonce);
}

std::string handshakeMac(
    std::string_view key,
    std::string_view role,
    std::string_view hello,
    std::string_view listenerNonce,
    std::string_view diallerNonce) {
  std::string signed_ = "fairring-rails ";
  signed_.append(role).append("\n").append(hello).append("\n");
  signed_.append(listenerNonce).append("\n").append(diallerNonce);
  return auth::hmacSha256(key, signed_);
}

void dialAuthenticated(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    std::string hello,
    std::string key,
    Handshaken done) {
  auto once = std::make_shared<Once>(std::move(done));
  writeText(pipe, hello, once, "hello");
  readText(
      pipe,
      once,
      "challenge",
      [pipe, once, hello, key = std::move(key)](std::string text) {
        const auto listenerNonce = parseChallenge(text);
        if (!listenerNonce) {
          once->report(unexpected(text, "challenge"));
          return;
        }
        const std::string diallerNonce = auth::randomBytes(kNonceBytes);
        writeText(
            pipe,
            encodeProof(
                {diallerNonce,
                 handshakeMac(
                     key, "dialler", hello, *listenerNonce, diallerNonce)}),
            once,
            "proof");
        readText(
            pipe,
            once,
            "welcome (the listener refuses a proof made with another key: do "
            "all ranks have the same FAIRRING_RAILS_SECRET?)",
            [once,
             expected = handshakeMac(
                 key, "listener", hello, *listenerNonce, diallerNonce),
             session = sessionKey(key, hello, *listenerNonce, diallerNonce)](
                std::string text) {
              const auto mac = parseWelcome(text);
              if (!mac) {
                once->report(unexpected(text, "welcome"));
              } else if (!auth::equalInConstantTime(*mac, expected)) {
                once->report(
                    "its welcome does not show this group's rails key: it is "
                    "not the rank the store named");
              } else {
                once->report("", session);
              }
            });
      });
}

void challengeDialler(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    std::string hello,
    std::string key,
    Handshaken done) {
  auto once = std::make_shared<Once>(std::move(done));
  std::string listenerNonce;
  try {
    listenerNonce = auth::randomBytes(kNonceBytes);
  } catch (const std::exception& failure) {
    once->report(failure.what());
    return;
  }
  writeText(pipe, encodeChallenge(listenerNonce), once, "challenge");
  readText(
      pipe,
      once,
      "proof",
      [pipe,
       once,
       hello = std::move(hello),
       key = std::move(key),
       listenerNonce](std::string text) {
        const auto proof = parseProof(text);
        if (!proof) {
          once->report(unexpected(text, "proof"));
          return;
        }
        // The negative control of the forger tests: a listener that admits
        // whatever proof comes.
        const bool checked =
            testSwitch(TestSwitch::kRailsProofUnchecked) != "1";
        if (checked &&
            !auth::equalInConstantTime(
                proof->mac,
                handshakeMac(
                    key, "dialler", hello, listenerNonce, proof->nonce))) {
          once->report(
              "its proof does not show this group's rails key (a forger, a "
              "replayed handshake, or a rank with another "
              "FAIRRING_RAILS_SECRET)");
          return;
        }
        writeText(
            pipe,
            encodeWelcome(handshakeMac(
                key, "listener", hello, listenerNonce, proof->nonce)),
            once,
            "welcome",
            sessionKey(key, hello, listenerNonce, proof->nonce));
      });
}

} // namespace fairring::rails
