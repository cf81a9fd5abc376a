#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace fairring {

// How the ranks of one process group map onto machines, as one rank sees it.
//
// Discovery (environment, store rendezvous, validation) happens in Python
// (fairring/_topology.py, fairring/_rendezvous.py); this is the validated
// result, as plain data. Ranks are the group's ranks. Machines are ordered the
// same way on every rank, and ranks within a machine by their local index,
// which is also their rail: rail i connects local rank i of every machine.
//
// A rank knows only what it needs, so that its state and its rendezvous do
// not grow with the world beyond its machine and its rail: the ranks of its
// own machine, its rail peer on every machine, and every machine's size.
class Topology {
 public:
  // The whole layout: machines[m] lists the group ranks on machine m, in
  // local-rank order. Machines may hold different numbers of ranks (see
  // regular()). For tests and tools; groups are built from a rank's view.
  Topology(int rank, std::vector<std::vector<int>> machines);
  // One rank's view: its machine's index and ranks (in local order), its
  // rail peer on every machine (empty unless every machine has the same
  // size), and every machine's size. Checked for consistency.
  Topology(
      int rank,
      int worldSize,
      int machine,
      std::vector<int> localRanks,
      std::vector<int> railPeers,
      std::vector<int> machineSizes);

  int rank() const {
    return rank_;
  }
  int worldSize() const {
    return worldSize_;
  }
  int numMachines() const {
    return static_cast<int>(machineSizes_.size());
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
    return static_cast<int>(localRanks_.size());
  }
  int machine() const {
    return machine_;
  }
  int localRank() const {
    return localRank_;
  }
  // Group ranks that share this rank's machine, in local-rank order.
  const std::vector<int>& localRanks() const {
    return localRanks_;
  }
  // The group rank with this rank's local index on each machine, by machine;
  // empty unless regular().
  const std::vector<int>& railPeers() const {
    return railPeers_;
  }
  // The ranks a rails mesh connects this rank to for control: its rail peers
  // by machine, then the other ranks of its machine by local index. Throws
  // unless regular().
  std::vector<int> neighbours() const;
  // How many ranks each machine holds, by machine.
  const std::vector<int>& machineSizes() const {
    return machineSizes_;
  }
  // The machine of `rank`, and its index there, for the ranks this rank
  // knows (its machine's and its rail peers); -1 for any other rank, and for
  // a rank not in the group (callers may pass ranks a peer named).
  int machineOf(int rank) const;
  int localIndexOf(int rank) const;

  // The whole layout (machines[m] lists machine m's ranks in local order)
  // where this rank was given it (withLayout; the Topology made from a whole
  // layout has it); else empty. A rank's view does not need it; the
  // engine's reduce-scatter and all-gather do.
  const std::vector<std::vector<int>>& layout() const {
    return layout_;
  }
  // This view with the whole layout, which must agree with it.
  Topology withLayout(std::vector<std::vector<int>> machines) const;

  std::string describe() const;
  // "rank 3 (machine 1 of 2)", as errors name a rank.
  std::string describeRank(int rank) const;

 private:
  struct View; // a rank's view, worked out from a whole layout
  Topology(int rank, View view);
  static View viewOf(int rank, const std::vector<std::vector<int>>& machines);

  struct Place {
    int machine;
    int localIndex;
  };

  int rank_;
  int worldSize_ = 0;
  int machine_ = -1;
  int localRank_ = -1;
  bool regular_ = true;
  std::vector<int> localRanks_;
  std::vector<int> railPeers_;
  std::vector<int> machineSizes_;
  std::unordered_map<int, Place> known_; // local ranks and rail peers
  std::vector<std::vector<int>> layout_;
};

} // namespace fairring
