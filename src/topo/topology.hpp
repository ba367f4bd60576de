// What ferry knows about the machine: GPUs, how they reach each other, copy
// engines, driver features. probe_topology() reads it from the driver and
// NVML; decisions take a Topology as data, so tests build one from JSON
// fixtures (python/ferry/topo.py) with no GPU at all.
#pragma once

#include <string>
#include <vector>

namespace ferry {

struct GpuInfo {
  int index = 0;
  std::string name;
  std::string pci_bus_id;  // "0000:18:00.0"
  int numa_node = -1;      // -1: unknown
  int copy_engines = 0;    // cudaDevAttrAsyncEngineCount
  int sm_count = 0;
  unsigned long long memory_bytes = 0;
  bool stream_memops = false;  // cuStreamWaitValue / cuStreamBatchMemOp usable
  bool memops_64bit = false;
  bool vmm_posix_fd = false;  // VMM with POSIX file descriptor export
  int nvswitch_links = 0;     // active NVLinks that end at an NVSwitch
};

struct Topology {
  std::vector<GpuInfo> gpus;
  std::vector<std::vector<int>> p2p;     // p2p[i][j] = 1: GPU i can access GPU j's memory
  std::vector<std::vector<int>> nvlink;  // direct NVLinks between i and j (through switch: see nvswitch_links)
  int driver_version = 0;                // e.g. 13000
  int runtime_version = 0;
  std::string source;  // "probe" or the file it was loaded from

  int size() const { return static_cast<int>(gpus.size()); }
  // True when every pair of GPUs can reach each other peer-to-peer.
  bool fully_connected() const;
  // True when all GPUs hang off NVSwitches (every pair talks over NVLink).
  bool nvswitch() const;
};

// Reads the local machine. Throws ferry::Error (FERRY_ERROR_NO_GPU) without a driver.
Topology probe_topology();

// NVML part of the probe (NUMA node, NVLinks); leaves fields as they are when
// NVML is missing. Defined in nvml.cpp.
void fill_from_nvml(Topology& topo);

// "00000000:18:00.0" and "0000:18:00.0" name the same device.
bool same_pci_bus_id(const std::string& a, const std::string& b);

// NVML's total energy counter of one GPU since the driver loaded, in
// millijoules; -1 when NVML or the counter is not available.
long long total_energy_mj(const std::string& pci_bus_id);
// Compute processes the driver lists on CUDA device `cuda_device`, this one
// included where it holds a context there; -1 where NVML cannot tell.
// Processes of other containers may not be listed.
int gpu_compute_processes(int cuda_device);

}  // namespace ferry
