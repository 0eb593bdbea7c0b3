#!/bin/sh
# openimex Slurm prolog and epilog: one script that acts by the name it runs under. A name with
# `epilog` in it (dist/slurm/epilog.sh is a link to this file; install a copy as
# /etc/slurm/openimex-epilog.sh) runs the epilog, any other name the prolog.
#
# Two modes, chosen by OPENIMEX_SLURM_MODE (job or domain); unset, it is job when
# OPENIMEX_JOBS_DIR is set and domain otherwise, so an install that sets neither keeps working
# as it did:
# - job (openimex only, issue 31): the daemon runs for good with the whole NVLink domain in its
#   nodes file; each Slurm job is an openimex job (its own channel and members) that the prolog
#   defines by writing a job file and the epilog ends by deleting it. No restart, no nodes-file
#   change, no sleep, and jobs may share nodes. See "Job mode" below.
# - domain: one IMEX domain per job: the prolog rewrites the nodes file and signals or restarts
#   the daemon, the epilog resets it. Exclusive nodes only. See "Domain mode" below.
#
# Slurm runs a prolog with no PATH (prolog_epilog.html); the script then uses
# /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin.
#
# Job mode.
#
#   Prolog=/etc/slurm/openimex-prolog.sh    Epilog=/etc/slurm/openimex-epilog.sh
#   PrologFlags=Alloc    (the prolog runs on every node of the job when it is allocated, so
#                         every member defines the job, not only the nodes a step runs on)
# slurmd gives the scripts only the job's SLURM_* variables: set the OPENIMEX_* ones below in a
# wrapper that exports them and execs this script, or edit their defaults here.
#
# Prolog: writes $OPENIMEX_JOBS_DIR/slurm-$SLURM_JOB_ID.job (the directory of the daemon's
# OPENIMEX_JOBS_DIR key) whole: a temporary dot file in that directory, then a rename (the
# daemon reads the directory on inotify and ignores dot files). Then `ctl jobs wait
# slurm-$SLURM_JOB_ID` returns the moment the local daemon holds the job READY (a session with
# every other member, and each holds the same definition): the daemon answers, nothing polls.
# A call that fails before that (a daemon restarting) is made again after OPENIMEX_POLL_INTERVAL
# seconds, the only sleep. After OPENIMEX_WAIT_TIMEOUT seconds it exits 1 naming the job's state and the
# members it waits on, lost or disagrees with (or saying that the daemon holds no such job: it
# refused the file, and its log says why), so Slurm drains the node instead of starting a job
# without its IMEX job. The file:
#   CHANNEL  OPENIMEX_JOB_CHANNEL if set; else 1 + SLURM_JOB_ID mod (OPENIMEX_CHANNEL_COUNT - 1):
#            every node of the job computes the same from what Slurm gives them all, consecutive
#            job IDs get different channels (a collision needs two jobs sharing a node whose IDs
#            differ by a multiple of count - 1: the daemon refuses the second, the prolog fails
#            naming it), and never channel 0: the driver makes channel 0 for every process that
#            runs outside a job (NVreg_CreateImexChannel0) and Slurm's own channel allocator
#            reserves it too. A channel a job held stays quarantined on a node after the job
#            (`ctl jobs` lists it), so the daemon refuses a later job with it there until it is
#            cleared or the node reboots.
#            Slurm's switch/nvidia_imex (Slurm 24.05 and later; Debian 12 ships 22.05) does not
#            tell a prolog its channel: slurmctld picks the lowest free one (channel 0 reserved,
#            SwitchParameters=imex_channel_count=N, 2048 by default) and slurmstepd creates it
#            only inside each step's own mount namespace (switch_p_job_init, setup_imex_channel:
#            a tmpfs over /dev/nvidia-caps-imex-channels holding channelN, mode 0666); it sets no
#            environment variable (switch_p_job_attach is empty) and slurmd empties that
#            directory in its own namespace (SchedMD/slurm, src/plugins/switch/nvidia_imex/
#            switch_nvidia_imex.c and imex_device.c). With that plugin the job's processes open
#            a channel this prolog cannot see: run job mode with SwitchType=switch/none (the
#            daemon makes the job's channel device itself, owned as below), or give the channel
#            in OPENIMEX_JOB_CHANNEL from whatever knows it.
#   MEMBERS  the job's nodes, `scontrol show hostnames` of SLURM_JOB_NODELIST, or of
#            SLURM_NODELIST (what Slurm 22.05 gives a prolog), each as its entry in the nodes
#            file: the second word of its line in OPENIMEX_NODE_MAP when that is set (a file of
#            `NODENAME ENTRY` lines, # comments, the same on every node; a job node missing from
#            it is an error), else the Slurm node name itself (a nodes file of host names).
#   OWNER    SLURM_JOB_UID:SLURM_JOB_GID: the daemon makes the job's channel device the job
#            user's, mode 0660 (without them: root's, 0600). Other users' jobs on the node
#            cannot open it; another job of the same user on the same node could.
# Epilog: deletes the job file; the daemon ends the job on this node at once (no new import
# under it, its channel device removed). A file already gone is no error; a file it cannot
# delete is reported, and the epilog exits 1 only with OPENIMEX_EPILOG_STRICT=1, as below.
# Once the daemon has ended the job (`ctl jobs wait --state GONE`), the epilog gives it the
# owner's word that no process of the job is left on the node (`ctl jobs clear CHANNEL`): Slurm
# runs the epilog after it ended the job's processes here, and without that word the daemon
# keeps the channel from every later job until a reboot (a stray could still export on it), so
# a node would run out of channels. Set OPENIMEX_CLEAR_CHANNEL=0 where processes may outlive
# their job (a proctrack plugin that cannot kill them all, e.g. proctrack/pgid).
#
# Job mode settings (environment; defaults in brackets), besides the shared ones below:
#   OPENIMEX_JOBS_DIR      the daemon's jobs directory [unset: domain mode]
#   OPENIMEX_NODE_MAP      Slurm node name -> nodes-file entry map file [unset: the same]
#   OPENIMEX_JOB_CHANNEL   the job's channel [unset: from SLURM_JOB_ID, as above]
#   OPENIMEX_CHANNEL_COUNT channels the driver has (NVreg_ImexChannelCount) [2048]
#   OPENIMEX_CLEAR_CHANNEL 1: the epilog releases the ended job's channel (above); 0: not [1]
#   OPENIMEX_WAIT_TIMEOUT, OPENIMEX_POLL_INTERVAL, SCONTROL, OPENIMEX_EPILOG_STRICT as in domain
#   mode.
#
# Domain mode.
#
# Prolog: points the node's IMEX daemon at the job's nodes and waits, by polling
# ctl, until the job's IMEX domain is UP. Works with openimex and with NVIDIA's nvidia-imex.
#
#   Prolog=/etc/slurm/openimex-prolog.sh     (slurm.conf; with the matching epilog.sh as Epilog)
#
# 1. `scontrol show hostnames "$SLURM_JOB_NODELIST"` gives the job's nodes, in order (line i is
#    IMEX node ID i on every node of the job, since they all expand the same list).
# 2. The nodes file is compared with that list:
#    - no real entry in it (missing, empty, or only 0.0.0.0 placeholders, as epilog.sh leaves
#      it), or every real entry already the job's entry at the same line (placeholders filled
#      in, lines appended): the job's list is written and the daemon gets SIGUSR1. An
#      unconfigured openimex re-executes itself configured; a configured one adds the nodes.
#      No restart, same PID.
#    - real entries that differ (a daemon of another domain; SIGUSR1 refuses an edited or
#      removed line because it would renumber running nodes): the list is written and the
#      daemon is restarted (OPENIMEX_RESTART_CMD, default `systemctl restart openimex`).
# 3. It polls `ctl -q` and `ctl -N` every OPENIMEX_POLL_INTERVAL seconds until the local daemon
#    says READY and `Domain State: UP` (every job node READY and connected); no other sleep.
#    After OPENIMEX_WAIT_TIMEOUT seconds it exits 1 naming the nodes not READY, so Slurm drains
#    the node instead of starting a job without its IMEX domain.
#
# Settings (environment), besides the shared ones listed after this header:
#   OPENIMEX_WAIT_TIMEOUT  seconds to wait for the domain [120]
#   OPENIMEX_POLL_INTERVAL seconds between two polls [0.2] (the only sleep)
#   OPENIMEX_WAIT_FOR      domain: ctl -q READY and Domain State UP; local: ctl -q READY only [domain]
#   SCONTROL               the scontrol command [scontrol]
#
# Epilog: resets the IMEX nodes file to placeholders and restarts the daemon, so
# it comes back unconfigured (ctl -q UNAVAILABLE) and no IMEX domain outlives the job.
#
#   Epilog=/etc/slurm/openimex-epilog.sh     (slurm.conf; with the matching prolog.sh as Prolog)
#
# The nodes file becomes a `##` line and OPENIMEX_PLACEHOLDERS `0.0.0.0` lines (written
# atomically: a temporary file, then rename), then the daemon is restarted
# (OPENIMEX_RESTART_CMD, default `systemctl restart openimex`). A restart, not SIGUSR1: openimex
# refuses on SIGUSR1 to turn real entries back into placeholders (that would renumber running
# nodes), so a signalled daemon would keep the finished job's map while the file says otherwise.
# A new instance also makes the peers clean up whatever the job's processes left imported.
# After it, the nodes file is again what the daemon runs on, which is what prolog.sh relies on
# (the next job's list over placeholders: SIGUSR1 only, no restart, at job start).
# Failures are reported but the epilog exits 0 unless OPENIMEX_EPILOG_STRICT=1: a job that ran
# should not drain its node because the daemon was already gone.
set -eu
set -f
case "$(basename "$0")" in
    *epilog*) IMEX_SCRIPT=openimex-epilog ;;
    *) IMEX_SCRIPT=openimex-prolog ;;
