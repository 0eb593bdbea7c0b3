//! The Slurm cluster of `slurm_jobs.rs` (issue 31): Debian's `slurmctld`, three `slurmd -N nK`
//! and `munged` on this machine, each Slurm node one simulated tray, with a private munge key
//! and socket, state, spool, logs and ports in a scratch directory (config by `-f` and
//! `SLURM_CONF`, nothing under /etc); the programs found, the files written, jobs started,
//! held, stepped into, cancelled and waited on, and everything stopped on drop.

use crate::common::{COMMAND, FORM, NOTICE, binary, lab_binary, text};
use openimex_harness::process::{process_alive, run_with_timeout, send_signal};
use openimex_harness::{Cluster, ScratchDir, Signal};
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The Slurm node names, node `i` of the openimex cluster being `NODES[i]`.
pub(crate) const NODES: [&str; 3] = ["n1", "n2", "n3"];
/// The programs the test runs, and where Debian puts them when PATH lacks the sbin dirs.
pub(crate) const PROGRAMS: [&str; 8] = [
    "munged",
    "slurmctld",
    "slurmd",
    "srun",
    "sbatch",
    "scancel",
    "squeue",
    "sinfo",
];
pub(crate) const SBIN: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];
/// Bound on one Slurm client command (a step included: the prolog waits at most
/// `PROLOG_TIMEOUT` before it).
pub(crate) const STEP: Duration = Duration::from_secs(60);
/// The prolog's OPENIMEX_WAIT_TIMEOUT: a job whose IMEX job is not READY by then fails.
pub(crate) const PROLOG_TIMEOUT: u64 = 30;
/// Bytes each task exports (`app export --size`).
pub(crate) const SIZE: &str = "4M";

/// The Slurm programs, by name.
pub(crate) struct Programs(Vec<(&'static str, PathBuf)>);

impl Programs {
    /// Every program of [`PROGRAMS`], or what is missing.
    pub(crate) fn find() -> Result<Self, String> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let dirs: Vec<PathBuf> = std::env::split_paths(&path)
            .chain(SBIN.iter().map(PathBuf::from))
            .collect();
        let mut found = Vec::new();
        let mut missing = Vec::new();
        for name in PROGRAMS {
            match dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
                Some(p) => found.push((name, p)),
                None => missing.push(name),
            }
        }
        if !missing.is_empty() {
            return Err(format!("not installed: {}", missing.join(", ")));
        }
        if ids().0 != 0 {
            return Err("not root: slurmd runs jobs as root".into());
        }
        Ok(Self(found))
    }

    pub(crate) fn get(&self, name: &str) -> &Path {
        let Some((_, p)) = self.0.iter().find(|(n, _)| *n == name) else {
            panic!("{name} is not one of the programs looked for");
        };
        p
    }
}

/// This process's effective (uid, gid): the owner of its /proc entry.
pub(crate) fn ids() -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata("/proc/self").expect("/proc/self");
    (me.uid(), me.gid())
}

/// A private Slurm cluster: munged, slurmctld and one slurmd per node of [`NODES`], their
/// files in one scratch directory. Dropping it cancels every job, stops the daemons and ends
/// whatever of theirs is left (a process whose working directory is in the scratch directory:
/// the jobs run there).
pub(crate) struct Slurm {
    programs: Programs,
    pub(crate) dir: ScratchDir,
    conf: PathBuf,
    /// (what, child): munged first, then slurmctld, then the slurmds.
    daemons: Vec<(String, Child)>,
}

