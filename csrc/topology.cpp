#include "topology.h"

#include <sstream>

#include <c10/util/Exception.h>

namespace fairring {

Topology::Topology(int rank, std::vector<std::vector<int>> machines)
    : rank_(rank), machines_(std::move(machines)) {
  TORCH_CHECK(!machines_.empty(), "fairring: a topology needs a machine");
  std::vector<bool> seen;
  for (size_t m = 0; m < machines_.size(); ++m) {
    TORCH_CHECK(
        !machines_[m].empty(), "fairring: machine ", m, " of the topology is empty");
    regular_ = regular_ && machines_[m].size() == machines_.front().size();
    for (size_t l = 0; l < machines_[m].size(); ++l) {
      const int r = machines_[m][l];
      TORCH_CHECK(r >= 0, "fairring: negative rank ", r, " in topology");
      if (static_cast<size_t>(r) >= seen.size()) {
        seen.resize(r + 1, false);
      }
      TORCH_CHECK(!seen[r], "fairring: rank ", r, " appears twice in topology");
      seen[r] = true;
      ++worldSize_;
      if (r == rank_) {
        machine_ = static_cast<int>(m);
        localRank_ = static_cast<int>(l);
      }
    }
  }
  TORCH_CHECK(
      seen.size() == static_cast<size_t>(worldSize_),
      "fairring: topology ranks are not 0..",
      worldSize_ - 1);
  TORCH_CHECK(
      machine_ >= 0, "fairring: rank ", rank_, " is missing from topology");
  machineOf_.resize(worldSize_);
  localIndexOf_.resize(worldSize_);
  for (size_t m = 0; m < machines_.size(); ++m) {
    for (size_t l = 0; l < machines_[m].size(); ++l) {
      machineOf_[machines_[m][l]] = static_cast<int>(m);
      localIndexOf_[machines_[m][l]] = static_cast<int>(l);
    }
  }
  if (regular_) {
    railPeers_.reserve(machines_.size());
    for (const auto& ranksOnMachine : machines_) {
      railPeers_.push_back(ranksOnMachine[localRank_]);
    }
  }
}

std::string Topology::describe() const {
  std::ostringstream out;
  out << numMachines() << " machine(s)";
  if (regular_) {
    out << " x " << localSize() << " rank(s)";
  } else {
    out << " (irregular: the flat path serves it)";
  }
  out << "; rank " << rank_ << " is local rank " << localRank_
      << " of machine " << machine_ << "; machines:";
  for (const auto& ranksOnMachine : machines_) {
    out << " [";
    for (size_t i = 0; i < ranksOnMachine.size(); ++i) {
      out << (i ? "," : "") << ranksOnMachine[i];
    }
    out << "]";
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
