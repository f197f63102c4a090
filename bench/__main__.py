"""`python -m bench`: the program benchmark; `python -m bench ray` runs the real-host Ray benchmark;
`python -m bench steps` measures the steps of the baked-image path (bench/steps_bench.py)."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "ray":
    sys.argv.pop(1)
    from bench import ray_ready_bench

    ray_ready_bench.main()
elif len(sys.argv) > 1 and sys.argv[1] == "steps":
    sys.argv.pop(1)
    from bench import steps_bench

    steps_bench.main()
else:
    from bench import program_bench

    program_bench.main()
