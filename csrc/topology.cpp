#include "topology.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include <c10/util/Exception.h>

namespace fairring {

struct Topology::View {
  int worldSize = 0;
  int machine = -1;
  std::vector<int> localRanks;
  std::vector<int> railPeers;
  std::vector<int> machineSizes;
};

// The view of `rank` within a whole layout, after checking that the layout
// numbers its ranks 0..N-1, each once, on non-empty machines.
Topology::View Topology::viewOf(
    int rank, const std::vector<std::vector<int>>& machines) {
  TORCH_CHECK(!machines.empty(), "fairring: a topology needs a machine");
  Topology::View view;
  std::vector<bool> seen;
  int localIndex = -1;
  for (size_t m = 0; m < machines.size(); ++m) {
    TORCH_CHECK(
        !machines[m].empty(),
        "fairring: machine ",
        m,
        " of the topology is empty");
    view.machineSizes.push_back(static_cast<int>(machines[m].size()));
    for (size_t l = 0; l < machines[m].size(); ++l) {
      const int r = machines[m][l];
      TORCH_CHECK(r >= 0, "fairring: negative rank ", r, " in topology");
      if (static_cast<size_t>(r) >= seen.size()) {
        seen.resize(r + 1, false);
      }
      TORCH_CHECK(!seen[r], "fairring: rank ", r, " appears twice in topology");
      seen[r] = true;
      ++view.worldSize;
      if (r == rank) {
        view.machine = static_cast<int>(m);
        localIndex = static_cast<int>(l);
      }
    }
  }
  TORCH_CHECK(
      seen.size() == static_cast<size_t>(view.worldSize),
      "fairring: topology ranks are not 0..",
      view.worldSize - 1);
  TORCH_CHECK(
      view.machine >= 0, "fairring: rank ", rank, " is missing from topology");
  view.localRanks = machines[view.machine];
  const bool regular = std::all_of(
      machines.begin(), machines.end(), [&](const std::vector<int>& ranks) {
        return ranks.size() == machines.front().size();
      });
  if (regular) {
    for (const auto& ranksOnMachine : machines) {
      view.railPeers.push_back(ranksOnMachine[localIndex]);
    }
  }
  return view;
}

Topology::Topology(int rank, std::vector<std::vector<int>> machines)
    : Topology(rank, viewOf(rank, machines)) {
  layout_ = std::move(machines);
}

Topology Topology::withLayout(std::vector<std::vector<int>> machines) const {
  const View view = viewOf(rank_, machines);
  TORCH_CHECK(
      view.worldSize == worldSize_ && view.machine == machine_ &&
          view.localRanks == localRanks_ && view.railPeers == railPeers_ &&
          view.machineSizes == machineSizes_,
      "fairring: rank ",
      rank_,
      " was given a layout of the group that disagrees with its own view (",
      describe(),
      ")");
  Topology whole = *this;
  whole.layout_ = std::move(machines);
  return whole;
}

Topology::Topology(int rank, View view)
    : Topology(
          rank,
          view.worldSize,
          view.machine,
          std::move(view.localRanks),
          std::move(view.railPeers),
          std::move(view.machineSizes)) {}

Topology::Topology(
    int rank,
    int worldSize,
    int machine,
    std::vector<int> localRanks,
    std::vector<int> railPeers,
    std::vector<int> machineSizes)
    : rank_(rank),
      worldSize_(worldSize),
      machine_(machine),
      localRanks_(std::move(localRanks)),
      railPeers_(std::move(railPeers)),
      machineSizes_(std::move(machineSizes)) {
  const auto inGroup = [&](int r) { return r >= 0 && r < worldSize_; };
  TORCH_CHECK(
      inGroup(rank_),
      "fairring: rank ",
      rank_,
      " is not in a group of ",
      worldSize_);
  TORCH_CHECK(
      machine_ >= 0 && machine_ < numMachines(),
      "fairring: machine ",
      machine_,
      " is not one of ",
      numMachines());
  TORCH_CHECK(
      std::all_of(
          machineSizes_.begin(),
          machineSizes_.end(),
          [](int size) { return size > 0; }) &&
          std::accumulate(machineSizes_.begin(), machineSizes_.end(), 0) ==
              worldSize_,
      "fairring: machine sizes do not add up to the group's ",
      worldSize_,
      " ranks");
  TORCH_CHECK(
      static_cast<int>(localRanks_.size()) == machineSizes_[machine_],
      "fairring: machine ",
      machine_,
      " holds ",
      machineSizes_[machine_],
      " ranks but ",
      localRanks_.size(),
      " were given");
  regular_ =
      std::all_of(machineSizes_.begin(), machineSizes_.end(), [&](int size) {
        return size == machineSizes_.front();
      });
  for (size_t l = 0; l < localRanks_.size(); ++l) {
    const int r = localRanks_[l];
    TORCH_CHECK(
        inGroup(r) &&
            known_.emplace(r, Place{machine_, static_cast<int>(l)}).second,
        "fairring: local rank ",
        r,
        " is repeated or not in the group");
    if (r == rank_) {
      localRank_ = static_cast<int>(l);
    }
  }
  TORCH_CHECK(
      localRank_ >= 0,
      "fairring: rank ",
      rank_,
      " is not among its machine's ranks");
  TORCH_CHECK(
      railPeers_.size() == (regular_ ? machineSizes_.size() : 0),
      "fairring: expected a rail peer per machine of a regular group, and none "
      "otherwise");
  for (size_t m = 0; m < railPeers_.size(); ++m) {
    const int r = railPeers_[m];
    const bool own = static_cast<int>(m) == machine_;
    TORCH_CHECK(
        own ? r == rank_
            : inGroup(r) &&
                known_.emplace(r, Place{static_cast<int>(m), localRank_})
                    .second,
        "fairring: rail peer ",
        r,
        " on machine ",
        m,
        " is not a distinct rank of the group");
  }
}

std::vector<int> Topology::neighbours() const {
  TORCH_CHECK(
      regular(),
      "fairring: rails need every machine to hold equally many ranks");
  std::vector<int> found;
  for (int machine = 0; machine < numMachines(); ++machine) {
    if (machine != machine_) {
      found.push_back(railPeers_[machine]);
    }
  }
  for (int local : localRanks_) {
    if (local != rank_) {
      found.push_back(local);
    }
  }
  return found;
}

int Topology::machineOf(int rank) const {
  const auto place = known_.find(rank);
  return place == known_.end() ? -1 : place->second.machine;
}

int Topology::localIndexOf(int rank) const {
  const auto place = known_.find(rank);
  return place == known_.end() ? -1 : place->second.localIndex;
}

std::string Topology::describe() const {
  const auto list = [](const std::vector<int>& values) {
    std::string text = "[";
    for (size_t i = 0; i < values.size(); ++i) {
      text += (i ? "," : "") + std::to_string(values[i]);
    }
    return text + "]";
  };
  std::ostringstream out;
  out << numMachines() << " machine(s)";
  if (regular_) {
    out << " x " << localSize() << " rank(s)";
  } else {
    out << " (irregular: the flat path serves it; sizes " << list(machineSizes_)
        << ")";
  }
  out << "; rank " << rank_ << " is local rank " << localRank_ << " of machine "
      << machine_ << " with ranks " << list(localRanks_);
  if (regular_ && numMachines() > 1) {
    out << "; rail " << localRank_ << ": " << list(railPeers_);
  }
  return out.str();
}

std::string Topology::describeRank(int rank) const {
  const int machine = machineOf(rank);
  return "rank " + std::to_string(rank) +
      (machine < 0 ? std::string()
                   : " (machine " + std::to_string(machine) + " of " +
               std::to_string(numMachines()) + ")");
}

} // namespace fairring