esac
: "${PATH:=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
export PATH

#
# Settings (environment; defaults in brackets):
#   OPENIMEX_NODES_FILE   the IMEX nodes file [/etc/nvidia-imex/nodes_config.cfg]
#   OPENIMEX_CTL          the ctl command, word-split, target flags included
#                         [openimex ctl -c /etc/nvidia-imex/config.cfg if openimex is on PATH,
#                          else nvidia-imex-ctl -c /etc/nvidia-imex/config.cfg]
#   OPENIMEX_UNIT         systemd unit of the daemon [openimex]
#   OPENIMEX_RELOAD_CMD   shell command that makes the daemon re-read the nodes file (SIGUSR1)
#                         [unset: see imex_reload for the order tried]
#   OPENIMEX_RESTART_CMD  shell command that restarts the daemon [systemctl restart $OPENIMEX_UNIT]
#   OPENIMEX_PID_FILE     file holding the daemon's PID [unset]
#   OPENIMEX_DAEMON_NAME  process names for pgrep -x [nvidia-imex openimex]
#   OPENIMEX_PLACEHOLDERS placeholder lines the epilog writes [9]

: "${OPENIMEX_NODES_FILE:=/etc/nvidia-imex/nodes_config.cfg}"
: "${OPENIMEX_UNIT:=openimex}"
: "${OPENIMEX_DAEMON_NAME:=nvidia-imex openimex}"
: "${OPENIMEX_PLACEHOLDERS:=9}"
if [ -z "${OPENIMEX_CTL:-}" ]; then
    if command -v openimex >/dev/null 2>&1; then
        OPENIMEX_CTL="openimex ctl -c /etc/nvidia-imex/config.cfg"
    else
        OPENIMEX_CTL="nvidia-imex-ctl -c /etc/nvidia-imex/config.cfg"
    fi
