#pragma once

// The key a group's rails prove they hold before anything is read from a
// connection (tensorpipe/handshake.h). Each group gets its own, so that a
// split, a shrink or a new group never accepts another's peers:
//
//   - without FAIRRING_RAILS_SECRET, 32 random bytes that the group's first
//     rank to ask puts in the group's store (a compare-and-set, so every rank
//     reads the same), trusted as the rendezvous is: whoever can read the
//     store can read the key;
//   - with it (for a store that is not trusted), HMAC-SHA256 of that store
//     value under the operator's secret: the store's value then only makes
//     the key differ per group, and reading it gives nothing away.
//
// The key never goes over the rails.

#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace fairring::rails::auth {

// This group's rails key (kKeyBytes), met under `storeKey` in the group's
// store (torch prefixes it per group). `operatorSecret`:
// FAIRRING_RAILS_SECRET, or empty.
std::string railsKey(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& storeKey,
    const std::string& operatorSecret);

} // namespace fairring::rails::auth
