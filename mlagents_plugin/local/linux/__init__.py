"""The Linux hardening layer (NOTE [ Portable core, Linux hardening ] in core/platform.py).

Imported only on Linux, behind a ``sys.platform`` check (``local.hardening.layer``, and
``local.fork_server`` for the forked fork server): everything here may use pidfds,
prctl, /proc, /dev/shm and the fork server.
"""
