#!/usr/bin/env bash
# Step prune-images (every node, after its container is created or recreated): remove the older images of the
# container's repository. The pull step pulls each new image and pulumi-docker keeps the old one (keep_locally), so
# every image change left its predecessor on the data disk. Only images of the same repository are touched, and
# Docker refuses to remove one a container still uses: this step then keeps it and says so. Other images on the
# node (your own hosts' included) are left alone.
#
# Environment:
#   IMAGE                    the image the container runs (registry/repository:tag, or @digest)               required

require_env IMAGE

image_repository() {
  local name=${IMAGE%@*} last
  last=${name##*/}
  if [[ "$last" == *:* ]]; then name=${name%:*}; fi
  printf '%s\n' "$name"
}

prune_old_images() {
  local repository reference removed=0 kept=0
  repository=$(image_repository)
  while read -r reference; do
    if [[ -z "$reference" || "$reference" == "$IMAGE" || "$reference" == *":<none>" ]]; then continue; fi
    if docker image rm -- "$reference" >>"$ROLL_CLUSTER_STEP_LOG" 2>&1; then
      removed=$((removed + 1))
      banner "removed the older image $reference"
    else
      kept=$((kept + 1))
      banner "kept $reference: Docker refused to remove it (a container uses it)"
    fi
  done < <(docker image ls --format '{{.Repository}}:{{.Tag}}' -- "$repository")
  banner "removed $removed older image(s) of $repository, kept $kept"
}

run_step prune_old_images "remove the older images of $(image_repository)"
