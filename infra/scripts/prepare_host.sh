#!/usr/bin/env bash
# prepare-host (over SSH, root): wait for cloud-init, put /data on the data disk, mount the NAS.
# Idempotent: an existing filesystem is never reformatted, fstab entries are written once, mounted paths are left.
#
# Environment (defaults in brackets):
#   CLOUD_INIT_TIMEOUT_S [900]   bound for cloud-init (and so first_boot.sh) to finish
#   CLOUD_INIT_BOOT_FINISHED [/var/lib/cloud/instance/boot-finished]   written by cloud-init when it is done
#   DATA_DISK_DEVICE ['']        block device of the data disk (e.g. /dev/vdb, or a /dev/disk/by-id/ path);
#                                empty: DATA_MOUNT is a plain directory on the system disk
#   DATA_DISK_WAIT_TIMEOUT_S [300]   bound for the device to appear (attachment can lag the boot)
#   DATA_FS_TYPE [ext4]          filesystem made on a blank data disk
#   DATA_MOUNT [/data]
#   DATA_SUBDIRS [docker workspace ray/tmp ray/spill]   created under DATA_MOUNT: Docker's root, the container's
#                                /workspace (bind-mounted from DATA_MOUNT/workspace), Ray's temp and spill dirs
#   NAS_SERVER ['']              NAS mount target host (e.g. xxxx.cn-hangzhou.nas.aliyuncs.com), or any NFS
#                                server (your own hosts); empty: no NAS
#   SHARED_HOST_DIR ['']         a directory the user says is shared between the hosts (bind-mounted into the
#                                container): it must exist; nothing is mounted or created for it
#   NAS_REMOTE_PATH [/]          exported path on the NAS
#   SHARED_MOUNT [/mnt/shared]
#   NAS_MOUNT_OPTIONS [vers=3,nolock,proto=tcp,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport]
#                                (Alibaba's NFS v3 recommendation; fstab adds _netdev,nofail)
#   FSTAB_FILE [/etc/fstab]
#   lib.sh: OS_RELEASE_FILE, PACKAGE_LOCK_TIMEOUT_S, RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_LOG_DIR and the lock paths

: "${CLOUD_INIT_TIMEOUT_S:=900}"
: "${CLOUD_INIT_BOOT_FINISHED:=/var/lib/cloud/instance/boot-finished}"
: "${DATA_DISK_DEVICE:=}"
: "${DATA_DISK_WAIT_TIMEOUT_S:=300}"
: "${DATA_FS_TYPE:=ext4}"
: "${DATA_MOUNT:=/data}"
: "${DATA_SUBDIRS:=docker workspace ray/tmp ray/spill}"
: "${NAS_SERVER:=}"
: "${SHARED_HOST_DIR:=}"
: "${NAS_REMOTE_PATH:=/}"
: "${SHARED_MOUNT:=/mnt/shared}"
: "${NAS_MOUNT_OPTIONS:=vers=3,nolock,proto=tcp,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport}"
: "${FSTAB_FILE:=/etc/fstab}"

check_settings() {
  require_int CLOUD_INIT_TIMEOUT_S DATA_DISK_WAIT_TIMEOUT_S
  [[ "$DATA_MOUNT" == /* ]] || fail "DATA_MOUNT must be an absolute path, got '$DATA_MOUNT'"
  [[ "$SHARED_MOUNT" == /* ]] || fail "SHARED_MOUNT must be an absolute path, got '$SHARED_MOUNT'"
}

# cloud_init_status: the state `cloud-init status` prints (done, running, error, ...), or "finished" once cloud-init
# wrote its boot-finished file. `cloud-init status --wait` is missing from older releases; `status` is everywhere.
cloud_init_status() {
  local output='' status=0
  if [[ -e "$CLOUD_INIT_BOOT_FINISHED" ]]; then
    echo finished
    return 0
  fi
  # It exits non-zero when cloud-init ended in error or degraded: expected here, the printed state decides.
  output=$(cloud-init status 2>/dev/null) || status=$?
  sed -n 's/^status: *//p' <<<"$output" | head -n 1
  return 0
}

cloud_init_finished() {
  [[ "$(cloud_init_status)" =~ ^(finished|done|error|degraded.*|disabled)$ ]]
}

wait_for_cloud_init() {
  local state
  if ! command -v cloud-init >/dev/null 2>&1 && [[ ! -e "$CLOUD_INIT_BOOT_FINISHED" ]]; then
    banner "cloud-init is not installed: nothing to wait for; skipped"
    return 0
  fi
  if cloud_init_finished; then
    banner "cloud-init already finished ($(cloud_init_status)); skipped"
  else
    banner "waiting up to ${CLOUD_INIT_TIMEOUT_S}s for cloud-init (user data) to finish"
    wait_for "cloud-init to finish" "$CLOUD_INIT_TIMEOUT_S" 2 cloud_init_finished
  fi
  state=$(cloud_init_status)
  if [[ "$state" == error || "$state" == degraded* ]]; then
    # A failing module elsewhere must not block the node; a failed first-boot script is reported by gpu-ready.
    banner "cloud-init finished with status '$state' (see cloud-init status --long); continuing"
  else
    banner "cloud-init finished ($state)"
  fi
}

# ensure_fstab_entry MOUNTPOINT LINE: make LINE the only fstab entry for MOUNTPOINT.
ensure_fstab_entry() {
  local mountpoint=$1 line=$2 others content
  if grep -qxF -- "$line" "$FSTAB_FILE" 2>/dev/null \
    && [[ "$(awk -v m="$mountpoint" '$1 !~ /^#/ && $2 == m' "$FSTAB_FILE" | wc -l)" -eq 1 ]]; then
    banner "fstab entry for $mountpoint already present; skipped"
    return 0
  fi
  content=$line
  if [[ -s "$FSTAB_FILE" ]]; then
    # Every other line stays as it was; a stale entry for the same mount point is replaced.
    others=$(awk -v m="$mountpoint" '$1 ~ /^#/ || $2 != m' "$FSTAB_FILE")
    if [[ -n "$others" ]]; then content=$others$'\n'$line; fi
  fi
  write_file_if_changed "$FSTAB_FILE" "$content" 0644
  banner "fstab entry for $mountpoint: $line"
}

# mount_from_fstab MOUNTPOINT: mount through the fstab entry, which also proves the entry works before a reboot.
mount_from_fstab() {
  local mountpoint=$1
  if mountpoint -q "$mountpoint"; then
    banner "$mountpoint already mounted; skipped"
    return 0
  fi
  mkdir -p "$mountpoint"
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" log_cmd mount --fstab "$FSTAB_FILE" "$mountpoint" \
    || fail "mounting $mountpoint from $FSTAB_FILE failed"
  mountpoint -q "$mountpoint" || fail "$mountpoint is not a mount point after mounting it"
  banner "mounted $mountpoint"
}

# probe_signature DEVICE: print blkid's TYPE/UUID/PTTYPE lines for DEVICE (nothing when it is blank).
probe_signature() {
  local status=0 output
  output=$(blkid -p -o export "$1" 2>&1) || status=$?
  case $status in
    0) printf '%s\n' "$output" ;;
    2) ;; # blkid: no signature found, a blank disk
    *) fail "blkid -p $1 exited $status: $output" ;;
  esac
}

