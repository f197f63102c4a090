#!/usr/bin/env bash
# prepare-host (over SSH, root): wait for cloud-init, put /data on the data disk, size /dev/shm, mount the NAS.
# Idempotent: an existing filesystem is never reformatted, fstab entries are written once, mounted paths are left.
#
# Environment (defaults in brackets):
#   CLOUD_INIT_TIMEOUT_S [900]   bound for cloud-init (and so first_boot.sh) to finish
#   CLOUD_INIT_BOOT_FINISHED [/var/lib/cloud/instance/boot-finished]   written by cloud-init when it is done
#   DATA_DISK_SERIAL ['']        the data disk's serial: an ECS disk id without `d-`. The guest shows it as
#                                DISK_BY_ID_DIR/virtio-<serial> (virtio families) or
#                                DISK_BY_ID_DIR/nvme-Alibaba_Cloud_Elastic_Block_Storage_<serial> (NVMe families such
#                                as gn8v), else in SYS_BLOCK_DIR/<dev>/serial or <dev>/device/serial (Alibaba's CSI
#                                driver, pkg/disk/device_manager.go; verified-facts#prepare-host-alibaba-cloud-verified)
#   DATA_DISK_DEVICE ['']        an explicit block device instead (hosts whose layout is known); with neither set,
#                                DATA_MOUNT is a plain directory on the system disk
#   DISK_BY_ID_DIR [/dev/disk/by-id], SYS_BLOCK_DIR [/sys/block], DEV_DIR [/dev]   where disks are looked up
#   DATA_DISK_WAIT_TIMEOUT_S [300]   bound for the disk to appear (attachment can lag the boot)
#   DATA_FS_TYPE [ext4]          filesystem made on a blank data disk
#   DATA_MOUNT [/data]
#   DATA_SUBDIRS [docker workspace ray/tmp ray/spill]   created under DATA_MOUNT: Docker's root, the container's
#                                /workspace (bind-mounted from DATA_MOUNT/workspace), Ray's temp and spill dirs
#   SHM_SIZE ['']                size of SHM_MOUNT, e.g. 16g or 512m (container.shmSize: the container shares the
#                                host's IPC namespace, where Docker ignores a container shm size); empty: as it is
#   SHM_MOUNT [/dev/shm]
#   OBJECT_STORE_MEMORY_GB ['']  ray.objectStoreMemoryGb: must fit in SHM_MOUNT (Ray keeps its object store there)
#   MEMINFO_FILE [/proc/meminfo] the node's memory, which SHM_SIZE must not exceed
#   SHM_NEVER_SHRINK [0]         1 (your own hosts): a SHM_MOUNT larger than SHM_SIZE is kept, with a warning (other
#                                programs on the host may rely on it)
#   NAS_SERVER ['']              NAS mount target host (e.g. xxxx.cn-hangzhou.nas.aliyuncs.com), or any NFS
#                                server (your own hosts); empty: no NAS
#   SHARED_HOST_DIR ['']         a directory the user says is shared between the hosts (bind-mounted into the
#                                container): it must exist; nothing is mounted or created for it
#   NAS_REMOTE_PATH [/]          exported path on the NAS
#   SHARED_MOUNT [/mnt/shared]
#   NAS_MOUNT_OPTIONS [vers=3,nolock,proto=tcp,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport]
#                                (Alibaba's NFS v3 recommendation; fstab adds _netdev,nofail)
#   FSTAB_FILE [/etc/fstab]
#   lib.sh: OS_RELEASE_FILE, PACKAGE_LOCK_TIMEOUT_S, RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_CLUSTER_LOG_DIR and the lock paths

