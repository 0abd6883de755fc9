"""Verification: the status lattice and the probes' shared machinery."""
