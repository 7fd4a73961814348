"""atensor's benchmarks, as one suite: `python -m bench` runs the registered benchmarks (bench/registry.py), each
a script of this folder that measures atensor against its peers in the same run, prints its tables and
writes bench/results/<name>.json with the machine it ran on (bench/machine.py, through common.write_results).

Why one suite: a reader must be able to tell which benchmarks matter and rerun them all on their machine
(`python -m bench --quick`, about 5 minutes on 2 cores), or one change against a git revision
(`--baseline REV`); docs/benchmarks.md is generated from the results (`--report`). The scripts stay
runnable alone (`python bench/llm.py`): the suite only runs them, with the options its registry names.
"""
