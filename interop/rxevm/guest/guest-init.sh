#!/bin/sh
# PID 1 of the interop guest, run by the host's /bin/sh (dash) after switch_root.
#
# The Go driver (package rxevm) writes this file and 'config' onto the VM's share, which is
# mounted in the guest at the same path as on the host ($SOFTRNIC_SHARE). This script:
#   1. opens the virtio-serial port "softrnic.ctl" (the control channel; the host end is a
#      unix socket of the driver), and reports progress on it ("log TEXT" lines);
#   2. brings up eth0 (the NIC with $GUEST_MAC): MTU, address, static ARP, no IPv6;
#   3. loads ib_uverbs rdma_ucm rdma_rxe, adds rxe0 on eth0, waits for PORT_ACTIVE and the
#      RoCEv2 GID of its address, and says "ready gid_index=N active_mtu=M uptime=S"
#      (or "fail REASON", then powers off);
#   4. serves the host's lines until "stop" or until the host goes away (EOF):
#        run ID        run $SHARE/jobs/ID.sh with sh in a session of its own, stdout and
#                      stderr into $SHARE/jobs/ID.out and ID.err; answers "done ID RC"
#        kill ID SIG   send SIG to job ID's process group
#        stop          power off
# Blocking reads on the port keep an idle guest idle (polling is costly under TCG).
S=$SOFTRNIC_SHARE
J=$S/jobs
R=/run/softrnic-jobs
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LANG=C.UTF-8
cd /
. "$S/config"

up() { read -r u _ </proc/uptime; echo "$u"; }
say() { [ -n "$port" ] && echo "$*" >&3; }
log() {
	echo "[softrnic-guest $(up)s] $*" >/dev/console
	say "log $*"
}
fail() {
	log "setup failed: $*"
	say "fail $*"
	dmesg | tail -30 >/dev/console
	/bin/busybox poweroff -f
}

mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620 devpts /dev/pts 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/lock "$R" "$HOME"
mount -t configfs configfs /sys/kernel/config 2>/dev/null
hostname "$VM_NAME"
ulimit -l unlimited 2>/dev/null # memory registration pins memory

# --- control channel --------------------------------------------------------------------
port=""
p=""
i=0
while [ -z "$p" ] && [ $i -lt 100 ]; do # the port appears once the host's device is ready
	for f in /sys/class/virtio-ports/*/name; do
		[ "$(cat "$f" 2>/dev/null)" = softrnic.ctl ] || continue
		f=${f%/name}
		[ -c "/dev/${f##*/}" ] && p=/dev/${f##*/}
	done
	[ -n "$p" ] || sleep 0.05
	i=$((i + 1))
done
[ -n "$p" ] || fail "no virtio-serial port softrnic.ctl"
exec 3<>"$p" || fail "cannot open $p"
port=$p
log "userspace up (kernel $(uname -r)), control port $port"

# --- network ----------------------------------------------------------------------------
dev=""
for d in /sys/class/net/*; do
	[ "$(cat "$d/address" 2>/dev/null)" = "$GUEST_MAC" ] && dev=${d##*/}
done
[ -n "$dev" ] || fail "no interface with MAC $GUEST_MAC"
[ "$dev" = eth0 ] || ip link set "$dev" name eth0 || fail "renaming $dev to eth0"
# No IPv6: a quiet wire (no RS/DAD/MLD) and a short GID table.
echo 1 >/proc/sys/net/ipv6/conf/eth0/disable_ipv6 2>/dev/null
ip -batch - <<-IPEOF || fail "configuring eth0 (mtu $MTU, $GUEST_IP/$PREFIX)"
	link set lo up
	link set eth0 mtu $MTU
	addr add $GUEST_IP/$PREFIX dev eth0
	link set eth0 up
	neigh replace $HOST_IP lladdr $HOST_MAC dev eth0 nud permanent
IPEOF
log "eth0 up: $GUEST_IP/$PREFIX mtu $MTU"

# --- RDMA -------------------------------------------------------------------------------
modprobe -a ib_uverbs rdma_ucm rdma_rxe || fail "modprobe ib_uverbs rdma_ucm rdma_rxe"
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 type rxe netdev eth0"
log "rxe0 added"

# The RoCEv2 GID of an IPv4 address is ::ffff:a.b.c.d; sysfs shows it as
# 0000:0000:0000:0000:0000:ffff:aabb:ccdd. The table has 1024 entries: read the first 100
# with one grep (one process per entry costs seconds under TCG), all of them as a last try.
IFS=.
set -- $GUEST_IP
unset IFS
want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$1" "$2" "$3" "$4")
P=/sys/class/infiniband/rxe0/ports/1
findgid() { # 'GLOB'...: prints the index of the RoCE v2 GID $want (globs expand in gids/)
	for n in $(cd "$P/gids" && grep -l -x -- "$want" $* 2>/dev/null); do
		[ "$(cat "$P/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ] && { echo "$n"; return; }
	done
}
gidx=""
i=0
while [ $i -lt 200 ]; do
	read -r st _ <"$P/state"
	if [ "$st" = "4:" ]; then # 4: ACTIVE
		gidx=$(findgid '[0-9]' '[0-9][0-9]')
		[ -n "$gidx" ] && break
	fi
	sleep 0.05
	i=$((i + 1))
done
[ -n "$gidx" ] || gidx=$(findgid '*')
[ -n "$gidx" ] || fail "rxe0 not ACTIVE with the RoCE v2 GID $want (state: $(cat "$P/state"))"
amtu=$(ibv_devinfo -d rxe0 | sed -n 's/^[[:space:]]*active_mtu:[[:space:]]*\([0-9]*\).*/\1/p')
export SOFTRNIC_GID_INDEX=$gidx GUEST_IP HOST_IP
say "ready gid_index=$gidx active_mtu=$amtu uptime=$(up)"
log "ready: rxe0 ACTIVE, GID index $gidx, active_mtu $amtu"

# --- jobs -------------------------------------------------------------------------------
# A job runs as 'sh ID.sh' in a session (and process group) of its own, so that 'kill'
# reaches everything it started. The group id is written to $R/ID.pgid first; a kill that
# comes before that leaves the signal in $R/ID.pgid.kill, which the job reads next. The
# shell starts background commands with SIGINT and SIGQUIT ignored (no job control), and
# a shell cannot undo that: env(1) restores them, so a job stops on SIGINT as from a
# terminal.
runjob() { # ID
	cd "$HOME"
	setsid -w env --default-signal=INT,QUIT sh -c 'echo $$ >"$0"; read -r s 2>/dev/null <"$0.kill" && kill -s "$s" $$; exec sh "$1"' \
		"$R/$1.pgid" "$J/$1.sh" </dev/null >"$J/$1.out" 2>"$J/$1.err" 3>&-
	echo "done $1 $?" >&3
}
killjob() { # ID SIGNAL
	echo "$2" >"$R/$1.pgid.kill"
	read -r p 2>/dev/null <"$R/$1.pgid" && kill -s "$2" -- "-$p" 2>/dev/null
}
while read -r verb id arg <&3; do
	case "$verb" in
	run) runjob "$id" & ;;
	kill) killjob "$id" "${arg:-TERM}" ;;
	stop) break ;;
	esac
done
log "powering off"
say "bye"
/bin/busybox poweroff -f