fi

imex_log() {
    printf '%s: %s\n' "${IMEX_SCRIPT:-openimex}" "$*" >&2
}

# Runs the ctl command with extra arguments (OPENIMEX_CTL is split on blanks on purpose).
imex_ctl() {
    # shellcheck disable=SC2086
    $OPENIMEX_CTL "$@"
}

# Prints the entry lines of a nodes file (no comments, no blank lines, trailing comments and
# blanks cut), one per line. A missing file prints nothing.
imex_entries() {
    [ -r "$1" ] || return 0
    sed -e 's/[[:space:]]#.*$//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$1" |
        grep -v -e '^#' -e '^$' || true
}

# Whether an entry is a placeholder (the unspecified address: 0.0.0.0, ::, 0::0, ...).
imex_is_placeholder() {
    case "$1" in
        0.0.0.0) return 0 ;;
        *[!0:]*) return 1 ;;
        *::*) return 0 ;;
        *) return 1 ;;
    esac
}

# Writes stdin to the nodes file atomically: a temporary file in the same directory, then rename.
imex_write_nodes() {
    dir=$(dirname -- "$OPENIMEX_NODES_FILE")
    tmp=$(mktemp "$dir/.nodes_config.XXXXXX")
    if ! cat >"$tmp"; then
        rm -f -- "$tmp"
        return 1
    fi
    chmod 0644 "$tmp"
    mv -f -- "$tmp" "$OPENIMEX_NODES_FILE"
}

