"""Which platform layer a process takes: the portable one (local/portable.py), what every platform
gets, or on Linux the hardening on top (local/linux/hardening.py), imported only here and only
there (NOTE [ Portable core, Linux hardening ] in core/platform.py). The supervisor picks the
layer once (``layer(platform.hardened())``) and tells its workers which, so that both sides of a
pipe take the same path.
"""
import sys

from mlagents_plugin.local.portable import Hardening


def layer(hardened: bool) -> Hardening:
    """The Linux hardening where asked for and available, else the portable path."""
    if sys.platform == "linux" and hardened:
        from mlagents_plugin.local.linux.hardening import LinuxHardening

        return LinuxHardening()
    return Hardening()
