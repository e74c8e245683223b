"""The player's command line: what a Unity build accepts, plus scene and fault options.

mlagents-envs starts a build as ``NAME.x86_64 [-nographics -batchmode] --mlagents-port N
[-logFile PATH] [--env-args ...]``. Unity's own flags are single-dash and case-insensitive, and a
Unity player ignores flags it does not know; so does this one (it logs them).
"""
import argparse
from typing import List, Tuple

from mlagents_plugin.player.academy import Faults
from mlagents_plugin.player.scenes import SCENES, SceneOptions

EDITOR_PORT = 5004  # where mlagents-learn without --env waits for the Unity Editor
UNITY_FLAGS = {"-logfile": "-logFile", "-batchmode": "-batchmode", "-nographics": "-nographics"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlagents-plugin-player",
        description="A headless stand-in for a Unity build that speaks ML-Agents' protocol.",
        allow_abbrev=False,
    )
    p.add_argument("--scene", choices=sorted(SCENES), default="goal")
    unity = p.add_argument_group("flags a Unity build receives")
    unity.add_argument("--mlagents-port", type=int, default=EDITOR_PORT)
    unity.add_argument("-logFile", dest="log_file", help="log here ('-' for stdout; default stderr)")
    unity.add_argument("-batchmode", action="store_true", help="accepted; the player is always headless")
    unity.add_argument("-nographics", action="store_true", help="accepted; the player never renders to a screen")
    unity.add_argument(
        "--connect-timeout-s", type=float, default=60.0,
        help="give up if no trainer answers the first call within this time",
    )
    scene = p.add_argument_group("scene (pass them with mlagents-learn --env-args)")
    defaults = SceneOptions()
    scene.add_argument("--num-agents", type=int, default=defaults.num_agents, help="per training area")
    scene.add_argument("--max-step", type=int, default=defaults.max_step, help="0: no limit")
    scene.add_argument("--track-length", type=int, default=defaults.track_length)
    scene.add_argument("--goal-distance", type=float, default=defaults.goal_distance,
                       help="default of the goal_distance environment parameter")
    scene.add_argument("--step-penalty", type=float, default=defaults.step_penalty,
                       help="default of the step_penalty environment parameter")
    scene.add_argument("--image-size", type=int, default=defaults.image_size)
    scene.add_argument("--behavior-name", default="", help="rename the scene's behaviour (to match your YAML)")
    scene.add_argument("--frame-time-s", type=float, default=defaults.frame_time_s,
                       help="sleep this long per step, as a build whose frame takes that long")
    faults = p.add_argument_group("faults (for testing what happens when a build misbehaves)")
    faults.add_argument("--crash-after-steps", type=int, help="crash at this step")
    faults.add_argument("--crash-exit-code", type=int, default=3)
    faults.add_argument("--crash-signal", choices=["SIGSEGV", "SIGKILL", "SIGABRT"],
                        help="crash by this signal instead of exiting")
    faults.add_argument("--hang-after-steps", type=int, help="stop answering at this step")
    faults.add_argument("--slow-start-s", type=float, default=0.0, help="wait this long before connecting")
    faults.add_argument("--die-during-handshake", action="store_true",
                        help="exit between the two handshake calls (mlagents-envs then waits forever)")
    faults.add_argument(
        "--survive-trainer", action="store_true",
        help="keep running when the trainer is gone without closing the link (no launcher watch; a "
        "failed call is no reason to quit), as a build stuck in a long load or a native loop does",
    )
    faults.add_argument("--fault-port", type=int, help="misbehave only in the player on this port")
    faults.add_argument("--fault-once", metavar="FILE",
                        help="misbehave only if FILE does not exist yet, and create it: a restarted build behaves")
    return p


def parse(argv: List[str]) -> Tuple[argparse.Namespace, List[str]]:
    """Parse like a Unity player: Unity's flags in any case, unknown flags kept aside."""
    normalized = [UNITY_FLAGS.get(arg.lower(), arg) for arg in argv]
    return parser().parse_known_args(normalized)


def scene_options(args: argparse.Namespace) -> SceneOptions:
    return SceneOptions(
        num_agents=args.num_agents,
        max_step=args.max_step,
        track_length=args.track_length,
        goal_distance=args.goal_distance,
        step_penalty=args.step_penalty,
        image_size=args.image_size,
        behavior_name=args.behavior_name,
        frame_time_s=args.frame_time_s,
    )


def faults(args: argparse.Namespace) -> Faults:
    return Faults(
        crash_after_steps=args.crash_after_steps,
        crash_exit_code=args.crash_exit_code,
        crash_signal=args.crash_signal,
        hang_after_steps=args.hang_after_steps,
        slow_start_s=args.slow_start_s,
        die_during_handshake=args.die_during_handshake,
        only_port=args.fault_port,
        once_file=args.fault_once,
    )
