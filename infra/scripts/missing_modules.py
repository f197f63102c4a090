"""The Python modules of MindSpeed-RL's runtime that the container's python lacks, space-separated (mindspeed_rl_code.sh
container_missing_runtime). Found, not imported: importing torch_npu needs CANN's environment, which a bare docker
exec may lack.

Runs in the training container with its python (`run_in_container -i`: the program arrives on stdin): MODULE...
"""

from __future__ import annotations

import importlib.util
import sys

print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
