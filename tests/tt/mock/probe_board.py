"""Run by the ttnn venv (Python 3.12, ttnn 0.81.1) under TT_METAL_MOCK_CLUSTER_DESC_PATH: open the
mock box and print one line, "TTNN_PROBE_RESULT " + JSON, of what tt-metal reports for it.

argv: rows cols l1_small_size trace_region_size. A 1x1 mesh opens as a single device
(``ttnn.open_device``); anything larger sets FABRIC_1D and opens ``ttnn.open_mesh_device`` with
that shape. Run it in an empty working directory: mock mode writes ./generated/.
"""

import json
import sys

import ttnn

MARKER = "TTNN_PROBE_RESULT "


def view(dev, buffer_type):
    v = ttnn.get_memory_view(dev, buffer_type)
    return {"banks": v.num_banks, "bytes_per_bank": v.total_bytes_per_bank}


def main() -> None:
    rows, cols, l1_small, trace = (int(a) for a in sys.argv[1:5])
    cluster_type = ttnn.cluster.get_cluster_type().name
    kw = {"l1_small_size": l1_small, "trace_region_size": trace}
    if (rows, cols) == (1, 1):
        dev = ttnn.open_device(device_id=0, **kw)
    else:
        ttnn.set_fabric_config(ttnn.FabricConfig.FABRIC_1D)
        dev = ttnn.open_mesh_device(ttnn.MeshShape(rows, cols), **kw)
    try:
        # Grid, banks and base addresses are per chip; on a mesh its allocator keeps every chip's
        # banks in lock-step, so the mesh answers for one device of it.
        grid = dev.compute_with_storage_grid_size()
        dram_grid = dev.dram_grid_size()
        out = {
            "cluster_type": cluster_type,
            "num_devices": dev.get_num_devices(),
            "mesh": [rows, cols],
            "grid": [grid.x, grid.y],
            "dram_grid": [dram_grid.x, dram_grid.y],
            "dram": view(dev, ttnn.BufferType.DRAM),
            "l1": view(dev, ttnn.BufferType.L1),
            "trace": view(dev, ttnn.BufferType.TRACE),
            "dram_base": ttnn.get_allocator_base_address(dev, ttnn.BufferType.DRAM),
            "l1_base": ttnn.get_allocator_base_address(dev, ttnn.BufferType.L1),
        }
    finally:
        if (rows, cols) == (1, 1):
            ttnn.close_device(dev)
        else:
            ttnn.close_mesh_device(dev)
    print(MARKER + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
