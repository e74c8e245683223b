"""The process of one run (``compare_faults.py --child SCENARIO MANAGER --run-dir DIR``): one
scenario against one manager, then the interpreter's exit, which the parent times."""
import faulthandler
import sys
import time
import traceback

from faults import EXIT_GRACE_S
from faults.record import describe_exception
from faults.scenarios import BY_KEY
from faults.trainer import Run


def child_main(key: str, manager_name: str, run_dir: str) -> None:
    run = Run(manager_name, run_dir)
    try:
        BY_KEY[key].body(run)
    except Exception as e:  # the scenario itself failed (e.g. the manager raised in reset)
        run.fact(f"scenario aborted in phase '{run.record.data['phase']}': {describe_exception(e)}")
        traceback.print_exc()
    run.record.data["returned_at"] = time.time()
    run.record.phase("interpreter exit")
    sys.stdout.flush()
    # If the interpreter is still exiting shortly before the parent gives up, dump every thread's
    # stack to the console, so the parent can say where it hangs.
    faulthandler.dump_traceback_later(EXIT_GRACE_S - 5, exit=False)
    # Returning lets the interpreter exit normally: atexit handlers, multiprocessing's join of
    # non-daemonic workers and all. The parent times that.