# Sends SIGUSR1 to the daemon: OPENIMEX_RELOAD_CMD if set; else the PID in OPENIMEX_PID_FILE;
# else `systemctl reload $OPENIMEX_UNIT` if that unit is active; else every process named one of
# OPENIMEX_DAEMON_NAME (pgrep -x).
imex_reload() {
    if [ -n "${OPENIMEX_RELOAD_CMD:-}" ]; then
        sh -c "$OPENIMEX_RELOAD_CMD"
        return
    fi
    if [ -n "${OPENIMEX_PID_FILE:-}" ]; then
        pid=$(cat -- "$OPENIMEX_PID_FILE") || return 1
        kill -USR1 "$pid"
        return
    fi
    if command -v systemctl >/dev/null 2>&1 &&
        systemctl is-active --quiet "$OPENIMEX_UNIT" 2>/dev/null; then
        systemctl reload "$OPENIMEX_UNIT"
        return
    fi
    for name in $OPENIMEX_DAEMON_NAME; do
        pids=$(pgrep -x "$name" || true)
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill -USR1 $pids
            return
        fi
    done
    imex_log "no IMEX daemon found to signal (set OPENIMEX_RELOAD_CMD, OPENIMEX_PID_FILE or OPENIMEX_UNIT)"
    return 1
}

# Restarts the daemon: OPENIMEX_RESTART_CMD, else `systemctl restart $OPENIMEX_UNIT`.
imex_restart() {
    if [ -n "${OPENIMEX_RESTART_CMD:-}" ]; then
        sh -c "$OPENIMEX_RESTART_CMD"
    else
        systemctl restart "$OPENIMEX_UNIT"
    fi
}

# The one sleep of both modes: between two polls of ctl.
imex_pause() {
    sleep "$OPENIMEX_POLL_INTERVAL"
}

# Whether $1 is a decimal number (digits only, at least one).
imex_is_number() {
    case "$1" in
        '' | *[!0-9]*) return 1 ;;
        *) return 0 ;;
    esac
}

: "${OPENIMEX_EPILOG_STRICT:=0}"
: "${OPENIMEX_WAIT_TIMEOUT:=120}"
: "${OPENIMEX_POLL_INTERVAL:=0.2}"
: "${SCONTROL:=scontrol}"
if [ -z "${OPENIMEX_SLURM_MODE:-}" ]; then
    if [ -n "${OPENIMEX_JOBS_DIR:-}" ]; then
        OPENIMEX_SLURM_MODE=job
    else
        OPENIMEX_SLURM_MODE=domain
    fi
fi
case "$OPENIMEX_SLURM_MODE" in
    job | domain) ;;
    *)
        imex_log "OPENIMEX_SLURM_MODE must be job or domain, not '$OPENIMEX_SLURM_MODE'"
        exit 1
        ;;
