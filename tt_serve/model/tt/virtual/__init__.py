"""The device model: board table, tt-metal's op rules, the DRAM model, the virtual ttnn device and mesh."""
