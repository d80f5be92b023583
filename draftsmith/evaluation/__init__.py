"""Measuring decoding: the side-by-side benchmark, the divergence judge, fidelity of lossy
modes and tree-size sweeps."""