esac

# Job mode, to its end (it exits).
if [ "$OPENIMEX_SLURM_MODE" = job ]; then
    if [ -z "${OPENIMEX_JOBS_DIR:-}" ]; then
        imex_log "job mode needs OPENIMEX_JOBS_DIR, the daemon's jobs directory"
        exit 1
    fi
    if ! imex_is_number "${SLURM_JOB_ID:-}"; then
        imex_log "SLURM_JOB_ID='${SLURM_JOB_ID:-}' is no job ID: not run by Slurm?"
        exit 1
    fi
    job=slurm-$SLURM_JOB_ID
    job_file=$OPENIMEX_JOBS_DIR/$job.job

    if [ "$IMEX_SCRIPT" = openimex-epilog ]; then
        # The channel, read before the file goes (a re-run finds no file: nothing to release).
        channel=$(sed -n 's/^[[:space:]]*CHANNEL[[:space:]]*=[[:space:]]*\([0-9]*\).*/\1/p' \
            "$job_file" 2>/dev/null | head -n 1) || true
        if ! rm -f -- "$job_file"; then
            imex_log "cannot delete $job_file: IMEX job $job goes on on this node"
            if [ "$OPENIMEX_EPILOG_STRICT" = 1 ]; then
                exit 1
            fi
            exit 0
        fi
        if [ -n "$channel" ] && [ "${OPENIMEX_CLEAR_CHANNEL:-1}" = 1 ]; then
            # Only once the daemon has ended the job: a word given before would find the
            # channel still the job's, and the quarantine would start after it.
            if imex_ctl jobs wait "$job" --state GONE --timeout "$OPENIMEX_WAIT_TIMEOUT" \
                >/dev/null && imex_ctl jobs clear "$channel" >/dev/null; then
                :
            else
                imex_log "could not release channel $channel of IMEX job $job: it stays \
quarantined on this node (ctl jobs clear $channel releases it)"
                if [ "$OPENIMEX_EPILOG_STRICT" = 1 ]; then
                    exit 1
                fi
            fi
        fi
        exit 0
    fi

    nodelist=${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}
    if [ -z "$nodelist" ]; then
        imex_log "neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set: not run by Slurm?"
        exit 1
    fi
    # shellcheck disable=SC2086
    if ! hosts=$($SCONTROL show hostnames "$nodelist"); then
        imex_log "scontrol show hostnames '$nodelist' failed"
        exit 1
    fi
    if [ -n "${OPENIMEX_NODE_MAP:-}" ] && [ ! -r "$OPENIMEX_NODE_MAP" ]; then
        imex_log "cannot read OPENIMEX_NODE_MAP=$OPENIMEX_NODE_MAP"
        exit 1
    fi
    members=
    for host in $hosts; do
        entry=$host
        if [ -n "${OPENIMEX_NODE_MAP:-}" ]; then
            entry=$(awk -v h="$host" '
                { sub(/#.*/, "") }
                $1 == h && NF >= 2 { print $2; exit }' "$OPENIMEX_NODE_MAP")
            if [ -z "$entry" ]; then
                imex_log "node $host of job $SLURM_JOB_ID has no line in $OPENIMEX_NODE_MAP"
                exit 1
            fi
        fi
        members=${members:+$members,}$entry
    done
    if [ -z "$members" ]; then
        imex_log "no node in the job's node list '$nodelist'"
        exit 1
    fi

    if [ -n "${OPENIMEX_JOB_CHANNEL:-}" ]; then
        channel=$OPENIMEX_JOB_CHANNEL
        if ! imex_is_number "$channel"; then
            imex_log "OPENIMEX_JOB_CHANNEL='$channel' is no channel number"
            exit 1
        fi
    else
        count=${OPENIMEX_CHANNEL_COUNT:-2048}
        if ! imex_is_number "$count" || [ "$count" -lt 2 ]; then
            imex_log "OPENIMEX_CHANNEL_COUNT='$count' must be a number of at least 2"
            exit 1
        fi
        channel=$((1 + SLURM_JOB_ID % (count - 1)))
    fi

    # The daemon makes its directory root-only (0700); made here first, it is the same.
    # shellcheck disable=SC2174
    mkdir -p -m 0700 -- "$OPENIMEX_JOBS_DIR"
    tmp=$(mktemp "$OPENIMEX_JOBS_DIR/.$job.XXXXXX")
    if ! {
        echo "# Slurm job $SLURM_JOB_ID ($nodelist), written by $IMEX_SCRIPT on ${SLURMD_NODENAME:-$(hostname)}"
        echo "CHANNEL=$channel"
        echo "MEMBERS=$members"
        if imex_is_number "${SLURM_JOB_UID:-}" && imex_is_number "${SLURM_JOB_GID:-}"; then
            echo "OWNER=$SLURM_JOB_UID:$SLURM_JOB_GID"
        fi
    } >"$tmp"; then
        rm -f -- "$tmp"
        imex_log "cannot write $tmp"
        exit 1
    fi
    chmod 0600 "$tmp"
    mv -f -- "$tmp" "$job_file"

    # The daemon answers when the job is READY; a call that fails sooner (a daemon restarting)
    # is made again after the poll interval, the only sleep.
    start=$(date +%s)
    while :; do
        left=$((OPENIMEX_WAIT_TIMEOUT - ($(date +%s) - start)))
        if [ "$left" -le 0 ]; then
            break
        fi
        if imex_ctl jobs wait "$job" --timeout "$left" >/dev/null 2>&1; then
            exit 0
        fi
        imex_pause
    done
    state=$(imex_ctl -q --job "$job" 2>/dev/null | head -n 1) || true

    # Timed out: the state, and the members it names (as ctl -N shows them).
    imex_log "IMEX job $job (channel $channel, members $members) is not READY after ${OPENIMEX_WAIT_TIMEOUT}s: ${state:-the local daemon holds no such job}"
    if [ -z "$state" ]; then
        imex_log "the daemon did not define it from $job_file (its log says why); its jobs:"
        imex_ctl jobs 1>&2 || true
        exit 1
    fi
    ids=$(imex_ctl jobs "$job" -j 2>/dev/null |
        sed -n 's/.*"nodes":\[\([0-9,]*\)\].*/\1/p' | tr ',' ' ') || true
    case "$state" in
        FORMING) why="waiting on" ;;
        DEGRADED) why="lost" ;;
        DISAGREED) why="disagreeing" ;;
        *) why="named" ;;
    esac
    table=$(imex_ctl -N 2>&1) || true
    for id in $ids; do
        line=$(printf '%s\n' "$table" | awk -v id="#$id" '
            # Node #1   - 10.0.0.2   - UNAVAILABLE   - Version: ...  (the local node: * 10.0.0.1 *)
            $1 == "Node" && $2 == id {
                n = 0
                for (k = 3; k <= NF && n < 2; k++) {
                    if ($k != "-" && $k != "*") { n++; word[n] = $k }
                }
                printf "%s (%s)\n", word[1], word[2]
            }')
        imex_log "$state: $why member node #$id ${line:-(not in ctl -N)}"
    done
    exit 1
fi

# The epilog, to its end (it exits).
if [ "$IMEX_SCRIPT" = openimex-epilog ]; then
    status=0
    {
        echo '##'
        n=0
        while [ "$n" -lt "$OPENIMEX_PLACEHOLDERS" ]; do
            echo 0.0.0.0
            n=$((n + 1))
        done
    } | imex_write_nodes || status=1
    if [ "$status" = 0 ]; then
        imex_restart || status=1
    fi
    if [ "$status" != 0 ]; then
        imex_log "resetting the IMEX daemon after job ${SLURM_JOB_ID:-?} failed"
        if [ "$OPENIMEX_EPILOG_STRICT" = 1 ]; then
            exit 1
        fi
    fi
    exit 0
fi

# The prolog.
: "${OPENIMEX_WAIT_FOR:=domain}"

# Slurm 22.05 gives a prolog SLURM_NODELIST only.
: "${SLURM_JOB_NODELIST:=${SLURM_NODELIST:-}}"
if [ -z "$SLURM_JOB_NODELIST" ]; then
    imex_log "neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set: not run by Slurm?"
    exit 1
fi
case "$OPENIMEX_WAIT_FOR" in
    domain | local) ;;
    *)
        imex_log "OPENIMEX_WAIT_FOR must be domain or local, not '$OPENIMEX_WAIT_FOR'"
        exit 1
        ;;