impl Slurm {
    /// Starts the cluster for `cluster`'s trays and waits until every node is idle.
    pub(crate) fn start(programs: Programs, cluster: &Cluster) -> Self {
        let dir = ScratchDir::new("slurm").expect("scratch dir");
        let d = dir.path().to_path_buf();
        for sub in ["munge", "run", "state", "spool", "log"] {
            std::fs::create_dir_all(d.join(sub)).expect("slurm dirs");
        }
        let mut slurm = Self {
            programs,
            conf: d.join("slurm.conf"),
            dir,
            daemons: Vec::new(),
        };
        slurm.write_files(cluster);

        // munged, with its own key and socket (slurm.conf's AuthInfo names the socket).
        let key = d.join("munge/munge.key");
        let mut random = vec![0u8; 1024];
        use std::io::Read as _;
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .expect("random key");
        std::fs::write(&key, &random).expect("munge key");
        set_mode(&key, 0o400);
        set_mode(&d.join("munge"), 0o700);
        let socket = d.join("run/munge.socket");
        let mut munged = Command::new(slurm.programs.get("munged"));
        munged
            .arg("--foreground")
            .arg("--force")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--pid-file={}", d.join("run/munged.pid").display()))
            .arg(format!("--seed-file={}", d.join("munge/seed").display()));
        slurm.spawn("munged", &mut munged);
        slurm.wait("munged's socket", |_| socket.exists());

        let mut ctld = Command::new(slurm.programs.get("slurmctld"));
        ctld.arg("-D").arg("-f").arg(&slurm.conf);
        slurm.spawn("slurmctld", &mut ctld);
        for name in NODES {
            let mut slurmd = Command::new(slurm.programs.get("slurmd"));
            slurmd
                .arg("-D")
                .args(["-N", name])
                .arg("-f")
                .arg(&slurm.conf);
            slurm.spawn(&format!("slurmd-{name}"), &mut slurmd);
        }
        slurm.wait("every Slurm node idle", |slurm| {
            let out = slurm.client("sinfo", &["-h", "-N", "-o", "%N %T"]);
            let idle = text(&out.stdout)
                .lines()
                .filter(|l| l.ends_with(" idle"))
                .count();
            idle == NODES.len()
        });
        slurm
    }