: "${CLOUD_INIT_TIMEOUT_S:=900}"
: "${CLOUD_INIT_BOOT_FINISHED:=/var/lib/cloud/instance/boot-finished}"
: "${DATA_DISK_DEVICE:=}"
: "${DATA_DISK_SERIAL:=}"
: "${DISK_BY_ID_DIR:=/dev/disk/by-id}"
: "${SYS_BLOCK_DIR:=/sys/block}"
: "${DEV_DIR:=/dev}"
: "${SHM_SIZE:=}"
: "${SHM_MOUNT:=/dev/shm}"
: "${OBJECT_STORE_MEMORY_GB:=}"
: "${MEMINFO_FILE:=/proc/meminfo}"
: "${SHM_NEVER_SHRINK:=0}"
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
  [[ -z "$SHM_SIZE" || "$SHM_SIZE" =~ ^[1-9][0-9]*[mg]$ ]] || fail "SHM_SIZE must be like 16g or 512m, got '$SHM_SIZE'"
  [[ -z "$OBJECT_STORE_MEMORY_GB" || "$OBJECT_STORE_MEMORY_GB" =~ ^[0-9]+([.][0-9]+)?$ ]] \
    || fail "OBJECT_STORE_MEMORY_GB must be a number of GB, got '$OBJECT_STORE_MEMORY_GB'"
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

# disk_with_serial: print the device whose serial is DATA_DISK_SERIAL (nothing, status 1, while there is none).
disk_with_serial() {
  local path dev serial
  for path in "$DISK_BY_ID_DIR/virtio-$DATA_DISK_SERIAL" \
    "$DISK_BY_ID_DIR/nvme-Alibaba_Cloud_Elastic_Block_Storage_$DATA_DISK_SERIAL"; do
    if [[ -e "$path" ]]; then
      printf '%s\n' "$path"
      return 0
    fi
  done
  # No udev link (yet, or a udev rule that names it otherwise): the kernel's own serial attribute.
  for dev in "$SYS_BLOCK_DIR"/*; do
    for serial in "$dev/serial" "$dev/device/serial"; do
      if [[ -r "$serial" && "$(tr -d ' \n' <"$serial")" == "$DATA_DISK_SERIAL" ]]; then
        printf '%s\n' "$DEV_DIR/${dev##*/}"
        return 0
      fi
    done
  done
  return 1
}

# find_data_disk: set DATA_DISK_DEVICE from DATA_DISK_SERIAL (by identity, never by a name like /dev/vdb, which NVMe
# families do not have), waiting for the attachment within DATA_DISK_WAIT_TIMEOUT_S.
find_data_disk() {
  if [[ -n "$DATA_DISK_DEVICE" || -z "$DATA_DISK_SERIAL" ]]; then return 0; fi
  if ! POLL_WHAT="data disk with serial $DATA_DISK_SERIAL" poll_until "$DATA_DISK_WAIT_TIMEOUT_S" 2 disk_with_serial; then
    fail "no disk with serial $DATA_DISK_SERIAL (the ECS data disk d-$DATA_DISK_SERIAL) appeared under $DISK_BY_ID_DIR or $SYS_BLOCK_DIR within ${DATA_DISK_WAIT_TIMEOUT_S}s"
  fi
  DATA_DISK_DEVICE=$(disk_with_serial)
  banner "data disk d-$DATA_DISK_SERIAL is $DATA_DISK_DEVICE"
}

prepare_data_disk() {
  local signature fs_type uuid kept=false
  find_data_disk
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
    kept=true
  fi
  uuid=$(sed -n 's/^UUID=//p' <<<"$signature")
  [[ -n "$uuid" ]] || fail "the filesystem on $DATA_DISK_DEVICE has no UUID"
  # By UUID: device names can change between boots. nofail: a missing disk must not stop the boot (SSH stays up).
  ensure_fstab_entry "$DATA_MOUNT" "UUID=$uuid $DATA_MOUNT $fs_type defaults,nofail 0 2"
  mount_from_fstab "$DATA_MOUNT"
  if [[ "$kept" == true ]]; then grow_data_filesystem "$fs_type"; fi
}

# grow_data_filesystem TYPE: a kept filesystem (a disk made from a baked image's snapshot, sized to nodes.dataDiskGb)
# may be smaller than its disk: grow it online to the whole disk. Both tools are no-ops on a filesystem that already
# fills its disk, so a second run changes nothing.
grow_data_filesystem() {
  case $1 in
    ext2 | ext3 | ext4) logged resize2fs -- "$DATA_DISK_DEVICE" ;;
    xfs) logged xfs_growfs -- "$DATA_MOUNT" ;;
    *) banner "$DATA_MOUNT is $1, which this script does not grow; it keeps its size" ;;
  esac
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