esac

# shellcheck disable=SC2086
if ! job_nodes=$($SCONTROL show hostnames "$SLURM_JOB_NODELIST"); then
    imex_log "scontrol show hostnames '$SLURM_JOB_NODELIST' failed"
    exit 1
fi
if [ -z "$job_nodes" ]; then
    imex_log "no node in SLURM_JOB_NODELIST='$SLURM_JOB_NODELIST'"
    exit 1
fi

# reload: every real entry of the current file is the job's entry at the same line, and the
# file is no longer than the job's list unless it holds no real entry at all. Else: restart.
current=$(imex_entries "$OPENIMEX_NODES_FILE")
action=reload
real=0
i=0
for entry in $current; do
    i=$((i + 1))
    imex_is_placeholder "$entry" && continue
    real=1
    want=$(printf '%s\n' "$job_nodes" | sed -n "${i}p")
    if [ "$entry" != "$want" ]; then
        action=restart
    fi
done
if [ "$real" = 1 ] && [ "$i" -gt "$(printf '%s\n' "$job_nodes" | wc -l)" ]; then
    action=restart
fi

if [ "$current" != "$job_nodes" ]; then
    printf '%s\n' "$job_nodes" | imex_write_nodes
fi
if [ "$action" = restart ]; then
    imex_log "$OPENIMEX_NODES_FILE named other nodes: restarting the IMEX daemon"
    imex_restart || {
        imex_log "restarting the IMEX daemon failed"
        exit 1
    }
