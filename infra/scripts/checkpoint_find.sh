#!/usr/bin/env bash
# The newest complete checkpoint of a job, by the framework's own layout. Defines functions only: the job step
# (job_submit.sh) ships latest_checkpoint into the head's container (`declare -f`) and runs it there, where the
# checkpoint directory is. Upstream layouts at the pinned refs (ROLL 8eb27cc, verl v0.7.0, OpenRLHF v0.10.2 with
# DeepSpeed v0.18.9, MindSpeed-RL 62e9928 with Megatron-LM core_r0.8.0); verified-facts#checkpoint-layouts.

# latest_checkpoint LAYOUT DIR [WORLD] [STAGING]: prints the newest complete checkpoint under DIR, or nothing (also
# when DIR does not exist). WORLD: OpenRLHF's actor GPU count, one ZeRO optimizer shard each (0: not checked, ZeRO
# 0). STAGING: ROLL's local save folder (its output_dir), where a copy that failed is left behind ("": not checked).
latest_checkpoint() {
  local layout=$1 dir=${2%/} world=${3:-0} staging=${4:-} best='' best_key='' c n key tag tracker
  local -a shards left
  [[ -d $dir ]] || return 0
  case $layout in
    roll)
      # <dir>/<YYYYmmdd-HHMMSS>/checkpoint-<N>/: ROLL adds the launch's timestamp to checkpoint_config.output_dir
      # (roll/configs/base_config.py) and uploads each role's checkpoint-N there
      # (roll/utils/upload_utils.py); with async_upload false the driver uploads
      # pipeline/worker_state_pipeline.json after every worker's upload returned (roll/pipeline/base_pipeline.py).
      # That marker alone is not proof: CheckpointManager.upload swallows a failed copy
      # (roll/utils/checkpoint_manager.py) and deletes the local copy only after copytree succeeded. So a
      # checkpoint counts as complete only when its marker is there AND no local copy of that step is left under
      # STAGING/<worker or pipeline>/checkpoint-N (on the shared storage, or the one node's data dir, so the head
      # sees every worker's). Newest launch first, then the highest step.
      # see verified-facts#checkpoint-find-base-config
      for c in "$dir"/*/checkpoint-*; do
        [[ ${c%/checkpoint-*} =~ /[0-9]{8}-[0-9]{6}$ && ${c##*/checkpoint-} =~ ^[0-9]+$ ]] || continue
        [[ -s $c/pipeline/worker_state_pipeline.json ]] || continue
        if [[ -n $staging ]]; then
          left=("${staging%/}"/*/"${c##*/}")
          [[ ! -e ${left[0]} ]] || continue
        fi
        key=${c%/checkpoint-*}
        key="${key##*/} $(printf '%012d' "$((10#${c##*/checkpoint-}))")"
        if [[ $key > $best_key ]]; then best_key=$key best=$c; fi
      done
      ;;
    verl)
      # <dir>/global_step_<N>/: data.pt is written after actor/ (and critic/) were saved
      # (verl/trainer/ppo/ray_trainer.py); max_actor_ckpt_to_keep empties older steps' actor/.
      # see verified-facts#checkpoint-find-ray-trainer
      for c in "$dir"/global_step_*; do
        n=${c##*/global_step_}
        [[ $n =~ ^[0-9]+$ && -s $c/data.pt ]] || continue
        compgen -G "$c/actor/*" >/dev/null || continue
        key=$(printf '%012d' "$((10#$n))")
        if [[ $key > $best_key ]]; then best_key=$key best=$c; fi
      done
      ;;
    openrlhf)
      # <dir>/_actor/global_step<N>/: one DeepSpeed tag per save (openrlhf/trainer/ppo_trainer.py); rank 0
      # writes _actor/latest after its own shards only (deepspeed/runtime/engine.py), so `latest` can
      # name a tag other ranks are still writing. Every tag is judged by its files: mp_rank_00_model_states.pt
      # and, with ZeRO, WORLD optimizer shards; with a critic, _critic/<same tag> saved too. The highest step
      # wins; the entrypoint then points both `latest` files at it (DeepSpeed loads the tag `latest` names:
      # deepspeed/runtime/engine.py, OpenRLHF passes none: trainer/ray/ppo_actor.py).
      # see verified-facts#checkpoint-find-ppo-trainer
      for c in "$dir"/_actor/global_step*; do
        tag=${c##*/}
        [[ $tag =~ ^global_step[0-9]+$ ]] || continue
        compgen -G "$c/*model_states.pt" >/dev/null || continue
        if ((world > 0)); then
          shards=("$c"/*optim_states.pt)
          [[ -e ${shards[0]} ]] || continue
          ((${#shards[@]} == world)) || continue
        fi
        if [[ -d $dir/_critic ]]; then
          compgen -G "$dir/_critic/$tag/*model_states.pt" >/dev/null || continue
        fi
        key=$(printf '%012d' "$((10#${tag#global_step}))")
        if [[ $key > $best_key ]]; then best_key=$key best=$c; fi
      done
      ;;
    megatron)
      # MindSpeed-RL's actor saves Megatron checkpoints: <dir>/iter_<7 digits>/mp_rank_*/ per model-parallel
      # rank, and rank 0 writes <dir>/latest_checkpointed_iteration.txt once every rank saved (Megatron-LM
      # core_r0.8.0 megatron/training/checkpointing.py save_checkpoint: barrier, then the tracker). A folder newer
      # than the tracker's iteration is a save that did not finish; the highest one up to it wins.
      [[ -s $dir/latest_checkpointed_iteration.txt ]] || return 0
      tracker=$(<"$dir/latest_checkpointed_iteration.txt")
      [[ $tracker =~ ^[0-9]+$ ]] || return 0
      for c in "$dir"/iter_*; do
        n=${c##*/iter_}
        [[ $n =~ ^[0-9]{7}$ ]] || continue
        ((10#$n <= 10#$tracker)) || continue
        compgen -G "$c/mp_rank_*" >/dev/null || continue
        key=$(printf '%012d' "$((10#$n))")
        if [[ $key > $best_key ]]; then best_key=$key best=$c; fi
      done
      ;;
    *) return 2 ;;
  esac
  [[ -z $best ]] || printf '%s\n' "$best"
}
