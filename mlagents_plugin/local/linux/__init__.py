"""The Linux hardening layer (NOTE [ Portable core, Linux hardening ] in core/platform.py).

Imported only on Linux, through ``local.hardening.layer``: everything here may use pidfds,
prctl, /proc, /dev/shm and the fork server.
"""
