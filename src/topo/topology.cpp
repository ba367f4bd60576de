#include "topo/topology.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <fstream>

#include "core/driver.hpp"
#include "core/error.hpp"

namespace ferry {

bool Topology::fully_connected() const {
  for (int i = 0; i < size(); ++i)
    for (int j = 0; j < size(); ++j)
      if (i != j && !p2p[i][j]) return false;
  return true;
}

bool Topology::nvswitch() const {
  if (gpus.empty()) return false;
  for (const auto& g : gpus)
    if (g.nvswitch_links == 0) return false;
  return true;
}

bool same_pci_bus_id(const std::string& a, const std::string& b) {
  unsigned da = 0, ba = 0, va = 0, fa = 0, db = 0, bb = 0, vb = 0, fb = 0;
  if (std::sscanf(a.c_str(), "%x:%x:%x.%x", &da, &ba, &va, &fa) != 4) return false;
  if (std::sscanf(b.c_str(), "%x:%x:%x.%x", &db, &bb, &vb, &fb) != 4) return false;
  return da == db && ba == bb && va == vb && fa == fb;
}

static int read_numa_node(const std::string& bus_id) {
  std::string lower;
  for (char c : bus_id) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::ifstream f("/sys/bus/pci/devices/" + lower + "/numa_node");
  int node = -1;
  if (f >> node) return node;
  return -1;
}

Topology probe_topology() {
  Topology topo;
  topo.source = "probe";
  int count = 0;
  FERRY_CUDA_CHECK(cudaGetDeviceCount(&count));
  const DriverApi& cu = driver();
  FERRY_CUDA_CHECK(cudaDriverGetVersion(&topo.driver_version));
  FERRY_CUDA_CHECK(cudaRuntimeGetVersion(&topo.runtime_version));
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    FERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    GpuInfo g;
    g.index = d;
    g.name = prop.name;
    char bus[32] = {0};
    FERRY_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), d));
    g.pci_bus_id = bus;
    g.numa_node = read_numa_node(g.pci_bus_id);
    g.copy_engines = prop.asyncEngineCount;
    g.sm_count = prop.multiProcessorCount;
    g.memory_bytes = prop.totalGlobalMem;
    int v = 0;
    // CUDA 12+ always offers the memory operations; 64-bit ones and VMM fds are per device.
    g.stream_memops = topo.driver_version >= 12000;
    if (cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, d) == CUDA_SUCCESS)
      g.memops_64bit = v != 0;
    if (cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d) == CUDA_SUCCESS)
      g.vmm_posix_fd = v != 0;
    topo.gpus.push_back(g);
  }
  topo.p2p.assign(count, std::vector<int>(count, 0));
  topo.nvlink.assign(count, std::vector<int>(count, 0));
  for (int i = 0; i < count; ++i)
    for (int j = 0; j < count; ++j) {
      if (i == j) continue;
      int can = 0;
      FERRY_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, i, j));
      topo.p2p[i][j] = can;
    }
  fill_from_nvml(topo);
  return topo;
}

}  // namespace ferry