# size_kib SIZE: 16g / 512m in KiB.
size_kib() {
  local number=${1%[mg]}
  case $1 in
    *g) echo $((number * 1024 * 1024)) ;;
    *m) echo $((number * 1024)) ;;
  esac
}

shm_kib() {
  df -Pk "$SHM_MOUNT" | awk 'NR == 2 { print $2 }'
}

# The container runs with the host's IPC namespace (NCCL, Ray), where Docker ignores --shm-size: the host's
# /dev/shm is what the container gets, so it is sized here; the fstab entry keeps the size across reboots
# (systemd-remount-fs applies fstab options to /dev/shm).
size_shm() {
  local wanted memory current
  if [[ -z "$SHM_SIZE" ]]; then
    banner "no shm size given: $SHM_MOUNT stays as the OS sized it; skipped"
  else
    wanted=$(size_kib "$SHM_SIZE")
    memory=$(awk '$1 == "MemTotal:" { print $2 }' "$MEMINFO_FILE")
    if [[ -n "$memory" ]] && ((wanted > memory)); then
      fail "container.shmSize $SHM_SIZE is more than this node's memory ($((memory / 1024)) MiB); lower it"
    fi
    current=$(shm_kib)
    if [[ "$SHM_NEVER_SHRINK" == 1 ]] && ((current > wanted)); then
      banner "WARNING: $SHM_MOUNT is $((current / 1024)) MiB, more than container.shmSize $SHM_SIZE; kept as it is (a host of yours is never shrunk)"
    elif [[ "$current" == "$wanted" ]]; then
      ensure_fstab_entry "$SHM_MOUNT" "tmpfs $SHM_MOUNT tmpfs defaults,size=$SHM_SIZE 0 0"
      banner "$SHM_MOUNT is already $SHM_SIZE; skipped"
    else
      ensure_fstab_entry "$SHM_MOUNT" "tmpfs $SHM_MOUNT tmpfs defaults,size=$SHM_SIZE 0 0"
      logged mount -o "remount,size=$SHM_SIZE" "$SHM_MOUNT"
      current=$(shm_kib)
      [[ "$current" == "$wanted" ]] \
        || fail "$SHM_MOUNT is ${current} KiB after remounting it with size=$SHM_SIZE (container.shmSize)"
      banner "$SHM_MOUNT resized to $SHM_SIZE"
    fi
  fi
  if [[ -n "$OBJECT_STORE_MEMORY_GB" ]]; then
    current=$(shm_kib)
    if awk -v gb="$OBJECT_STORE_MEMORY_GB" -v kib="$current" 'BEGIN { exit !(gb * 1024 * 1024 > kib) }'; then
      fail "ray.objectStoreMemoryGb ($OBJECT_STORE_MEMORY_GB GB) does not fit in $SHM_MOUNT ($((current / 1024)) MiB), where Ray keeps its object store; lower it or raise container.shmSize"
    fi
    banner "Ray's object store ($OBJECT_STORE_MEMORY_GB GB) fits in $SHM_MOUNT ($((current / 1024)) MiB)"
  fi
}

mount_nas() {
  local nfs_client wanted mounted
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
  # A changed NAS (another mount target or file system) is mounted in place of the old one: otherwise the old one
  # stays mounted and checkpoints silently go to the old file system. A busy old mount fails the step, naming it.
  wanted="$NAS_SERVER:$NAS_REMOTE_PATH"
  mounted=$(findmnt -n -o SOURCE --mountpoint "$SHARED_MOUNT") || mounted=''
  if [[ -n "$mounted" && "$mounted" != "$wanted" ]]; then
    banner "$SHARED_MOUNT holds $mounted, not $wanted: unmounting it to mount the configured NAS"
    log_cmd umount "$SHARED_MOUNT" \
      || fail "cannot unmount the old NAS $mounted from $SHARED_MOUNT (in use?); stop what uses it and run again"
  fi
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
run_step size_shm "size of $SHM_MOUNT"
run_step mount_nas "NAS at $SHARED_MOUNT"
run_step check_shared_host_dir "shared host directory"
