"""The parts of ``compare_faults.py``, which runs fault scenarios against ML-Agents'
SubprocessEnvManager ("upstream") and SupervisedEnvManager ("ours"), each run in a process of its own.

- ``scenarios``: what each scenario does, and the list of them;
- ``trainer``: the trainer side of a run: builds either manager, steps it, closes it, notes facts;
- ``child``: the process of one run (``compare_faults.py --child``): one scenario, one manager;
- ``record``: the JSON file through which a run tells the parent what it found;
- ``processes``: finding the processes a run started, players included;
- ``observer``: starts a run, bounds it, decides its verdict, kills what it left running;
- ``report``: every run, as a Markdown table.
"""
MANAGERS = ("upstream", "ours")
N_ENV = 2
EXIT_GRACE_S = 30.0  # how long the interpreter may take to exit once the scenario returned
