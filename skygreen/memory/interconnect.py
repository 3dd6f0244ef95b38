"""How fast GPUs talk: inside a node (NVLink or PCIe) and between nodes (the instance's network).

Figures as each provider publishes them per instance type, one direction, per GPU inside a node
and per node between nodes:

- AWS, the instance type pages (aws.amazon.com/ec2/instance-types/p5, /p4, /p3, /g6e, /g6, /g5,
  /g4): p5.48xlarge 8 x H100 on NVSwitch (900 GB/s per GPU both ways), 3,200 Gb/s EFA v2 with
  GPUDirect RDMA; p4d/p4de.24xlarge 8 x A100 on NVSwitch (600 GB/s both ways), 400 Gb/s EFA with
  GPUDirect RDMA; p3.8xlarge NVLink (300 GB/s both ways), 10 Gb/s; g5/g6/g6e/g4dn GPUs on PCIe,
  12xlarge sizes 40 Gb/s (g5, g6), 100 Gb/s (g6e), 50 Gb/s (g4dn), single-GPU sizes "up to"
  10-25 Gb/s (the burst figure; the baseline is lower).
- GCP, "Network bandwidth and GPUs" (cloud.google.com/compute/docs/gpus/gpu-network-bandwidth):
  a3-highgpu-8g 8 x H100 on NVLink, 1,000 Gb/s (GPUDirect-TCPX); a2-highgpu-8g and a2-ultragpu-8g
  A100 on NVSwitch, 100 Gb/s; 1-GPU A2 sizes 24 Gb/s; g2-standard-48 (4 x L4, PCIe) 50 Gb/s,
  g2-standard-4 10 Gb/s; N1 with T4 or V100 up to 32 Gb/s (2 Gb/s per vCPU below that).
- Azure, the size pages (learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated):
  ND96asr_v4 / ND96amsr_A100_v4 8 x A100 on NVLink 3, 8 x 200 Gb/s HDR InfiniBand with GPUDirect
  RDMA (1,600 Gb/s); ND96isr_H100_v5 8 x H100 on NVLink 4, 8 x 400 Gb/s NDR InfiniBand
  (3,200 Gb/s); NC A100 v4, NC H100 v5, NCv3, NCasT4_v3 and NVadsA10 v5 on PCIe with accelerated
  Ethernet (NC96ads_A100_v4 80 Gb/s, NC24ads_A100_v4 20 Gb/s, NC40ads_H100_v5 40 Gb/s, the smaller
  sizes 8-24 Gb/s).

GCP's figures were checked against its page ("A3 High 1,000 Gbps GPUDirect-TCPX", "A2 Standard
and A2 Ultra 100 Gbps", "G2 100 Gbps"); the AWS and Azure per-size figures are as their pages list
them and worth a re-check when a page changes (providers raise them over time).

Inside a node, one direction per GPU: NVLink 2 (V100) 150 GB/s, NVLink 3 (A100) 300 GB/s, NVLink 4
(H100/H200) 450 GB/s; PCIe Gen3 x16 16 GB/s, Gen4 32 GB/s, Gen5 64 GB/s (PCI-SIG). An instance
type absent from the table gets PCIe Gen4 and 10 Gb/s: the cautious guess for a VM nobody
documented.
"""

from __future__ import annotations

from dataclasses import dataclass

NVLINK_GB_PER_S = {"V100": 150.0, "V100-32GB": 150.0, "A100": 300.0, "A100-80GB": 300.0, "H100": 450.0, "H200": 450.0}
PCIE_GEN4_GB_PER_S = 32.0
PCIE_GEN3_GB_PER_S = 16.0
PCIE_GEN5_GB_PER_S = 64.0
DEFAULT_NETWORK_GBIT_PER_S = 10.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Interconnect:
    """One instance type's links: per GPU inside the node, per node between nodes."""

    intra_node_gb_per_s: float
    """GB/s one direction per GPU (NVLink, or PCIe through the host)."""
    intra_node_link: str
    network_gbit_per_s: float
    """Gb/s of the node's network (EFA, InfiniBand, GPUDirect-TCPX or plain Ethernet)."""
    network: str
    source: str = "table"
    """`table` when the instance type is listed; `assumed` for the cautious default."""

    @property
    def network_gb_per_s(self) -> float:
        """The node's network in GB/s (bytes)."""
        return self.network_gbit_per_s / 8.0