elif ! imex_reload; then
    imex_log "signalling the IMEX daemon failed: restarting it"
    imex_restart || {
        imex_log "restarting the IMEX daemon failed"
        exit 1
    }
fi

# Polls ctl until the domain is ready; the poll interval is the only sleep.
start=$(date +%s)
state=
while :; do
    state=$(imex_ctl -q 2>/dev/null | head -n 1) || true
    if [ "$state" = READY ]; then
        if [ "$OPENIMEX_WAIT_FOR" = local ]; then
            exit 0
        fi
        if imex_ctl -N 2>/dev/null | grep -q '^Domain State: UP$'; then
            exit 0
        fi
    fi
    if [ $(($(date +%s) - start)) -ge "$OPENIMEX_WAIT_TIMEOUT" ]; then
        break
    fi
    imex_pause
done

# Timed out: name the nodes that are not READY, as ctl -N shows them.
imex_log "the IMEX domain of job ${SLURM_JOB_ID:-?} is not ready after ${OPENIMEX_WAIT_TIMEOUT}s (local daemon: ${state:-no answer})"
table=$(imex_ctl -N 2>&1) || true
not_ready=$(printf '%s\n' "$table" | awk '
    # Node #1   - 10.0.0.2   - UNAVAILABLE   - Version: ...  (the local node: * 10.0.0.1 *)
    /^Node #/ {
        n = 0
        for (k = 3; k <= NF && n < 2; k++) {
            if ($k != "-" && $k != "*") { n++; word[n] = $k }
        }
        if (word[2] != "READY") printf "%s %s %s\n", $2, word[1], word[2]
    }')
if [ -n "$not_ready" ]; then
    printf '%s\n' "$not_ready" | while read -r id host st; do
        imex_log "node $id $host is $st, not READY"
    done
else
    imex_log "ctl -N:"
    printf '%s\n' "$table" >&2
fi
domain=$(printf '%s\n' "$table" | sed -n 's/^Domain State: //p')
imex_log "domain state: ${domain:-unknown}"
exit 1
