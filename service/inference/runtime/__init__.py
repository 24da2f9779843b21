"""The runtime: the model repository (load and describe models), the CPU graphs' calibration, the engine and its
sessions, the batcher, run bounds, arenas and devices. It knows no protocol and no shared memory."""