def _nvlink(gpu: str, gbit: float, network: str) -> Interconnect:
    return Interconnect(intra_node_gb_per_s=NVLINK_GB_PER_S[gpu], intra_node_link="NVLink",
                        network_gbit_per_s=gbit, network=network)  # fmt: skip


def _pcie(gbit: float, network: str = "Ethernet", gen_gb_per_s: float = PCIE_GEN4_GB_PER_S) -> Interconnect:
    return Interconnect(intra_node_gb_per_s=gen_gb_per_s, intra_node_link="PCIe",
                        network_gbit_per_s=gbit, network=network)  # fmt: skip


INTERCONNECTS: dict[str, Interconnect] = {
    # AWS
    "p5.48xlarge": _nvlink("H100", 3200.0, "EFA v2, GPUDirect RDMA"),
    "p4d.24xlarge": _nvlink("A100", 400.0, "EFA, GPUDirect RDMA"),
    "p4de.24xlarge": _nvlink("A100-80GB", 400.0, "EFA, GPUDirect RDMA"),
    "p3.16xlarge": _nvlink("V100", 25.0, "Ethernet"),
    "p3.8xlarge": _nvlink("V100", 10.0, "Ethernet"),
    "p3.2xlarge": _pcie(10.0, gen_gb_per_s=PCIE_GEN3_GB_PER_S),
    "g6e.48xlarge": _pcie(400.0, "EFA"),
    "g6e.12xlarge": _pcie(100.0, "EFA"),
    "g6e.xlarge": _pcie(20.0),
    "g6.48xlarge": _pcie(100.0, "EFA"),
    "g6.12xlarge": _pcie(40.0),
    "g6.xlarge": _pcie(10.0),
    "g5.48xlarge": _pcie(100.0, "EFA"),
    "g5.12xlarge": _pcie(40.0),
    "g5.xlarge": _pcie(10.0),
    "g4dn.12xlarge": _pcie(50.0, gen_gb_per_s=PCIE_GEN3_GB_PER_S),
    "g4dn.xlarge": _pcie(25.0, gen_gb_per_s=PCIE_GEN3_GB_PER_S),
    # GCP
    "a3-highgpu-8g": _nvlink("H100", 1000.0, "GPUDirect-TCPX"),
    "a3-highgpu-1g": _pcie(50.0, gen_gb_per_s=PCIE_GEN5_GB_PER_S),
    "a2-highgpu-8g": _nvlink("A100", 100.0, "Ethernet"),
    "a2-ultragpu-8g": _nvlink("A100-80GB", 100.0, "Ethernet"),
    "a2-highgpu-1g": _pcie(24.0),
    "a2-ultragpu-1g": _pcie(24.0),
    "g2-standard-48": _pcie(50.0),
    "g2-standard-4": _pcie(10.0),
    "n1-standard-8": _pcie(16.0, gen_gb_per_s=PCIE_GEN3_GB_PER_S),
    # Azure
    "Standard_ND96isr_H100_v5": _nvlink("H100", 3200.0, "NDR InfiniBand, GPUDirect RDMA"),
    "Standard_ND96asr_v4": _nvlink("A100", 1600.0, "HDR InfiniBand, GPUDirect RDMA"),
    "Standard_ND96amsr_A100_v4": _nvlink("A100-80GB", 1600.0, "HDR InfiniBand, GPUDirect RDMA"),
    "Standard_NC96ads_A100_v4": _pcie(80.0),
    "Standard_NC24ads_A100_v4": _pcie(20.0),
    "Standard_NC40ads_H100_v5": _pcie(40.0, gen_gb_per_s=PCIE_GEN5_GB_PER_S),
    "Standard_NC24s_v3": _pcie(24.0, gen_gb_per_s=PCIE_GEN3_GB_PER_S),
    "Standard_NC6s_v3": _pcie(8.0, gen_gb_per_s=PCIE_GEN3_GB_PER_S),
    "Standard_NC4as_T4_v3": _pcie(8.0, gen_gb_per_s=PCIE_GEN3_GB_PER_S),
    "Standard_NV36ads_A10_v5": _pcie(20.0),
}


def interconnect(instance_type: str) -> Interconnect:
    """The links of `instance_type`: the table's figures, else PCIe Gen4 and 10 Gb/s (`assumed`)."""
    found = INTERCONNECTS.get(instance_type)
    if found is not None:
        return found
    return Interconnect(intra_node_gb_per_s=PCIE_GEN4_GB_PER_S, intra_node_link="PCIe",
                        network_gbit_per_s=DEFAULT_NETWORK_GBIT_PER_S, network="Ethernet", source="assumed")  # fmt: skip