    /// slurm.conf, the Prolog and Epilog wrappers, the node map and the task scripts.
    pub(crate) fn write_files(&self, cluster: &Cluster) {
        let d = self.dir.path();
        let host = openimex_harness::nix::unistd::gethostname()
            .expect("hostname")
            .to_string_lossy()
            .into_owned();
        let ports = free_ports(1 + NODES.len());
        let mut conf = format!(
            "ClusterName=openimex\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={d}/run/munge.socket\n\
             CredType=cred/munge\n\
             StateSaveLocation={d}/state\n\
             SlurmdSpoolDir={d}/spool/%n\n\
             SlurmctldPidFile={d}/run/slurmctld.pid\n\
             SlurmdPidFile={d}/run/slurmd.%n.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\n\
             SlurmdLogFile={d}/log/slurmd.%n.log\n\
             ProctrackType=proctrack/pgid\n\
             TaskPlugin=task/none\n\
             SwitchType=switch/none\n\
             MpiDefault=none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             JobCompType=jobcomp/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_CPU\n\
             SlurmdParameters=config_overrides\n\
             ReturnToService=2\n\
             PrologFlags=Alloc\n\
             Prolog={d}/prolog.sh\n\
             Epilog={d}/epilog.sh\n\
             PrologEpilogTimeout=60\n\
             MailProg=/bin/true\n\
             KillWait=2\n\
             InactiveLimit=0\n",
            ctld = ports[0],
            d = d.display(),
        );
        // CPUs=4 (config_overrides: not this machine's count): two one-CPU-per-node jobs can
        // share a node.
        for (name, port) in NODES.iter().zip(&ports[1..]) {
            writeln!(
                conf,
                "NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=4 \
                 State=UNKNOWN"
            )
            .expect("format");
        }
        conf += "PartitionName=trays Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP\n";
        std::fs::write(&self.conf, conf).expect("slurm.conf");

        // Slurm node name -> nodes-file entry (the tray's address): OPENIMEX_NODE_MAP.
        let map: String = NODES
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{n} {}\n", cluster.node(i).ip()))
            .collect();
        std::fs::write(
            d.join("node-map"),
            format!("# Slurm node, IMEX address\n{map}"),
        )
        .expect("node map");

        // Per node: (tray directory, config, channels directory).
        let cases: String = NODES
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let node = cluster.node(i);
                let channels = openimex_simproto::node_dir::channel_path(node.dir(), 0);
                let channels = channels.parent().expect("channels dir");
                format!(
                    "    {n}) node={}; config={}; channels={} ;;\n",
                    node.dir().display(),
                    node.config_path().display(),
                    channels.display()
                )
            })
            .collect();
        let select = format!(
            "case \"${{SLURMD_NODENAME:-}}\" in\n{cases}    \
             *) echo \"unknown node '${{SLURMD_NODENAME:-}}'\" >&2; exit 2 ;;\nesac\n"
        );
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/slurm");
        for which in ["prolog", "epilog"] {
            let body = format!(
                "#!/bin/sh\n\
                 # Slurm's {which} for node $SLURMD_NODENAME of the test: that tray's settings,\n\
                 # then dist/slurm/{which}.sh (job mode: OPENIMEX_JOBS_DIR is set).\n\
                 {select}\
                 export OPENIMEX_JOBS_DIR=\"$node/jobs\"\n\
                 export OPENIMEX_CTL=\"{openimex} ctl -c $config\"\n\
                 export OPENIMEX_NODE_MAP={d}/node-map\n\
                 export OPENIMEX_POLL_INTERVAL=0.05\n\
                 export OPENIMEX_WAIT_TIMEOUT={PROLOG_TIMEOUT}\n\
                 exec >>{d}/log/{which}.$SLURMD_NODENAME.log 2>&1\n\
                 echo \"job $SLURM_JOB_ID\"\n\
                 exec {repo}/{which}.sh\n",
                openimex = binary().display(),
                d = d.display(),
                repo = repo.display(),
            );
            write_script(&d.join(format!("{which}.sh")), &body);
        }

        // One task: `openimex-lab app SUB ...` on its node's tray, on the channel of its job as
        // the prolog wrote it in the node's job file; `state` prints the job's name, channel
        // and state word there.
        let task = format!(
            "#!/bin/sh\n\
             set -eu\n\
             {select}\
             job=slurm-$SLURM_JOB_ID\n\
             channel=$(sed -n 's/^CHANNEL=//p' \"$node/jobs/$job.job\")\n\
             [ -n \"$channel\" ] || {{ echo \"$SLURMD_NODENAME: no job file for $job\" >&2; exit 3; }}\n\
             sub=$1\n\
             shift\n\
             if [ \"$sub\" = state ]; then\n\
             \x20   echo \"$job channel $channel $({openimex} ctl -c \"$config\" -q --job \"$job\")\"\n\
             \x20   exit 0\n\
             fi\n\
             exec {lab} app \"$sub\" --node-dir \"$node\" --channel \"$channels/channel$channel\" \"$@\"\n",
            openimex = binary().display(),
            lab = lab_binary().display(),
        );
        write_script(&d.join("task.sh"), &task);

        // Every rank of an `srun -N3 -n3`: exports its own pattern (seed 100 + rank) and holds
        // it, imports every other rank's export verifying its pattern, and lets its export go
        // once every rank is done. Handles and done marks go through files (the nodes share
        // this machine's file system); each wait is bounded (30 s).
        let all_to_all = format!(
            "#!/bin/sh\n\
             set -eu\n\
             rank=$SLURM_PROCID\n\
             task={d}/task.sh\n\
             run={d}/run-$SLURM_JOB_ID\n\
             mkdir -p \"$run\"\n\
             await() {{\n\
             \x20   i=0\n\
             \x20   while [ \"$(wc -l <\"$1\" 2>/dev/null || echo 0)\" -lt 1 ]; do\n\
             \x20       i=$((i + 1))\n\
             \x20       [ $i -le 600 ] || {{ echo \"rank $rank: no $1 after 30 s\" >&2; exit 1; }}\n\
             \x20       sleep 0.05\n\
             \x20   done\n\
             }}\n\
             echo \"rank $rank on $SLURMD_NODENAME: job $(\"$task\" state)\"\n\
             mkfifo \"$run/in.$rank\"\n\
             \"$task\" export --gpu 0 --size {SIZE} --pattern $((100 + rank)) --hold \
             <\"$run/in.$rank\" >\"$run/out.$rank\" &\n\
             exporter=$!\n\
             exec 3>\"$run/in.$rank\"\n\
             await \"$run/out.$rank\"\n\
             head -n 1 \"$run/out.$rank\" >\"$run/.handle.$rank\"\n\
             mv \"$run/.handle.$rank\" \"$run/handle.$rank\"\n\
             r=0\n\
             while [ $r -lt \"$SLURM_NTASKS\" ]; do\n\
             \x20   if [ $r -ne \"$rank\" ]; then\n\
             \x20       await \"$run/handle.$r\"\n\
             \x20       got=$(\"$task\" import --handle \"$(cat \"$run/handle.$r\")\" --verify $((100 + r)))\n\
             \x20       echo \"rank $rank on $SLURMD_NODENAME imported rank $r: $got\"\n\
             \x20   fi\n\
             \x20   r=$((r + 1))\n\
             done\n\
             echo done >\"$run/done.$rank\"\n\
             r=0\n\
             while [ $r -lt \"$SLURM_NTASKS\" ]; do\n\
             \x20   await \"$run/done.$r\"\n\
             \x20   r=$((r + 1))\n\
             done\n\
             echo exit >&3\n\
             wait $exporter\n",
            d = d.display(),
        );
        write_script(&d.join("all-to-all.sh"), &all_to_all);
    }

    pub(crate) fn spawn(&mut self, what: &str, cmd: &mut Command) {
        let log = self.dir.path().join(format!("log/{what}.out"));
        let out = std::fs::File::create(&log).expect("daemon log");
        let err = out.try_clone().expect("daemon log");
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env("SLURM_CONF", &self.conf);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        self.daemons.push((what.to_string(), child));
    }

    /// Waits up to `FORM` for `cond`, failing with the daemons' logs (at once if one exited).
    #[track_caller]
    pub(crate) fn wait(&mut self, what: &str, mut cond: impl FnMut(&Self) -> bool) {
        let t0 = Instant::now();
        while !cond(self) {
            let exited = (self.daemons.iter_mut())
                .find_map(|(name, child)| Some((name.clone(), child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                panic!("{name} exited ({status}) before {what} (the Slurm logs follow)");
            }
            assert!(
                t0.elapsed() < FORM,
                "{what}: not within {FORM:?} (the Slurm logs follow)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A Slurm client command against this cluster only (SLURM_CONF; no SLURM_* variable of
    /// a Slurm job the test itself may run in), from the scratch directory (the jobs' working
    /// directory).
    pub(crate) fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.programs.get(program));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SLURM_") {
                cmd.env_remove(k);
            }
        }
        cmd.args(args)
            .env("SLURM_CONF", &self.conf)
            .current_dir(self.dir.path());
        cmd
    }

    /// Runs a client command (at most `STEP`).
    pub(crate) fn client(&self, program: &str, args: &[&str]) -> Output {
        run_with_timeout(&mut self.command(program, args), STEP)
            .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"))
    }

    /// `sbatch -N2 -w NODES` of a job that only holds its allocation: its ID, once it runs
    /// (a step of a pending job is refused).
    #[track_caller]
    pub(crate) fn hold(&self, nodes: &str) -> u32 {
        let out = self.client(
            "sbatch",
            &[
                "--parsable",
                "-N2",
                "-w",
                nodes,
                "-o",
                "/dev/null",
                "--wrap",
                "exec sleep 300",
            ],
        );
        let id = text(&out.stdout);
        let id = id.trim().split(';').next().unwrap_or_default();
        let Ok(id) = id.parse::<u32>() else {
            panic!("sbatch on {nodes}: {}", show(&out));
        };
        let t0 = Instant::now();
        loop {
            let out = self.client("squeue", &["-h", "-j", &id.to_string(), "-o", "%T"]);
            let state = text(&out.stdout).trim().to_string();
            if state == "RUNNING" {
                return id;
            }
            assert!(
                t0.elapsed() < STEP,
                "job {id} on {nodes} is {state:?}, not RUNNING, after {STEP:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A step of job `job` on `node` running `task.sh ARGS` (`--overlap`: the job's batch
    /// step holds its CPUs).
    pub(crate) fn step(&self, job: u32, node: &str, args: &[&str]) -> Command {
        let job = format!("--jobid={job}");
        let task = self.dir.path().join("task.sh").display().to_string();
        let mut all = vec![job.as_str(), "--overlap", "-N1", "-n1", "-w", node, &task];
        all.extend_from_slice(args);
        self.command("srun", &all)
    }

    /// The IDs of the jobs Slurm still holds (running, or completing: epilogs not done);
    /// `None` if squeue failed.
    pub(crate) fn jobs(&self) -> Option<Vec<u32>> {
        let out = run_with_timeout(&mut self.command("squeue", &["-h", "-o", "%i"]), COMMAND);
        let out = out.ok().filter(|o| o.status.success())?;
        let ids = text(&out.stdout);
        Some(ids.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    #[track_caller]
    pub(crate) fn cancel(&self, jobs: &[u32]) {
        let ids: Vec<String> = jobs.iter().map(ToString::to_string).collect();
        let args: Vec<&str> = ids.iter().map(String::as_str).collect();
        let out = self.client("scancel", &args);
        assert!(out.status.success(), "scancel {ids:?}: {}", show(&out));
    }

    /// Waits until Slurm holds none of `jobs` (their epilogs ran on every node).
    #[track_caller]
    pub(crate) fn wait_gone(&self, jobs: &[u32]) {
        let t0 = Instant::now();
        loop {
            let held = self.jobs();
            let left: Option<Vec<u32>> =
                (held.clone()).map(|h| h.into_iter().filter(|j| jobs.contains(j)).collect());
            if left.as_ref().is_some_and(Vec::is_empty) {
                return;
            }
            assert!(
                t0.elapsed() < NOTICE,
                "jobs {jobs:?}: Slurm still holds {held:?} after {NOTICE:?} (None: squeue failed)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The tails of every log of the Slurm cluster and of the prologs and epilogs.
    pub(crate) fn logs(&self) -> String {
        let mut all = String::new();
        let Ok(dir) = std::fs::read_dir(self.dir.path().join("log")) else {
            return all;
        };
        let mut paths: Vec<PathBuf> = dir.filter_map(|e| Some(e.ok()?.path())).collect();
        paths.sort();
        for p in paths {
            let body = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = body.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            let _ = writeln!(all, "--- {}\n{}", p.display(), tail.join("\n"));
        }
        all
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        // Every job ends first (its epilogs delete the job files), while slurmctld runs.
        let jobs = self.jobs().unwrap_or_default();
        if !jobs.is_empty() {
            let ids: Vec<String> = jobs.iter().map(ToString::to_string).collect();
            let args: Vec<&str> = ids.iter().map(String::as_str).collect();
            let _ = run_with_timeout(&mut self.command("scancel", &args), COMMAND);
            let t0 = Instant::now();
            while self.jobs().is_none_or(|j| !j.is_empty()) && t0.elapsed() < NOTICE {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // The slurmds, slurmctld, munged: SIGTERM, then SIGKILL whatever did not stop.
        for (_, child) in self.daemons.iter_mut().rev() {
            let _ = send_signal(child.id(), Signal::SIGTERM);
        }
        let t0 = Instant::now();
        for (_, child) in self.daemons.iter_mut().rev() {
            while matches!(child.try_wait(), Ok(None)) && t0.elapsed() < COMMAND {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // What they leave: a slurmstepd and its tasks run in the job's working directory, the
        // scratch directory; no process of anyone else does.
        for pid in pids_in(self.dir.path()) {
            let _ = send_signal(pid, Signal::SIGKILL);
        }
    }
}

/// Live processes (not this one) whose working directory is `dir` or under it.
pub(crate) fn pids_in(dir: &Path) -> Vec<u32> {
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && process_alive(pid))
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .collect()
}

/// `n` distinct TCP ports free on every address right now (slurmctld and slurmd listen on
/// the wildcard address), away from the harness's fixed IMEX ports. Held together while
/// picked, so they are distinct; another process could take one before Slurm binds it, which
/// the start then reports.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let imex = openimex_harness::cluster::DEFAULT_SERVER_PORT
        ..=openimex_harness::cluster::DEFAULT_CMD_PORT;
    let mut held = Vec::new();
    while held.len() < n {
        let l = TcpListener::bind("0.0.0.0:0").expect("bind a free port");
        let port = l.local_addr().expect("local addr").port();
        if !imex.contains(&port) {
            held.push(l);
        }
    }
    held.iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

pub(crate) fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

pub(crate) fn write_script(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    set_mode(path, 0o755);
}

pub(crate) fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}
