"""System shared memory: what a request names (`refs`), the registry of each caller's regions (`registry`), a region
mapped and read or written (`region`), and who may open an object (`guard`)."""
