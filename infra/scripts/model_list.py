"""MODELS_JSON, the models of the job as the program hands them to the model and weights-prefetch steps (a JSON
list of [hub, id, endpoint]), as lines of `hub<TAB>id<TAB>endpoint` for the steps' shell (model_fetch.sh and
weights_prefetch.sh read_models). Runs with the host's python3: MODELS_JSON.
"""

from __future__ import annotations

import json
import sys

for hub, repo_id, endpoint in json.loads(sys.argv[1]):
    print(hub, repo_id, endpoint, sep="\t")
