#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/tensorpipe/connection.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <tensorpipe/tensorpipe.h>

#include "rails/peer_text.h"
#include "rails/tensorpipe/cuda.h"
#include "test_switches.h"

namespace fairring::rails {

namespace {

tensorpipe::Buffer tensorpipeBuffer(const Buffer& buffer) {
  if (buffer.device.is_cpu()) {
    return tensorpipe::CpuBuffer{buffer.data};
  }
  return cudaBuffer(buffer);
}

std::string errorText(const tensorpipe::Error& error) {
  return error ? error.what() : std::string();
}

// What a sealed note authenticates beside its text.
constexpr std::string_view kNoteData = "fairring-rails note";

} // namespace

TensorpipeConnection::TensorpipeConnection(
    std::shared_ptr<tensorpipe::Pipe> pipe,
    tensorpipe::Device own,
    tensorpipe::Device target,
    std::unique_ptr<PipeCipher> cipher)
    : pipe_(std::move(pipe)),
      own_(own),
      target_(target),
      cipher_(std::move(cipher)),
      tamper_(testSwitch(TestSwitch::kRailsTamper) == "1") {}

void TensorpipeConnection::write(
    std::string tag, const Buffer& buffer, Done done) {
  if ((cipher_ || tamper_) && !buffer.device.is_cpu()) {
    done("the rails encrypt CPU buffers only, not " + buffer.device.str());
    return;
  }
  tensorpipe::Message message;
  // What goes on the wire where it is not the buffer itself: owned by the
  // write's callback, as TensorPipe reads it until then.
  std::shared_ptr<std::vector<uint8_t>> wire;
  std::unique_lock<std::recursive_mutex> lock(writing_, std::defer_lock);
  if (cipher_) {
    lock.lock();
    wire = std::make_shared<std::vector<uint8_t>>(
        buffer.bytes + PipeCipher::kSealBytes);
    cipher_->sealNext(tag, buffer.data, buffer.bytes, wire->data());
  } else if (tamper_) {
    const auto* bytes = static_cast<const uint8_t*>(buffer.data);
    wire = std::make_shared<std::vector<uint8_t>>(bytes, bytes + buffer.bytes);
  }
  if (tamper_ && !wire->empty()) {
    (*wire)[0] ^= 1;
  }
  message.metadata = std::move(tag);
  // Naming the target device lets TensorPipe send the data at once instead
  // of waiting for the reader to allocate: one round trip less per message.
  if (wire) {
    message.tensors.push_back(
        {tensorpipe::CpuBuffer{wire->data()}, wire->size(), target_, ""});
  } else {
    message.tensors.push_back(
        {tensorpipeBuffer(buffer), buffer.bytes, target_, ""});
  }
  pipe_->write(
      std::move(message),
      [done = std::move(done), wire](const tensorpipe::Error& error) {
        done(errorText(error));
      });
}

void TensorpipeConnection::read(
    std::string tag, const Buffer& target, Received received) {
  pipe_->readDescriptor(
      [this, tag = std::move(tag), target, received = std::move(received)](
          const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
        if (error) {
          received(errorText(error), "", 0);
          return;
        }
        // Numbered in arrival order, whatever becomes of it.
        const uint64_t number = cipher_ ? cipher_->nextReceived() : 0;
        if (descriptor.tensors.size() != 1 || !descriptor.payloads.empty()) {
          received(
              "a message with " + std::to_string(descriptor.tensors.size()) +
                  " tensors and " + std::to_string(descriptor.payloads.size()) +
                  " payloads arrived where one tensor was expected",
              "",
              0);
          return;
        }
        const auto& tensor = descriptor.tensors[0];
        if (tensor.sourceDevice.type != own_.type || !tensor.targetDevice ||
            !(*tensor.targetDevice == own_)) {
          received(
              "a message from " + tensor.sourceDevice.toString() + " for " +
                  (tensor.targetDevice ? tensor.targetDevice->toString()
                                       : std::string("no named device")) +
                  " arrived where " + own_.toString() + " was expected",
              "",
              0);
          return;
        }
        const size_t sealing = cipher_ ? PipeCipher::kSealBytes : 0;
        const size_t bytes = tensor.length;
        if (descriptor.metadata != tag || bytes != target.bytes + sealing) {
          // Its payload stays unread: the reader fails the protocol.
          received(
              "",
              std::move(descriptor.metadata),
              bytes >= sealing ? bytes - sealing : bytes);
          return;
        }
        tensorpipe::Allocation allocation;
        if (!cipher_) {
          allocation.tensors.push_back({tensorpipeBuffer(target)});
          pipe_->read(
              std::move(allocation),
              [tag = std::move(descriptor.metadata), bytes, received](
                  const tensorpipe::Error& error) mutable {
                received(errorText(error), std::move(tag), bytes);
              });
          return;
        }
        if (!target.device.is_cpu()) {
          received("the rails decrypt into CPU buffers only", "", 0);
          return;
        }
        auto sealed = std::make_shared<std::vector<uint8_t>>(bytes);
        allocation.tensors.push_back({tensorpipe::CpuBuffer{sealed->data()}});
        pipe_->read(
            std::move(allocation),
            [this,
             number,
             sealed,
             target,
             tag = std::move(descriptor.metadata),
             received](const tensorpipe::Error& error) mutable {
              // Opened in place, and copied out only once intact: no byte
              // of an altered message reaches the reader's memory.
              if (error) {
                received(errorText(error), std::move(tag), target.bytes);
              } else if (!cipher_->open(
                             number,
                             tag,
                             sealed->data(),
                             target.bytes,
                             sealed->data())) {
                received(
                    "message " + std::to_string(number) + " ('" +
                        printable(tag, 80) +
                        "') failed its authentication: it was altered, "
                        "replayed or reordered on the wire",
                    "",
                    0);
              } else {
                std::memcpy(target.data, sealed->data(), target.bytes);
                received("", std::move(tag), target.bytes);
              }
            });
      });
}

void TensorpipeConnection::writeNote(std::string text, Done done) {
  tensorpipe::Message message;
  std::unique_lock<std::recursive_mutex> lock(writing_, std::defer_lock);
  if (cipher_) {
    lock.lock();
    message.metadata.resize(text.size() + PipeCipher::kSealBytes);
    cipher_->sealNext(
        kNoteData, text.data(), text.size(), message.metadata.data());
  } else {
    message.metadata = std::move(text);
  }
  pipe_->write(
      std::move(message),
      [done = std::move(done)](const tensorpipe::Error& error) {
        done(errorText(error));
      });
}

void TensorpipeConnection::readNote(Note note) {
  pipe_->readDescriptor([this, note = std::move(note)](
                            const tensorpipe::Error& error,
                            tensorpipe::Descriptor descriptor) {
    if (error) {
      note(errorText(error), "");
      return;
    }
    const uint64_t number = cipher_ ? cipher_->nextReceived() : 0;
    const size_t sealing = cipher_ ? PipeCipher::kSealBytes : 0;
    const size_t length = descriptor.metadata.size();
    if (!descriptor.tensors.empty() || !descriptor.payloads.empty()) {
      note("a message with data arrived where a note was expected", "");
    } else if (length > kMaxNoteBytes + sealing || length < sealing) {
      note(
          "a note of " + std::to_string(length) + " bytes arrived (at most " +
              std::to_string(kMaxNoteBytes) + " are allowed)",
          "");
    } else {
      pipe_->read(
          tensorpipe::Allocation{},
          [this, number, note, text = std::move(descriptor.metadata)](
              const tensorpipe::Error& error) mutable {
            if (error) {
              note(errorText(error), "");
            } else if (!cipher_) {
              note("", std::move(text));
            } else {
              std::string plain(text.size() - PipeCipher::kSealBytes, '\0');
              if (cipher_->open(
                      number,
                      kNoteData,
                      text.data(),
                      plain.size(),
                      plain.data())) {
                note("", std::move(plain));
              } else {
                note(
                    "note " + std::to_string(number) +
                        " failed its authentication: it was altered, "
                        "replayed or reordered on the wire",
                    "");
              }
            }
          });
    }
  });
}

void TensorpipeConnection::close() {
  pipe_->close();
}

} // namespace fairring::rails
