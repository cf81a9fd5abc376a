#pragma once

#include <string>
#include <vector>

namespace fairring {

// How the ranks of one process group map onto machines.
//
// Discovery (environment, store exchange, validation) happens in Python
// (fairring/topology.py); this is the validated result, as plain data. Ranks
// are the group's ranks. Machines are ordered the same way on every rank, and
// ranks within a machine by their local index, which is also their rail: rail
// i connects local rank i of every machine.
class Topology {
 public:
  // machines[m] lists the group ranks on machine m, in local-rank order.
  // Machines may hold different numbers of ranks (see regular()).
  Topology(int rank, std::vector<std::vector<int>> machines);

  int rank() const {
    return rank_;
  }
  int worldSize() const {
    return worldSize_;
  }
  int numMachines() const {
    return static_cast<int>(machines_.size());
  }
  // Every machine holds the same number of ranks. Only such groups have
  // rails (and an engine); the others take the flat path.
  bool regular() const {
    return regular_;
  }
  // The Herring engine can serve this group: 2+ machines, regular.
  bool servesEngine() const {
    return regular_ && numMachines() > 1;
  }
  // Ranks on this rank's machine.
  int localSize() const {
    return static_cast<int>(machines_[machine_].size());
  }
  int machine() const {
    return machine_;
  }
  int localRank() const {
    return localRank_;
  }
  // Group ranks that share this rank's machine, in local-rank order.
  const std::vector<int>& localRanks() const {
    return machines_[machine_];
  }
  // The group rank with this rank's local index on each machine, by machine;
  // empty unless regular().
  const std::vector<int>& railPeers() const {
    return railPeers_;
  }
  const std::vector<std::vector<int>>& machines() const {
    return machines_;
  }
  // The machine of `rank`, and its index there; -1 for a rank not in the
  // group (callers may pass ranks a peer named).
  int machineOf(int rank) const {
    return rank >= 0 && rank < worldSize_ ? machineOf_[rank] : -1;
  }
  int localIndexOf(int rank) const {
    return rank >= 0 && rank < worldSize_ ? localIndexOf_[rank] : -1;
  }

  std::string describe() const;
  // "rank 3 (machine 1 of 2)", as errors name a rank.
  std::string describeRank(int rank) const;

 private:
  int rank_;
  int worldSize_ = 0;
  int machine_ = -1;
  int localRank_ = -1;
  bool regular_ = true;
  std::vector<std::vector<int>> machines_;
  std::vector<int> railPeers_;
  std::vector<int> machineOf_; // by rank
  std::vector<int> localIndexOf_; // by rank
};

} // namespace fairring
