//! `openimex init` for several nodes on one host (`--install-dir` with `{id}`): the configs it
//! writes start as they are — each node binds its own address and keeps its own log, stats
//! file, persist record and command socket — and form a domain over simulated GPU drivers;
//! and an `OPENIMEX_*` config key set in the daemon's environment is warned about.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;

use openimex_config::Config;
use openimex_harness::process::{find_pids_with_args, send_signal};
use openimex_harness::{Cluster, DomainView, GpuSpec, Signal};

use crate::common::{FORM, KillOnDrop, binary, run, spec, text, wait_for};

#[test]
fn init_for_one_host_writes_configs_that_start_and_form_as_written() {
    let gpus = GpuSpec {
        gpus_per_node: 1,
        hbm_mib: 16,
        channels: 1,
        ..GpuSpec::default()
    };
    // The cluster lends addresses, directories and simulated drivers; the daemons run on
    // init's files, unchanged.
    let cluster = Cluster::prepare(spec(3).with_gpus(gpus)).expect("prepare 3 nodes");
    let (base, ips, out) = crate::init::init_on_one_host(&cluster);
    let said = text(&out.stdout);
    assert!(
        said.contains("(in place)") && said.contains("Several nodes on one host"),
        "{said}"
    );

    // No two nodes share an address, a file or a socket.
    let configs: Vec<PathBuf> = (0..3)
        .map(|i| base.join(format!("node{i}/config.cfg")))
        .collect();
    let parsed: Vec<Config> = configs
        .iter()
        .map(|c| Config::load(c).unwrap_or_else(|e| panic!("{}: {e}", c.display())))
        .collect();
    for (i, cfg) in parsed.iter().enumerate() {
        assert!(cfg.notices().is_empty(), "node {i}: {:?}", cfg.notices());
        assert_eq!(
            cfg.bind_interface_ip.map(|ip| ip.to_string()).as_deref(),
            Some(ips[i].as_str())
        );
    }
    let distinct = |what: &str, values: Vec<Option<PathBuf>>| {
        assert!(values.iter().all(Option::is_some), "{what}: {values:?}");
        let set: HashSet<_> = values.iter().collect();
        assert_eq!(set.len(), 3, "{what} shared: {values:?}");
    };
    distinct(
        "LOG_FILE_NAME",
        parsed.iter().map(|c| c.log_file_name.clone()).collect(),
    );
    distinct(
        "STATS_FILE_NAME",
        parsed.iter().map(|c| c.stats_file_name.clone()).collect(),
    );
    distinct(
        "OPENIMEX_PERSIST_FILE",
        parsed
            .iter()
            .map(|c| Some(c.persist_file.clone()))
            .collect(),
    );
    distinct(
        "IMEX_CMD_UNIX_DOMAIN_PATH",
        parsed
            .iter()
            .map(|c| c.imex_cmd_unix_domain_path.clone())
            .collect(),
    );

    // Start each daemon from its config as written (DAEMONIZE=1: `daemon` returns once the
    // child serves), its simulated driver named by the environment variable the daemon does
    // read, OPENIMEX_DRIVER_ROOT; node 2 also gets a config key in its environment.
    let _kill: Vec<KillOnDrop> = configs
        .iter()
        .map(|c| KillOnDrop(vec!["-c".into(), c.display().to_string()]))
        .collect();
    for (i, config) in configs.iter().enumerate() {
        cluster.start_driver(i).expect("start the simulated driver");
        let mut cmd = Command::new(binary());
        cmd.arg("daemon")
            .arg("-c")
            .arg(config)
            .env("OPENIMEX_DRIVER_ROOT", cluster.node(i).dir())
            .env_remove("NOTIFY_SOCKET");
        if i == 2 {
            cmd.env("OPENIMEX_PEER_TIMEOUT_MS", "9000");
        }
        let out = run(&mut cmd);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "daemon {i}: {stderr}");
        if i == 2 {
            assert!(
                stderr.contains(
                    "warning: OPENIMEX_PEER_TIMEOUT_MS=9000 is set in the environment, but \
                     OPENIMEX_PEER_TIMEOUT_MS is a config.cfg key"
                ) && stderr.contains(&format!(
                    "put the line OPENIMEX_PEER_TIMEOUT_MS=9000 in {}",
                    config.display()
                )),
                "{stderr}"
            );
        } else {
            assert!(!stderr.contains("warning"), "daemon {i}: {stderr}");
        }
    }

    let domain = || {
        let out = run(Command::new(binary())
            .args(["ctl", "-N", "-j", "-c"])
            .arg(&configs[0]));
        DomainView::parse(&text(&out.stdout)).ok()
    };
    assert!(
        wait_for(FORM, || domain()
            .is_some_and(|d| d.status == "UP" && d.all_ready())),
        "the one-host init domain did not come UP: {:?}",
        domain()
    );
    for (i, config) in configs.iter().enumerate() {
        let q = run(Command::new(binary()).args(["ctl", "-q", "-c"]).arg(config));
        assert_eq!(text(&q.stdout), "READY\n", "node {i}");
        // Each daemon writes its own log, at the path of its own config.
        let log_path = parsed[i].log_file_name.clone().expect("a log file");
        let log = std::fs::read_to_string(&log_path)
            .unwrap_or_else(|e| panic!("{}: {e}", log_path.display()));
        assert!(
            log.contains(&format!("Config file = {}", config.display())),
            "node {i}'s log is not its own:\n{log}"
        );
        let warned = log.contains("OPENIMEX_PEER_TIMEOUT_MS=9000 is set in the environment");
        assert_eq!(warned, i == 2, "node {i}'s log:\n{log}");
    }

    // A clean stop of each, by its config.
    for config in &configs {
        for pid in find_pids_with_args(&["-c", &config.display().to_string()]) {
            let _ = send_signal(pid, Signal::SIGTERM);
        }
    }
    assert!(
        wait_for(FORM, || configs.iter().all(|c| find_pids_with_args(&[
            "-c",
            &c.display().to_string()
        ])
        .is_empty())),
        "the daemons did not stop on SIGTERM"
    );
}
