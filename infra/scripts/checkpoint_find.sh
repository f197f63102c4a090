#!/usr/bin/env bash
# The newest complete checkpoint of a job, by the framework's own layout. Defines functions only: the job step
# (job_submit.sh) ships latest_checkpoint into the head's container (`declare -f`) and runs it there, where the
# checkpoint directory is. Upstream layouts at the pinned refs (ROLL 8eb27cc, verl v0.7.0, OpenRLHF v0.10.2 with
# DeepSpeed v0.18.9); ../shared/reference/frameworks-at-runtime.md.

# latest_checkpoint LAYOUT DIR [WORLD]: prints the newest complete checkpoint under DIR, or nothing (also when DIR
# does not exist). WORLD: OpenRLHF's actor GPU count, one ZeRO optimizer shard each (0: not checked, ZeRO 0).
latest_checkpoint() {
  local layout=$1 dir=${2%/} world=${3:-0} best='' best_key='' c n key tag
  local -a shards
  [[ -d $dir ]] || return 0
  case $layout in
    roll)
      # <dir>/<YYYYmmdd-HHMMSS>/checkpoint-<N>/: ROLL adds the launch's timestamp to checkpoint_config.output_dir
      # (roll/configs/base_config.py:303-307) and uploads each role's checkpoint-N there
      # (roll/utils/upload_utils.py:28-33); with async_upload false the driver uploads
      # pipeline/worker_state_pipeline.json after every worker's upload returned (roll/pipeline/base_pipeline.py:
      # 113-131), so that file marks a complete checkpoint. Newest launch first, then the highest step.
      for c in "$dir"/*/checkpoint-*; do
        [[ ${c%/checkpoint-*} =~ /[0-9]{8}-[0-9]{6}$ && ${c##*/checkpoint-} =~ ^[0-9]+$ ]] || continue
        [[ -s $c/pipeline/worker_state_pipeline.json ]] || continue
        key=${c%/checkpoint-*}
        key="${key##*/} $(printf '%012d' "$((10#${c##*/checkpoint-}))")"
        if [[ $key > $best_key ]]; then best_key=$key best=$c; fi
      done
      ;;
    verl)
      # <dir>/global_step_<N>/: data.pt is written after actor/ (and critic/) were saved
      # (verl/trainer/ppo/ray_trainer.py:938-989); max_actor_ckpt_to_keep empties older steps' actor/.
      for c in "$dir"/global_step_*; do
        n=${c##*/global_step_}
        [[ $n =~ ^[0-9]+$ && -s $c/data.pt ]] || continue
        compgen -G "$c/actor/*" >/dev/null || continue
        key=$(printf '%012d' "$((10#$n))")
        if [[ $key > $best_key ]]; then best_key=$key best=$c; fi
      done
      ;;
    openrlhf)
      # <dir>/_actor/latest names the tag DeepSpeed loads when OpenRLHF passes none (trainer/ray/ppo_actor.py:
      # 546-550, deepspeed/runtime/engine.py:3430-3435); rank 0 writes it after its own shards only
      # (engine.py:3831-3838), hence the shard count. The critic must name the same tag.
      [[ -s $dir/_actor/latest ]] || return 0
      tag=$(<"$dir/_actor/latest")
      [[ $tag =~ ^(best_)?global_step[0-9]+$ && -d $dir/_actor/$tag ]] || return 0
      if ((world > 0)); then
        shards=("$dir/_actor/$tag"/*optim_states.pt)
        [[ -e ${shards[0]} ]] || return 0
        ((${#shards[@]} == world)) || return 0
      fi
      if [[ -d $dir/_critic ]]; then
        [[ -s $dir/_critic/latest && $(<"$dir/_critic/latest") == "$tag" ]] || return 0
      fi
      best=$dir/_actor/$tag
      ;;
    *) return 2 ;;
  esac
  [[ -z $best ]] || printf '%s\n' "$best"
}
