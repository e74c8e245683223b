"""``python -m mlagents_plugin.player run ...`` (what a build's launcher runs) and
``python -m mlagents_plugin.player make-build DIR --scene NAME``."""
import argparse
import logging
import os
import signal
import sys
import threading
from typing import Callable, List, Optional

import psutil

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: it prints a notice on every close

from mlagents_plugin.player import cli  # noqa: E402
from mlagents_plugin.player.academy import Academy  # noqa: E402
from mlagents_plugin.player.build import make_build  # noqa: E402
from mlagents_plugin.player.communicator import BuildCommunicator, NoTrainer, TrainerGone  # noqa: E402
from mlagents_plugin.player.scenes import SCENES, make_scene  # noqa: E402

logger = logging.getLogger("mlagents_plugin.player")


def run(argv: List[str]) -> int:
    """Play a scene against the trainer on ``--mlagents-port``; return the exit code."""
    args, ignored = cli.parse(argv)
    _log_to(args.log_file)
    logger.info(f"Player for scene {args.scene!r}, pid {os.getpid()}, port {args.mlagents_port}.")
    if ignored:
        logger.info(f"Ignored arguments, as a Unity player would: {ignored}")
    communicator = BuildCommunicator(args.mlagents_port, args.connect_timeout_s)

    def launcher_gone() -> None:
        # Unity builds run in their own session: nothing else tells us our trainer is gone
        # when it dies before the link is up.
        logger.info("The process that started the player is gone; quitting.")
        _exit(0)

    if not args.survive_trainer:
        _when_gone(os.getppid(), launcher_gone)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    academy = Academy(
        make_scene(args.scene, cli.scene_options(args)), communicator, args.mlagents_port, cli.faults(args)
    )
    if sys.platform != "win32":
        signal.signal(signal.SIGUSR1, academy.request_quit)
    try:
        academy.run()
        communicator.say_goodbye()
        return 0
    except NoTrainer as e:
        logger.error(
            f"No trainer answered on port {args.mlagents_port} within --connect-timeout-s="
            f"{args.connect_timeout_s:g} s ({e}). Start mlagents-learn first (without --env it "
            "waits on port 5004), or pass the port it listens on with --mlagents-port."
        )
        return 1
    except TrainerGone as e:
        if args.survive_trainer and not e.closed:
            logger.info(f"The trainer is gone ({e}); staying (--survive-trainer) until a signal.")
            threading.Event().wait()
        logger.info(f"The trainer is gone ({e}); quitting.")
        return 0
    except Exception:
        logger.exception("The player crashed.")  # into -logFile, where Unity writes its crashes
        return 1
    finally:
        logger.info(f"Played {academy.steps} steps.")
        communicator.close()


def _when_gone(pid: int, on_death: Callable[[], None]) -> None:
    """Call ``on_death`` from a daemon thread once process ``pid`` is gone (psutil waits on a
    pidfd on Linux, kqueue on macOS, the process handle on Windows: no polling)."""

    def wait() -> None:
        try:
            psutil.Process(pid).wait()
        except psutil.NoSuchProcess:
            pass
        on_death()

    threading.Thread(target=wait, name="launcher-watch", daemon=True).start()


def _log_to(log_file: Optional[str]) -> None:
    if log_file is None:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    elif log_file == "-":  # as Unity's "-logFile -"
        handler = logging.StreamHandler(sys.stdout)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        if os.path.exists(log_file):  # as Unity keeps Player-prev.log: a crashed build's log survives its restart
            stem, suffix = os.path.splitext(log_file)
            os.replace(log_file, f"{stem}-prev{suffix}")
        handler = logging.FileHandler(log_file, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def _exit(code: int) -> None:
    """Leave at once, like Application.Quit(): gRPC's teardown can take a second, and
    mlagents-envs waits for the process in close()."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["make-build"]:
        p = argparse.ArgumentParser(prog="python -m mlagents_plugin.player make-build")
        p.add_argument("directory")
        p.add_argument("--scene", choices=sorted(SCENES), default="goal")
        p.add_argument("--name", default="", help="file name without .x86_64 (default: the scene)")
        a = p.parse_args(argv[1:])
        print(make_build(a.directory, a.scene, a.name))
        return
    if argv[:1] == ["run"]:
        argv = argv[1:]
    _exit(run(argv))


if __name__ == "__main__":
    main()