prepare_data_disk() {
  local signature fs_type uuid
  if [[ -z "$DATA_DISK_DEVICE" ]]; then
    mkdir -p "$DATA_MOUNT"
    banner "no data disk: $DATA_MOUNT is a directory on the system disk"
    return 0
  fi
  wait_for "data disk $DATA_DISK_DEVICE to appear" "$DATA_DISK_WAIT_TIMEOUT_S" 2 test -e "$DATA_DISK_DEVICE"
  signature=$(probe_signature "$DATA_DISK_DEVICE")
  fs_type=$(sed -n 's/^TYPE=//p' <<<"$signature")
  if [[ -z "$fs_type" ]]; then
    if grep -q '^PTTYPE=' <<<"$signature"; then
      fail "$DATA_DISK_DEVICE has a partition table but no filesystem; refusing to format it (point DATA_DISK_DEVICE at a partition, or wipe the disk)"
    fi
    banner "$DATA_DISK_DEVICE is blank: creating a filesystem ($DATA_FS_TYPE)"
    logged mkfs -t "$DATA_FS_TYPE" "$DATA_DISK_DEVICE"
    signature=$(probe_signature "$DATA_DISK_DEVICE")
    fs_type=$(sed -n 's/^TYPE=//p' <<<"$signature")
    [[ -n "$fs_type" ]] || fail "no filesystem found on $DATA_DISK_DEVICE after mkfs"
  else
    banner "$DATA_DISK_DEVICE already has a filesystem ($fs_type): kept as is, never reformatted; mkfs skipped"
  fi
  uuid=$(sed -n 's/^UUID=//p' <<<"$signature")
  [[ -n "$uuid" ]] || fail "the filesystem on $DATA_DISK_DEVICE has no UUID"
  # By UUID: device names can change between boots. nofail: a missing disk must not stop the boot (SSH stays up).
  ensure_fstab_entry "$DATA_MOUNT" "UUID=$uuid $DATA_MOUNT $fs_type defaults,nofail 0 2"
  mount_from_fstab "$DATA_MOUNT"
}

create_data_dirs() {
  local subdir created=()
  for subdir in $DATA_SUBDIRS; do
    if [[ ! -d "$DATA_MOUNT/$subdir" ]]; then
      mkdir -p "$DATA_MOUNT/$subdir"
      created+=("$subdir")
    fi
  done
  if ((${#created[@]} == 0)); then
    banner "directories under $DATA_MOUNT already exist; skipped"
  else
    banner "created ${created[*]} under $DATA_MOUNT"
  fi
}

mount_nas() {
  local nfs_client
  if [[ -z "$NAS_SERVER" ]]; then
    banner "no NAS configured; skipped"
    return 0
  fi
  detect_os
  case $PKG_FAMILY in
    rpm) nfs_client=nfs-utils ;;
    apt) nfs_client=nfs-common ;;
  esac
  install_packages "$nfs_client"
  # _netdev: mount after the network is up; nofail: an unreachable NAS must not stop the boot.
  ensure_fstab_entry "$SHARED_MOUNT" \
    "$NAS_SERVER:$NAS_REMOTE_PATH $SHARED_MOUNT nfs $NAS_MOUNT_OPTIONS,_netdev,nofail 0 0"
  mount_from_fstab "$SHARED_MOUNT"
}

check_shared_host_dir() {
  if [[ -z "$SHARED_HOST_DIR" ]]; then
    banner "no shared host directory configured; skipped"
    return 0
  fi
  [[ -d "$SHARED_HOST_DIR" ]] ||
    fail "roll-cluster:storage.sharedHostPath: $SHARED_HOST_DIR is not a directory on this host; mount your shared file system there on every host first"
  banner "shared host directory $SHARED_HOST_DIR present"
}

check_settings
run_step wait_for_cloud_init "wait for cloud-init"
run_step prepare_data_disk "data disk at $DATA_MOUNT"
run_step create_data_dirs "directories under $DATA_MOUNT"
run_step mount_nas "NAS at $SHARED_MOUNT"
run_step check_shared_host_dir "shared host directory"
