//! Issue 10, item 4: IMEX channel files. `openimex channels create N` makes tight files (0600,
//! root's; 0660 with a group), refuses a world-writable mode unless told, and makes character
//! devices of the major `/proc/devices` lists for `nvidia-caps-imex-channels`; the simulated
//! GPU driver creates its channel files 0600 and warns at start about a world-writable one.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use openimex_harness::ScratchDir;
use openimex_harness::nix::sys::stat::makedev;

use crate::common::{assert_clean_failure, binary, lab_binary, run, text};

fn create(dir: &Path, extra: &[&str]) -> std::process::Output {
    run(Command::new(binary())
        .args(["channels", "create"])
        .args(extra)
        .arg("--dir")
        .arg(dir)
        // No such file: this node has no nvidia-caps-imex-channels driver, whatever the host.
        .arg("--proc-devices")
        .arg(dir.with_extension("no-proc-devices")))
}

fn owner_and_mode(p: &Path) -> (u32, u32, u32) {
    let m = std::fs::metadata(p).expect("channel file");
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

#[test]
fn channels_create_makes_tight_files_and_refuses_world_writable_modes() {
    let scratch = ScratchDir::new("channels-create").expect("scratch dir");
    let dir = scratch.path().join("caps");
    let out = create(&dir, &["3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for n in 0..3 {
        let p = dir.join(format!("channel{n}"));
        assert_eq!(owner_and_mode(&p), (0, 0, 0o600), "{}", p.display());
    }
    assert!(!dir.join("channel3").exists());
    assert!(text(&out.stderr).contains("simulated driver's channel files"));

    // A group makes it 0660; existing files are kept as they are.
    std::fs::set_permissions(dir.join("channel0"), PermissionsExt::from_mode(0o640)).unwrap();
    let out = create(&dir, &["5", "--uid", "65534", "--gid", "65534"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("kept"), "{}", text(&out.stdout));
    assert_eq!(owner_and_mode(&dir.join("channel0")), (0, 0, 0o640));
    assert_eq!(owner_and_mode(&dir.join("channel4")), (65534, 65534, 0o660));

    // World-writable: refused by default, naming the way out; created with --allow-world,
    // with a warning.
    let other = scratch.path().join("world");
    let err = assert_clean_failure(&create(&other, &["1", "--mode", "0666"]), "world mode");
    assert!(
        err.contains("world-writable") && err.contains("--allow-world"),
        "{err}"
    );
    assert!(!other.join("channel0").exists(), "nothing created");
    // Read access is access (any open descriptor is the channel): refused as well.
    let err = assert_clean_failure(&create(&other, &["1", "--mode", "0644"]), "readable");
    assert!(err.contains("world-readable"), "{err}");
    let out = create(&other, &["1", "--mode", "0666", "--allow-world"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("WARNING"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(owner_and_mode(&other.join("channel0")), (0, 0, 0o666));

    // An existing world-writable channel is warned about even when nothing new is.
    let out = create(&other, &["1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("channel0 is world-writable"), "{err}");
    let bad = assert_clean_failure(&create(&other, &["1", "--mode", "4755"]), "setuid mode");
    assert!(bad.contains("octal"), "{bad}");
}

#[test]
fn channels_create_makes_character_devices_with_the_drivers_major() {
    let scratch = ScratchDir::new("channels-dev").expect("scratch dir");
    let devices = scratch.path().join("devices");
    std::fs::write(
        &devices,
        "Character devices:\n  1 mem\n195 nvidia\n509 nvidia-caps-imex-channels\n\n\
         Block devices:\n  7 loop\n",
    )
    .unwrap();
    let dir = scratch.path().join("nvidia-caps-imex-channels");
    let out = run(Command::new(binary())
        .args(["channels", "create", "2", "--gid", "100", "--dir"])
        .arg(&dir)
        .arg("--proc-devices")
        .arg(&devices));
    assert!(out.status.success(), "{}", text(&out.stderr));
    for n in 0..2u64 {
        let m = std::fs::metadata(dir.join(format!("channel{n}"))).expect("device");
        assert!(m.file_type().is_char_device(), "channel{n}");
        assert_eq!(m.rdev(), makedev(509, n), "c 509 {n}");
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 100, 0o660));
    }
    // A plain file where a device should be is not taken for it.
    std::fs::write(dir.join("channel2"), b"").unwrap();
    let out = run(Command::new(binary())
        .args(["channels", "create", "3", "--dir"])
        .arg(&dir)
        .arg("--proc-devices")
        .arg(&devices));
    let err = assert_clean_failure(&out, "a file in the way");
    assert!(err.contains("channel2") && err.contains("c 509 2"), "{err}");
}

/// Starts `openimex-lab gpu` on `node`, waits for its ready line, stops it; its stderr.
fn gpu_driver_stderr(scratch: &Path, node: &Path) -> String {
    let stderr_path = node.with_extension("stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut child = Command::new(lab_binary())
        .arg("gpu")
        .arg("--node-dir")
        .arg(node)
        .arg("--fabric-dir")
        .arg(scratch.join("fabric"))
        .args(["--gpus", "1", "--hbm-mib", "2", "--channels", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn openimex-lab gpu");
    let mut line = String::new();
    let read = BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        read.is_ok() && line.starts_with("ready "),
        "no ready line: {line:?}"
    );
    std::fs::read_to_string(&stderr_path).unwrap_or_default()
}

#[test]
fn the_gpu_driver_creates_tight_channels_and_warns_about_a_world_writable_one() {
    let scratch = ScratchDir::new("channels-gpu").expect("scratch dir");
    let node = scratch.path().join("node");
    let err = gpu_driver_stderr(scratch.path(), &node);
    let caps = node.join("dev/nvidia-caps-imex-channels");
    assert_eq!(owner_and_mode(&caps.join("channel0")).2, 0o600);
    assert!(!err.contains("world-writable"), "{err}");

    // channel1 opened to everyone, as NVreg_CreateImexChannel0=1 makes channel0.
    std::fs::set_permissions(caps.join("channel1"), PermissionsExt::from_mode(0o666)).unwrap();
    let err = gpu_driver_stderr(scratch.path(), &node);
    assert!(
        err.contains("IMEX channel 1 is world-writable (mode 0666)") && err.contains("WARN"),
        "{err}"
    );
    assert!(!err.contains("channel 0 is world-writable"), "{err}");
}
