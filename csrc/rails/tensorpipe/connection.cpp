#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/tensorpipe/connection.h"

#include <tensorpipe/tensorpipe.h>

#include "rails/tensorpipe/cuda.h"

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

} // namespace

TensorpipeConnection::TensorpipeConnection(
    std::shared_ptr<tensorpipe::Pipe> pipe,
    tensorpipe::Device own,
    tensorpipe::Device target)
    : pipe_(std::move(pipe)), own_(own), target_(target) {}

void TensorpipeConnection::write(
    std::string tag, const Buffer& buffer, Done done) {
  tensorpipe::Message message;
  message.metadata = std::move(tag);
  // Naming the target device lets TensorPipe send the data at once instead
  // of waiting for the reader to allocate: one round trip less per message.
  message.tensors.push_back(
      {tensorpipeBuffer(buffer), buffer.bytes, target_, ""});
  pipe_->write(
      std::move(message),
      [done = std::move(done)](const tensorpipe::Error& error) {
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
        const size_t bytes = tensor.length;
        if (descriptor.metadata != tag || bytes != target.bytes) {
          // Its payload stays unread: the reader fails the protocol.
          received("", std::move(descriptor.metadata), bytes);
          return;
        }
        tensorpipe::Allocation allocation;
        allocation.tensors.push_back({tensorpipeBuffer(target)});
        pipe_->read(
            std::move(allocation),
            [tag = std::move(descriptor.metadata), bytes, received](
                const tensorpipe::Error& error) mutable {
              received(errorText(error), std::move(tag), bytes);
            });
      });
}

void TensorpipeConnection::writeNote(std::string text, Done done) {
  tensorpipe::Message message;
  message.metadata = std::move(text);
  pipe_->write(
      std::move(message),
      [done = std::move(done)](const tensorpipe::Error& error) {
        done(errorText(error));
      });
}

void TensorpipeConnection::readNote(Note note) {
  pipe_->readDescriptor([pipe = pipe_, note = std::move(note)](
                            const tensorpipe::Error& error,
                            tensorpipe::Descriptor descriptor) {
    if (error) {
      note(errorText(error), "");
    } else if (!descriptor.tensors.empty() || !descriptor.payloads.empty()) {
      note("a message with data arrived where a note was expected", "");
    } else if (descriptor.metadata.size() > kMaxNoteBytes) {
      note(
          "a note of " + std::to_string(descriptor.metadata.size()) +
              " bytes arrived (at most " + std::to_string(kMaxNoteBytes) +
              " are allowed)",
          "");
    } else {
      pipe->read(
          tensorpipe::Allocation{},
          [note, text = std::move(descriptor.metadata)](
              const tensorpipe::Error& error) mutable {
            note(errorText(error), error ? std::string() : std::move(text));
          });
    }
  });
}

void TensorpipeConnection::close() {
  pipe_->close();
}

} // namespace fairring::rails
